"""Warp specialisation (gpu.roles): accelerate-matmul{producer=warpgroup} computes the product
in the interpreter, whose roles run as coroutines under seeded schedules; faults planted in a
role's protocol (a stage freed before its wgmma retired, a miscounted barrier, a CTA barrier in
a role) are found by the interpreter and by the barrier check; the kernel builds for sm_90a
with its roles, register budgets and HGMMA."""

from __future__ import annotations

import numpy as np
import pytest

from kfc.codegen.toolchain import disassemble
from kfc.compile import compile_op
from kfc.diagnostics import InterpretError, KfcError, VerifyError
from kfc.frontend import load_kfc
from kfc.ir import parse_ir, print_ir, verify
from kfc.ir.core import Block
from kfc.ir.interpreter import run
from kfc.ir.mma_ops import CtaBarrierOp, MbarrierArrayOp, MbarrierArriveOp, MbarrierWaitParityOp, RolesOp, StagesAllocOp
from kfc.ir.mma_ops import WgmmaWaitOp
from kfc.ir.mma_ops.schedule import RoleScheduler
from kfc.ir.smem_ops import HazardError
from kfc.model.target import parse_target
from test_matmul import lowered, operands

WS = "accelerate-matmul{producer=warpgroup}"
WS_INFLIGHT = "accelerate-matmul{producer=warpgroup,inflight=1,registers=232,stages=3}"
PINGPONG = "accelerate-matmul{producer=warpgroup,inflight=1,registers=232,bm=64,tiles=persistent,consumers=pingpong"
PINGPONG_128 = PINGPONG.replace("bm=64", "bm=128,bn=128")  # a consumer's tile as two 64-row pieces


@pytest.mark.parametrize("m,n,k,pipe", [
    (1, 8, 8, WS), (130, 264, 200, WS), (64, 520, 1024, WS_INFLIGHT),
    (100, 72, 136, "accelerate-matmul{producer=warpgroup,inflight=1,bm=64,bn=64,stages=2}"),
    (300, 600, 200, "accelerate-matmul{producer=warpgroup,inflight=1,tiles=persistent,stages=3}"),  # 3 CTAs, 9 tiles
    (64, 520, 320, "accelerate-matmul{producer=warpgroup,bm=64,bn=64,tiles=persistent,stages=2}"),
    (300, 600, 200, PINGPONG + ",stages=3}"),  # 3 CTAs, 15 tiles: 5 a CTA, 3 and 2 a consumer
    (200, 520, 320, "accelerate-matmul{producer=warpgroup,bm=64,bn=64,tiles=persistent,stages=2,"
                    "consumers=pingpong,store=tma}"),
    (200, 600, 200, PINGPONG + ",bn=192,stages=3,store=tma}"),  # 3 chunks a tile: the slots alternate across tiles
    (300, 600, 200, PINGPONG_128 + ",stages=3}"),
    (200, 328, 320, PINGPONG_128 + ",stages=2,store=tma}"),  # 3 x 3 tiles, the last partial in rows and columns
])
def test_the_specialised_program_computes_the_product(m, n, k, pipe):
    func, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": m, "N": n, "K": k}, f"canonicalize,{pipe},cse,dce")
    assert any(isinstance(op, RolesOp) for op in low.walk())
    args = operands(m, n, k)
    want = run(func, args)["c"].astype(np.float32)
    got = run(low, args)["c"].astype(np.float32)
    assert not np.isnan(got).any(), "an output element was never stored"
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-2)


@pytest.mark.parametrize("pipe", [WS_INFLIGHT, "accelerate-matmul{producer=warpgroup,tiles=persistent}"])
def test_the_specialised_ir_prints_and_parses_back(pipe):
    _, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": 64, "N": 64, "K": 256}, f"canonicalize,{pipe}")
    text = print_ir(low)
    assert "gpu.roles" in text and "gpu.mbarrier_arrive" in text
    assert print_ir(verify(parse_ir(text))) == text


def _specialised(pipe=WS, k=1024):
    return lowered(load_kfc("kernels/gemm.kfc"), {"M": 128, "N": 256, "K": k}, f"canonicalize,{pipe}")[1]


def _in_consumer_loop(fn):
    """A planted fault: fn rewrites the ops of the consumers' k loop."""
    def block(b: Block, in_consumer=False) -> Block:
        ops = []
        for op in b.ops:
            if isinstance(op, RolesOp):
                op = op.evolve(regions=(block(op.regions[0]), block(op.regions[1], True)))
            elif op.regions:
                inner = [block(r, in_consumer) for r in op.regions]
                if in_consumer and op.NAME == "tile.for":
                    inner = [Block(r.args, fn(list(r.ops))) for r in inner]
                op = op.evolve(regions=tuple(inner))
            ops.append(op)
        return Block(b.args, ops)

    return lambda func: func.evolve(regions=(block(func.body),))


def _free_before_retired(ops):
    """The consumers free the stage right after issuing its wgmma, before waiting for it."""
    arrive = next(o for o in ops if isinstance(o, MbarrierArriveOp))
    wait = next(i for i, o in enumerate(ops) if isinstance(o, WgmmaWaitOp))
    ops.remove(arrive)
    ops.insert(wait, arrive)
    return ops


def _miscount_empty(func):
    def fix(op):
        if isinstance(op, MbarrierArrayOp) and op.result.name == "empty":
            return op.evolve(arrivals=op.arrivals * 2)
        return op

    def block(b):
        return Block(b.args, [fix(op).evolve(regions=tuple(block(r) for r in op.regions)) if op.regions else fix(op)
                              for op in b.ops])
    return func.evolve(regions=(block(func.body),))


def test_a_stage_freed_before_its_wgmma_retired_is_found_under_some_schedule():
    bad = _in_consumer_loop(_free_before_retired)(_specialised())
    with pytest.raises(VerifyError, match="overwrites stage .* while a wgmma reading it is in flight .*seed"):
        verify(bad)


def test_a_barrier_counting_more_arrivals_than_come_is_a_deadlock():
    bad = _miscount_empty(_specialised(k=512))
    with pytest.raises(VerifyError, match="deadlock: waits on %empty"):
        verify(bad)
    with pytest.raises(InterpretError, match="deadlock: waits on %empty"):
        run(bad, operands(128, 256, 512))


def test_a_cta_barrier_inside_a_role_is_refused():
    bad = _in_consumer_loop(lambda ops: [CtaBarrierOp(operands=(), results=(), regions=(), loc=None), *ops])(
        _specialised(k=256))
    with pytest.raises(VerifyError, match="CTA barrier inside a role"):
        verify(bad)


def test_roles_that_do_not_fill_the_cta_are_refused():
    low = _specialised(k=256)

    def shrink(b):
        return Block(b.args, [op.evolve(warpgroups=(1, 1)) if isinstance(op, RolesOp) else
                              op.evolve(regions=tuple(shrink(r) for r in op.regions)) if op.regions else op
                              for op in b.ops])
    with pytest.raises(VerifyError, match="roles take 256 threads; the grid's CTA has 384"):
        verify(low.evolve(regions=(shrink(low.body),)))


def test_register_budgets_beyond_the_register_file_are_refused():
    low = _specialised(pipe="accelerate-matmul{producer=warpgroup,registers=232}", k=256)

    def grow(b):
        return Block(b.args, [op.evolve(registers=(64, 240)) if isinstance(op, RolesOp) else
                              op.evolve(regions=tuple(grow(r) for r in op.regions)) if op.regions else op
                              for op in b.ops])
    with pytest.raises(VerifyError, match="register budgets take 69632 registers"):
        verify(low.evolve(regions=(grow(low.body),)))


def test_the_scheduler_interleaves_by_seed_and_names_a_deadlock():
    def trace(seed):
        order, sched = [], RoleScheduler(seed, (1, 1))

        def role(name):
            def body():
                for i in range(6):
                    sched.switch()
                    order.append(f"{name}{i}")
            return body
        sched.run([role("p"), role("c")])
        return order

    orders = {tuple(trace(seed)) for seed in range(8)}
    assert len(orders) > 1, "every seed ran the roles in one order"
    assert all(sorted(o) == sorted(trace(0)) for o in orders)

    sched = RoleScheduler(0, (1, 1))
    with pytest.raises(HazardError, match="never"):
        sched.run([lambda: sched.switch(lambda: False, lambda: HazardError("never", None)), lambda: None])


def test_inflight_and_registers_need_a_producer_warpgroup():
    with pytest.raises(KfcError, match="inflight, registers, tiles=persistent and consumers=pingpong apply to a "
                                       "producer warpgroup"):
        lowered(load_kfc("kernels/gemm.kfc"), {"M": 64, "N": 64, "K": 64}, "canonicalize,accelerate-matmul{inflight=1}")


@pytest.mark.parametrize("opts,why,hint", [
    ("bm=64", "tiles of its own, taken in turn from a persistent CTA's tiles", "add tiles=persistent"),
    ("tiles=persistent", "holds its .128, 256. accumulator alone: at most 16384 elements", "bn of 128 or less")])
def test_pingpong_needs_a_persistent_cta_and_tiles_one_warpgroup_holds(opts, why, hint):
    with pytest.raises(KfcError, match=why) as e:
        lowered(load_kfc("kernels/gemm.kfc"), {"M": 64, "N": 64, "K": 64},
                f"canonicalize,accelerate-matmul{{producer=warpgroup,consumers=pingpong,{opts}}}")
    assert hint in e.value.hint


def test_pingpong_consumers_take_the_ctas_tiles_in_turn():
    """Three roles (the producer, two consumers of one warpgroup each) and an order barrier
    the consumers hand each other's turn with; staging slots of their own for TMA stores."""
    low = _specialised(pipe=PINGPONG + ",store=tma}", k=256)
    roles = next(op for op in low.walk() if isinstance(op, RolesOp))
    assert roles.warpgroups == (1, 1, 1) and roles.registers == (40, 232, 232)
    order = next(op for op in low.walk() if isinstance(op, MbarrierArrayOp) and op.result.name == "order")
    assert order.result.ttype.shape == (2,) and order.arrivals == 4
    staging = next(op for op in low.walk() if isinstance(op, StagesAllocOp) and op.result.name == "sc")
    assert staging.result.ttype.shape[0] == 4  # two slots a consumer


def _without_turns(func):
    """A planted fault: the consumers do not wait for their turn (no wait on %order)."""
    def block(b):
        ops = []
        for op in b.ops:
            if isinstance(op, MbarrierWaitParityOp) and op.operands[0].name == "order":
                continue
            ops.append(op.evolve(regions=tuple(block(r) for r in op.regions)) if op.regions else op)
        return Block(b.args, ops)
    return func.evolve(regions=(block(func.body),))


def test_a_pingpong_consumer_that_does_not_wait_its_turn_is_found():
    """Without the order barrier a consumer, whose stage uses skip the other's, can wait on a
    stage for a phase whose parity is that of one long completed: the barrier check finds it."""
    bad = _without_turns(_specialised(pipe=PINGPONG + "}", k=512))
    with pytest.raises(VerifyError, match="deadlock|returns before this phase's copies land"):
        verify(bad)


# the 128-row tile with the GELU epilogue spills (8 bytes) and kfc refuses a kernel that spills, so it
# builds the plain product
@pytest.mark.parametrize("kernel,pipe,mma,per_k", [("gemm_bias_gelu", PINGPONG, "HGMMA.64x256x16.F32.BF16", 1),
                                                    ("gemm", PINGPONG_128, "HGMMA.64x128x16.F32.BF16", 2)])
def test_the_pingpong_kernel_builds_with_three_roles_for_sm_90a(kernel, pipe, mma, per_k):
    """Three roles; a 128-row tile is two wgmmas a consumer per k16 step and two TMA boxes a
    store, one bulk group."""
    r = compile_op(load_kfc(f"kernels/{kernel}.kfc"), parse_target("sm_90a"),
                   pipeline=f"canonicalize,cse,dce,{pipe},store=tma}},canonicalize,cse,dce",
                   shape={"M": 256, "N": 512, "K": 256})
    cu = r.kernel.cu
    assert cu.count("// role") == 3 and cu.count("setmaxnreg") == 3
    assert '"r"(1 + threadIdx.x / 128)' in cu  # a named barrier for each warpgroup of the CTA, whatever its role
    assert r.kernel.report.spills == 0 and "C7514" not in r.kernel.ptxas_log
    # two consumers, four k16 steps a k-tile: in as many copies as nvcc unrolls the k-tile loop
    issued = disassemble(r.kernel.cubin).count(mma)
    assert issued > 0 and issued % (2 * 4 * per_k) == 0
    # the first box of each store of a two-piece tile: two 64-column chunks a tile, two consumers
    assert cu.count("kfc_tma_store_2d_part(&") == (per_k - 1) * 2 * 2


def test_operands_tma_cannot_move_keep_the_threads_copy_and_say_so():
    from kfc.passes import PassContext, PassManager, parse_pipeline
    from kfc.ir.specialize import specialize

    ctx = PassContext(target=parse_target("sm_90a"))
    low = PassManager(parse_pipeline(f"canonicalize,{WS}"), ctx).run(
        specialize(load_kfc("kernels/gemm.kfc").func, {"M": 33, "N": 65, "K": 17}))
    assert not any(isinstance(op, RolesOp) for op in low.walk())
    assert any("no producer warpgroup" in note for _, note in ctx.notes)


def test_the_specialised_gemm_builds_for_sm90a_with_its_roles_and_budgets():
    r = compile_op(load_kfc("kernels/gemm.kfc"), parse_target("sm_90a"), pipeline=f"canonicalize,{WS_INFLIGHT}",
                   shape={"M": 4096, "N": 4096, "K": 4096})
    [entry] = r.report["kernels"]
    assert entry["block"] == [384, 1, 1]
    cu = r.kernel.cu
    assert "setmaxnreg.dec.sync.aligned.u32 40" in cu and "setmaxnreg.inc.sync.aligned.u32 232" in cu
    assert "kfc_wg >= 1 && kfc_wg < 3" in cu
    sass = disassemble(r.kernel.cubin)
    assert "HGMMA.64x256x16.F32.BF16" in sass and "UTMALDG.2D" in sass and "SETMAXREG" in sass
    assert "C7514" not in r.kernel.ptxas_log, "ptxas serialised the wgmmas"
    assert r.kernel.report.spills == 0


def test_a_persistent_grid_is_one_wave_of_ctas_each_taking_tiles_in_raster_order():
    from kfc.ir.mma_ops import GridOp, TileCoordsOp, raster

    low = _specialised(pipe="accelerate-matmul{producer=warpgroup,inflight=1,tiles=persistent}", k=256)
    grid = next(op for op in low.walk() if isinstance(op, GridOp))
    assert grid.persistent and len(grid.body.args) == 1
    assert sum(isinstance(op, TileCoordsOp) for op in low.walk()) == 2, "each role walks the tiles"
    # the raster the tiles take: every tile once, in groups of `group` rows of tiles
    gm, gn, group = 20, 7, 8
    coords = [raster(t, gm, gn, group) for t in range(gm * gn)]
    assert sorted(coords) == [(i, j) for i in range(gm) for j in range(gn)]
    assert coords[:3] == [(0, 0), (1, 0), (2, 0)] and coords[8] == (0, 1)


def test_a_persistent_cta_restarting_its_stage_count_at_each_tile_is_found():
    """The consumers count k-tiles from 0 at every tile while the producer carries the count on:
    at the second tile they wait on the wrong stages' phases, which the walk of a CTA taking
    two tiles finds (one tile alone is right)."""
    from kfc.ir.dtypes import DType
    from kfc.ir.core import Value
    from kfc.ir.tile_ops import ConstOp
    from kfc.ir.types import TensorType

    low = lowered(load_kfc("kernels/gemm.kfc"), {"M": 384, "N": 512, "K": 256},
                  "canonicalize,accelerate-matmul{producer=warpgroup,tiles=persistent,stages=3}")[1]  # 6 tiles
    verify(low)

    def restart(ops):
        out = []
        for o in ops:
            if o.NAME == "tile.add" and o.results[0].name == "it":  # it = base + kt becomes it = 0 + kt
                zero = ConstOp(operands=(), results=(Value(TensorType(DType.INDEX), "zero"),), regions=(),
                               loc=o.loc, value=0)
                out.append(zero)
                o = o.evolve(operands=(zero.result, o.operands[1]))
            out.append(o)
        return out

    with pytest.raises(VerifyError, match="a CTA computing 2 tile"):
        verify(_in_consumer_loop(restart)(low))


def test_a_default_whose_epilogue_spills_is_rebuilt_as_one_role():
    from kfc.compile import lower_op, single_role
    from kfc.passes import MATMUL_PIPELINE, PassContext

    target = parse_target("sm_90a")
    spec = load_kfc("kernels/gemm_bias_relu.kfc")
    lowering = lower_op(spec, target, None, {"M": 256, "N": 512, "K": 128}, PassContext(target=target))
    assert "producer=warpgroup" in MATMUL_PIPELINE
    again = single_role(lowering)
    assert "accelerate-matmul{store=auto}," in again + "," and "producer" not in again, again
    r = compile_op(spec, target, pipeline=again, shape={"M": 256, "N": 512, "K": 128})
    assert r.report["kernels"][0]["block"] == [256, 1, 1] and r.kernel.report.spills == 0


@pytest.mark.parametrize("kernel", ["gemm", "gemm_bias_relu", "gemm_bias_gelu"])
def test_the_gemm_kernels_build_warp_specialised_by_default_without_spills(kernel):
    spec = load_kfc(f"kernels/{kernel}.kfc")
    # two MMA warpgroups for 128-row tiles, one for the 64-row tiles of at most 64 rows
    for shape, block in (({"M": 4096, "N": 4096, "K": 4096}, 384), ({"M": 1, "N": 8, "K": 8}, 256)):
        r = compile_op(spec, parse_target("sm_90a"), shape=shape)
        assert r.report["kernels"][0]["block"] == [block, 1, 1], r.report["pass_notes"]
        assert r.kernel.report.spills == 0


def test_the_default_takes_64_row_tiles_up_to_64_rows_on_wgmma_only():
    from kfc.compile import lower_op
    from kfc.passes import PassContext

    spec = load_kfc("kernels/gemm.kfc")
    # K = 8191: rows of a whose pitch TMA cannot take, copied by the threads: the 128-row default
    for target, m, k, skinny in (("sm_90a", 64, 8192, True), ("sm_90a", 65, 8192, False),
                                 ("sm_90a", 16, 8191, False), ("sm_100a", 16, 8192, False)):
        t = parse_target(target)
        low = lower_op(spec, t, None, {"M": m, "N": 8192, "K": k}, PassContext(target=t))
        assert ("bm=64,bn=128,stages=6" in str(low.pipeline)) == skinny, (target, m, str(low.pipeline))


def test_a_producer_waiting_on_the_wrong_parity_of_a_free_stage_deadlocks():
    """Before its first use a stage is free only to a wait for the phase before the first: the
    producer that waits for phase 0 itself waits on consumers that wait on it."""
    from kfc.ir.mma_ops import MbarrierWaitParityOp

    low = _specialised(k=512)

    def stage_as_parity(b: Block, in_producer=False) -> Block:
        ops = []
        for op in b.ops:
            if isinstance(op, RolesOp):
                op = op.evolve(regions=(stage_as_parity(op.regions[0], True), op.regions[1]))
            elif op.regions:
                op = op.evolve(regions=tuple(stage_as_parity(r, in_producer) for r in op.regions))
            elif in_producer and isinstance(op, MbarrierWaitParityOp):
                op = op.evolve(operands=(op.operands[0], op.operands[1], op.operands[1]))
            ops.append(op)
        return Block(b.args, ops)

    with pytest.raises(VerifyError, match="deadlock: waits on %empty"):
        verify(low.evolve(regions=(stage_as_parity(low.body),)))

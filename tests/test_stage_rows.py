"""Rows staged through shared memory on the CPU: the shared-memory ops' interpreter semantics
(poison, the mbarrier state machine, deadlocks and hazards at the op that commits them), the
static barrier check the verifier runs, the stage-rows pass under --verify-each, planted broken
staging passes caught, the tile choice for staged rows, and the generated code (bulk copies
in the SASS for sm_90a and sm_100a, no spills, fallback for rows that are not 16-byte multiples).
"""

import re
import uuid
from typing import ClassVar

import attrs
import numpy as np
import pytest

from kfc.codegen.cuda import generate_cuda
from kfc.codegen.toolchain import compile_cuda, disassemble
from kfc.diagnostics import InterpretError, VerifyError
from kfc.ir import parse_ir, print_ir, verify
from kfc.ir.interpreter import Interpreter, bind_arguments, run
from kfc.ir.smem_ops import CopyAsyncOp, ExpectTxOp, HazardError, MbarrierWaitOp, SmemAllocOp
from kfc.ir.core import Value
from kfc.ir.dtypes import DType
from kfc.ir.tile_ops import ConstOp, LoadOp
from kfc.ir.types import TensorType
from kfc.passes import PASSES, ROW_PIPELINE, Pass, PassError, VerifyEach, parse_pipeline
from kfc.passes.base import register_pass
from kfc.passes.stage_rows import StageRows
from kfc.frontend import load_kfc
from kfc.ir.specialize import specialize
from tests.pipelines import kernel, ops_of, run_pipeline

# one row of x copied into shared memory, read back, doubled and stored
STAGED = """
kfc.func @twice(%x: f32[M, 64] @global) -> (%y: f32[M, 64] @global) {
  %0 = tile.dim {sym = "M"} : () -> index
  %1 = tile.const {value = 0} : () -> index
  tile.parallel %1, %0 {
  ^(%m: index):
    %bar = gpu.mbarrier_alloc : () -> i64[] @shared
    %s = gpu.smem_alloc : () -> f32[64] @shared
    EXPECT
    COPY
    WAIT
    %v = tile.load %s {index = [":"]} : (f32[64] @shared) -> f32[64]
    %d = tile.add %v, %v : (f32[64], f32[64]) -> f32[64]
    tile.store %d, %y, %m {index = ["i", ":"]} : (f32[64], f32[M, 64] @global, index) -> ()
  } : (index, index) -> ()
}
"""
EXPECT = 'gpu.expect_tx %bar {bytes = 256} : (i64[] @shared) -> ()'
COPY = 'gpu.copy_async %x, %s, %bar, %m {index = ["i", ":"]} : (f32[M, 64] @global, f32[64] @shared, i64[] @shared, index) -> ()'
WAIT = 'gpu.mbarrier_wait %bar : (i64[] @shared) -> ()'


def program(expect=EXPECT, copy=COPY, wait=WAIT, swap_load_and_wait=False):
    text = STAGED.replace("EXPECT", expect).replace("COPY", copy).replace("WAIT", wait)
    if swap_load_and_wait:
        load = [line for line in text.splitlines() if "tile.load %s" in line][0]
        text = text.replace(load + "\n", "").replace("    " + wait, load + "\n    " + wait)
    return parse_ir(text)


def interpret_unverified(func, x):
    """Run the interpreter without the verifier: the dynamic checks on their own."""
    dims, env = bind_arguments(func, {"x": x})
    Interpreter(func, dims).exec_block(func.body, env)
    return env[func.outputs[0]]


def x_rows(m=3):
    return np.random.default_rng(0).standard_normal((m, 64)).astype(np.float32)


# --- semantics ---------------------------------------------------------------------------------


def test_a_staged_row_reads_back_what_was_copied_and_round_trips():
    f = program()
    verify(f)
    assert print_ir(parse_ir(print_ir(f))) == print_ir(f)
    x = x_rows()
    np.testing.assert_array_equal(run(f, {"x": x})["y"], 2 * x)


@pytest.mark.parametrize("case, kwargs, static, dynamic", [
    ("no arrival", dict(expect=""), "deadlock: waits on %bar, which counts 1 arrival(s), but 0 arrive",
     "deadlock: waits on %bar"),
    ("wrong bytes", dict(expect=EXPECT.replace("256", "128")), "announced 128 byte(s) but its copies carry 256",
     "announced 128 byte(s) but its copies carry 256"),
    ("read in flight", dict(swap_load_and_wait=True), "reads %s while the copy into it is in flight",
     "reads %s while the copy into it is in flight"),
    ("never waited", dict(wait="", swap_load_and_wait=False), "reads %s while the copy into it is in flight",
     "reads %s while the copy into it is in flight"),
    ("copied twice", dict(copy=COPY + "\n    " + COPY), "copies over %s while the copy into it before is in flight",
     "copies over %s while the copy into it before is in flight"),
    ("nothing copied", dict(expect=EXPECT.replace("256", "0"), copy=""), "reads %s, which nothing was copied into",
     None),
])
def test_the_protocol_is_checked_statically_and_dynamically(case, kwargs, static, dynamic):
    f = program(**kwargs)
    with pytest.raises(VerifyError, match=re.escape(static)) as info:
        verify(f)
    assert info.value.span is not None or "never" in case
    x = x_rows()
    if dynamic is None:  # the buffer reads as poison: every output element is NaN
        assert np.isnan(interpret_unverified(f, x)).all()
        return
    with pytest.raises(HazardError, match=re.escape(dynamic)):
        interpret_unverified(f, x)
    assert issubclass(HazardError, InterpretError)


def test_a_copy_never_waited_for_is_reported_at_its_buffer():
    f = program(wait="")
    text = print_ir(f).replace("    %v = tile.load %s", "    // %v").splitlines()
    body = "\n".join(line for line in text if "%v" not in line and "%d" not in line)
    g = parse_ir(body)
    with pytest.raises(VerifyError, match="the copy into %s is never waited for"):
        verify(g)
    with pytest.raises(HazardError, match="is never waited for"):
        interpret_unverified(g, x_rows())


def test_a_copy_past_the_tensor_zero_fills_and_counts_every_byte():
    # x[m, t:t+64] of a row of 40: 24 elements past the end land as zeros, 256 bytes all the same
    text = STAGED.replace("f32[M, 64] @global) ->", "f32[M, 40] @global) ->").replace(
        "EXPECT", EXPECT).replace("COPY", COPY.replace('["i", ":"]} : (f32[M, 64]', '["i", "+64"]} : (f32[M, 40]')
                                  .replace("%m {", "%m, %1 {").replace("index) -> ()", "index, index) -> ()")).replace(
        "WAIT", WAIT)
    f = parse_ir(text)
    verify(f)
    x = np.random.default_rng(1).standard_normal((2, 40)).astype(np.float32)
    y = run(f, {"x": x})["y"]
    np.testing.assert_array_equal(y[:, :40], 2 * x)
    np.testing.assert_array_equal(y[:, 40:], 0)


# --- the pass ------------------------------------------------------------------------------------


# layernorm_bwd's mean(g) and mean(g·x̂) depend on nothing of each other: one stretch ends with
# both (two rows read twice); layernorm_bwd_dx reads x in four stretches, dy in the last two
@pytest.mark.parametrize("name, reads", [("rmsnorm", 2), ("softmax", 3), ("layernorm", 3), ("softmax_bwd", 4),
                                         ("rmsnorm_bwd_dx", 5), ("layernorm_bwd", 4), ("layernorm_bwd_dx", 6)])
def test_every_stretch_between_reductions_reads_the_row_again(name, reads):
    spec, f = kernel(name, 512)
    ve = VerifyEach({"N": 512, "M": 3}, spec.check, seeds=(0, 1))
    pipe = ROW_PIPELINE.replace("stage-rows", "stage-rows{min_bytes=0,heavy=stage}")
    g, ctx = run_pipeline(f, pipe, check=spec.check, verify_each=ve)
    buffers = ops_of(g, SmemAllocOp)
    assert buffers and len(ops_of(g, CopyAsyncOp)) == len(buffers)
    assert len(ops_of(g, ExpectTxOp)) == 1 and len(ops_of(g, MbarrierWaitOp)) == 1
    shared_reads = [op for op in ops_of(g, LoadOp) if op.operands[0] in {b.result for b in buffers}]
    assert len(shared_reads) == reads
    assert any("staged through shared memory" in m for _, m in ctx.notes)


@pytest.mark.parametrize("name, n, dtype", [("rmsnorm", 4095, "bf16"), ("softmax", 7, "f32"), ("rmsnorm", 65537, "f16")])
def test_rows_that_are_not_16_byte_multiples_stay_in_registers(name, n, dtype):
    spec, f = kernel(name, n, dtype)
    g, _ = run_pipeline(f, ROW_PIPELINE.replace("stage-rows", "stage-rows{min_bytes=0,heavy=stage}"), check=spec.check)
    assert not ops_of(g, SmemAllocOp)


def loads_of(g, tensor: str) -> int:
    return sum(op.operands[0].name == tensor for op in ops_of(g, LoadOp))


@pytest.mark.parametrize("reread", [True, False])
def test_rows_too_long_for_registers_that_the_copy_cannot_move_are_read_again(reread):
    """262143 bf16 elements are not a 16-byte multiple; two such rows of 32 elements a thread
    of the largest tile are re-read from global memory in each stretch, with the same results."""
    n = 262143
    spec, f = kernel("layernorm_bwd_dx", n)
    ve = VerifyEach({"N": n, "M": 2}, spec.check, seeds=(0,))
    pipe = ROW_PIPELINE.replace("stage-rows", f"stage-rows{{reread={str(reread).lower()}}}")
    g, ctx = run_pipeline(f, pipe, check=spec.check, verify_each=ve)
    assert not ops_of(g, SmemAllocOp)
    assert (loads_of(g, "x"), loads_of(g, "dy")) == ((4, 2) if reread else (1, 1))
    assert any("re-read from global memory" in m for _, m in ctx.notes) == reread


def test_rows_too_long_for_registers_are_staged_whatever_their_stretches():
    """layernorm_bwd_dx reads its rows in four stretches (staged from 512 KB by stretches alone);
    rows of 200000 are 25 elements a thread of two rows: they are staged."""
    spec, f = kernel("layernorm_bwd_dx", 200000)
    g, _ = run_pipeline(f, ROW_PIPELINE, check=spec.check)
    assert len(ops_of(g, SmemAllocOp)) == 2
    spec, f = kernel("layernorm_bwd_dx", 131072)  # 16 elements a thread of each row: registers hold them
    g, _ = run_pipeline(f, ROW_PIPELINE, check=spec.check)
    assert not ops_of(g, SmemAllocOp)


def test_rows_that_leave_no_room_beside_sums_across_rows_are_read_again():
    """layernorm_bwd's dw and db in f32 at rows of 262144 take 128 KB of each CTA of 16: one of
    its two rows is staged, the other re-read."""
    spec, f = kernel("layernorm_bwd", 262144, "f32")
    g, ctx = run_pipeline(f, ROW_PIPELINE, check=spec.check)
    (buf,) = ops_of(g, SmemAllocOp)
    copied = ops_of(g, CopyAsyncOp)[0].operands[0].name
    other = ({"x", "dout"} - {copied}).pop()
    assert loads_of(g, copied) == 0 and loads_of(g, other) == 2


def test_short_rows_stay_in_registers_by_default():
    spec, f = kernel("rmsnorm", 2048)
    g, _ = run_pipeline(f, ROW_PIPELINE, check=spec.check)
    assert not ops_of(g, SmemAllocOp)
    assert StageRows().min_bytes > 2048 * 2


def example(name: str, n: int):
    spec = load_kfc(f"examples/{name}.kfc", {} if name == "first_crossing" else {"T": "bf16"})
    return spec, verify(specialize(spec.func, {"N": n}, partial=True))


@pytest.mark.parametrize("name, heavy", [("fp8_quant", True), ("int8_quant", True), ("first_crossing", True),
                                         ("row_stats", False), ("scale_shift", False), ("swiglu", False)])
def test_rows_bound_by_issue_stay_in_registers_while_they_fit(name, heavy):
    """fp8 quantisation divides every element: about 17 instructions for the 3 bytes an element
    moves, so its rows of 4096 stay in registers, 32 bf16 a thread (the fp8 codes set the store
    width, 16, not the share); lighter programs are staged as before."""
    spec, f = example(name, 4096)
    ve = VerifyEach({"N": 4096, "M": 3}, spec.check, seeds=(0,))
    g, ctx = run_pipeline(f, ROW_PIPELINE, check=spec.check, verify_each=ve)
    kept = [m for p, m in ctx.notes if p.startswith("stage-rows") and "kept in registers" in m]
    assert bool(kept) == heavy and bool(ops_of(g, SmemAllocOp)) != heavy
    if heavy:  # staged all the same when asked
        staged, _ = run_pipeline(f, ROW_PIPELINE.replace("stage-rows", "stage-rows{heavy=stage}"), check=spec.check)
        assert ops_of(staged, SmemAllocOp)
    if name == "fp8_quant":
        (launch,) = [op for op in g.body.ops if op.NAME == "gpu.launch"]
        assert (launch.rows_per_cta, launch.threads) == (2, 128)


def test_issue_is_counted_with_the_approximations_lower_ptx_may_take():
    """softmax's exp and its division by the row's sum are approximated (a tolerance of 1e-5 or
    more, no exact output): two instructions and one; fp8's division is exact: ten."""
    from kfc.passes.lower_ptx import approximable
    from kfc.passes.row_cost import issue_per_element, row_bytes_per_element
    from kfc.passes.context import PassContext
    from kfc.model.target import parse_target

    def cost(spec, f):
        g, _ = run_pipeline(f, "canonicalize,cse,dce", check=spec.check)
        ctx = PassContext(parse_target("sm_90a"), check=spec.check)
        loop = next(op for op in g.body.ops if op.regions)
        return issue_per_element(loop.body, approximable(g, ctx)), row_bytes_per_element(loop.body)

    soft, soft_bytes = cost(*kernel("softmax", 4096))
    fp8, fp8_bytes = cost(*example("fp8_quant", 4096))
    assert (soft_bytes, fp8_bytes) == (4, 3)
    assert soft < 12 <= fp8 and fp8 - 10 < soft


def test_stage_rows_after_tile_is_a_clear_error():
    spec, f = kernel("rmsnorm", 65536)
    with pytest.raises(PassError, match="stage-rows runs on the row loop before tile") as info:
        run_pipeline(f, "canonicalize,tile,stage-rows", check=spec.check)
    assert "before tile" in info.value.hint


def test_min_bytes_is_a_ranged_option():
    with pytest.raises(PassError, match="min_bytes"):
        parse_pipeline("stage-rows{min_bytes=-1}")
    assert str(parse_pipeline("stage-rows{min_bytes=0}")) == "stage-rows{min_bytes=0}"


@pytest.mark.parametrize("n, cluster, threads", [(4096, 1, 256), (16384, 1, 512), (32768, 2, 256), (65536, 4, 256),
                                                (131072, 8, 256), (262144, 8, 512), (256, 1, 32)])
def test_a_staged_row_is_split_into_32_kb_a_cta_in_clusters_of_up_to_8_else_64_kb(n, cluster, threads):
    spec, f = kernel("rmsnorm", n)
    g, ctx = run_pipeline(f, ROW_PIPELINE.replace("stage-rows", "stage-rows{min_bytes=0,heavy=stage}"), check=spec.check)
    (launch,) = [op for op in g.body.ops if op.NAME == "gpu.launch"]
    assert (launch.cluster, launch.threads) == (cluster, threads)


@pytest.mark.parametrize("n, cluster, threads", [(16384, 1, 512), (32768, 2, 512), (65536, 4, 512)])
def test_two_staged_rows_keep_64_kb_a_cta(n, cluster, threads):
    spec, f = kernel("rmsnorm_residual", n)
    g, ctx = run_pipeline(f, ROW_PIPELINE.replace("stage-rows", "stage-rows{min_bytes=0,heavy=stage}"), check=spec.check)
    (launch,) = [op for op in g.body.ops if op.NAME == "gpu.launch"]
    assert len(ops_of(g, SmemAllocOp)) == 2
    assert (launch.cluster, launch.threads) == (cluster, threads)


# --- planted broken staging passes ----------------------------------------------------------------


def make_pass(fn):
    name = f"test-broken-staging-{uuid.uuid4().hex[:8]}"

    @attrs.frozen
    class Broken(Pass):
        NAME: ClassVar[str] = name
        SUMMARY: ClassVar[str] = "stage-rows, then break it"

        def run(self, func, ctx):
            return fn(StageRows(min_bytes=0, heavy="stage").run(func, ctx))

    return Broken


def edit_loop(func, edit):
    (loop,) = [op for op in func.body.ops if op.NAME == "tile.parallel"]
    body = attrs.evolve(loop.body, ops=tuple(edit(list(loop.body.ops))))
    new = attrs.evolve(loop, regions=(body,))
    return attrs.evolve(func, regions=(attrs.evolve(func.body, ops=tuple(new if o is loop else o
                                                                             for o in func.body.ops)),))


def drop_wait(ops):
    return [o for o in ops if not isinstance(o, MbarrierWaitOp)]


def halve_bytes(ops):
    return [attrs.evolve(o, bytes=o.bytes // 2) if isinstance(o, ExpectTxOp) else o for o in ops]


def read_before_wait(ops):
    wait = next(i for i, o in enumerate(ops) if isinstance(o, MbarrierWaitOp))
    read = next(i for i, o in enumerate(ops) if isinstance(o, LoadOp) and o.operands[0].ttype.space.value == "shared")
    ops.insert(wait, ops.pop(read))
    return ops


def copy_row_zero(ops):
    """Semantically wrong but well formed: every row's copy reads row 0."""
    out = []
    for o in ops:
        if isinstance(o, CopyAsyncOp):
            zero = ConstOp(results=(Value(TensorType(DType.INDEX), "zero"),), value=0)
            out.append(zero)
            o = attrs.evolve(o, operands=(*o.operands[:3], zero.result))
        out.append(o)
    return out


@pytest.mark.parametrize("breakage, message", [
    (drop_wait, "while the copy into it is in flight"),
    (halve_bytes, "deadlock"),
    (read_before_wait, "while the copy into it is in flight"),
])
def test_a_broken_staging_pass_is_caught_by_the_verifier(breakage, message):
    spec, f = kernel("rmsnorm", 256)
    cls = make_pass(lambda g: edit_loop(g, breakage))
    register_pass(cls)
    try:
        with pytest.raises(VerifyError, match=message) as info:
            run_pipeline(f, f"canonicalize,{cls.NAME},tile", check=spec.check)
        assert f"after pass {cls.NAME}" in str(info.value)
    finally:
        PASSES.pop(cls.NAME, None)


def test_a_staging_pass_that_copies_the_wrong_row_is_caught_by_verify_each():
    spec, f = kernel("rmsnorm", 256)
    cls = make_pass(lambda g: edit_loop(g, copy_row_zero))
    register_pass(cls)
    try:
        g, _ = run_pipeline(f, f"canonicalize,{cls.NAME}", check=spec.check)  # well formed: it verifies
        verify(g)
        ve = VerifyEach({"N": 256, "M": 3}, spec.check)
        with pytest.raises(PassError, match=f"pass {cls.NAME} changed the results"):
            run_pipeline(f, f"canonicalize,{cls.NAME}", check=spec.check, verify_each=ve)
    finally:
        PASSES.pop(cls.NAME, None)


# --- generated code ------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("name", ["rmsnorm", "softmax", "layernorm"])
def test_staged_kernels_use_the_bulk_copy_engine(name, target):
    spec, f = kernel(name, 65536)
    g, _ = run_pipeline(f, ROW_PIPELINE, check=spec.check)
    code, plan = generate_cuda(g)
    assert "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in code
    assert plan.smem_dynamic == 32 * 1024 and plan.cluster == 4  # SPLIT_BYTES_PER_CTA
    k = compile_cuda(code, target)
    assert k.report.spills == 0 and k.report.registers <= 64
    text = disassemble(k.cubin)
    assert "UBLKCP" in text, "no bulk copy in the SASS"
    assert "SYNCS" in text, "no mbarrier operations in the SASS"


# --- two stages: the next row's copy in flight --------------------------------------------------

TWO_STAGES = "canonicalize,cse,dce,stage-rows{min_bytes=0,heavy=stage},tile{%s},lower-reductions,fuse-reductions,lower-ptx," \
             "canonicalize,cse,dce"


@pytest.mark.parametrize("name, n, opts", [("rmsnorm", 4104, "stages=2"), ("softmax", 65536, "stages=2,rows=1"),
                                           ("rmsnorm_bwd", 1024, "stages=2,rows=4")])
def test_two_stages_keep_the_results_and_issue_the_next_row_ahead(name, n, opts):
    from kfc.ir.gpu_ops import LaunchOp
    from kfc.ir.smem_ops import MbarrierAllocOp

    spec, f = kernel(name, n, "f32")
    ve = VerifyEach({"N": n, "M": 5}, spec.check)
    g, _ = run_pipeline(f, TWO_STAGES % opts, check=spec.check, verify_each=ve)
    (launch,) = ops_of(g, LaunchOp)
    assert launch.persistent and all(op.stages == 2 for op in ops_of(g, MbarrierAllocOp))
    code, plan = generate_cuda(g)
    # the first rows' copies before the loop, the next rows' into the other stage inside it,
    # waits on each stage's barrier every other iteration
    assert "kfc_valid0" in code and "kfc_sn = (kfc_s + 1) % 2" in code and "((kfc_it / 2) & 1u)" in code
    assert code.count("cp.async.bulk.shared::cluster") == 2 * len(ops_of(g, CopyAsyncOp))
    one, one_plan = generate_cuda(run_pipeline(f, TWO_STAGES % opts.replace("stages=2", "stages=1"),
                                               check=spec.check)[0])
    assert "kfc_it" not in one
    assert launch.sums_in == "registers" and plan.smem_dynamic == 2 * one_plan.smem_dynamic


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_two_stages_compile_with_their_bulk_copies_in_the_sass(target):
    from kfc.model.target import parse_target

    spec, f = kernel("rmsnorm", 65536)
    g, _ = run_pipeline(f, TWO_STAGES % "stages=2", target=parse_target(target), check=spec.check)
    code, _ = generate_cuda(g)
    k = compile_cuda(code, target)
    assert k.report.spills == 0
    assert "UBLKCP" in disassemble(k.cubin)


def test_the_default_tile_takes_two_stages_where_one_cta_fills_an_sm_or_rows_with_sums_are_small():
    from kfc.ir.gpu_ops import LaunchOp
    from kfc.ir.smem_ops import MbarrierAllocOp

    for name, n, stages, ctas in (("rmsnorm_bwd", 262144, 2, 0), ("rmsnorm_bwd", 65536, 1, 0),
                                  ("rmsnorm_bwd", 16384, 1, 0), ("rmsnorm_bwd", 4096, 2, 3), ("layernorm_bwd", 4096, 1, 0),
                                  ("rmsnorm", 262144, 1, 0),
                                  ("rmsnorm", 4096, 1, 0)):
        spec, f = kernel(name, n)
        g, _ = run_pipeline(f, ROW_PIPELINE, check=spec.check)
        assert {op.stages for op in ops_of(g, MbarrierAllocOp)} == {stages}, (name, n)
        (launch,) = ops_of(g, LaunchOp)
        assert launch.min_ctas_per_sm == ctas, (name, n)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_ctas_an_sm_reach_the_compiler_as_the_minimum_of_launch_bounds(target):
    """Three CTAs of 256 threads an SM leave a thread 85 registers: ptxas keeps within them."""
    from kfc.model.target import parse_target

    spec, f = kernel("rmsnorm_bwd", 4096)
    g, _ = run_pipeline(f, ROW_PIPELINE, target=parse_target(target), check=spec.check)
    code, plan = generate_cuda(g)
    assert "__launch_bounds__(256, 3)" in code and plan.block == 256
    assert plan.min_ctas_per_sm == 3 and plan.contract()["min_ctas_per_sm"] == 3
    k = compile_cuda(code, target)
    assert k.report.spills == 0 and k.report.registers <= 80
    g2, _ = run_pipeline(f, ROW_PIPELINE.replace(",tile,", ",tile{ctas_per_sm=1},"), target=parse_target(target),
                         check=spec.check)
    assert "__launch_bounds__(256, 1)" in generate_cuda(g2)[0]
    assert print_ir(parse_ir(print_ir(g))) == print_ir(g) and "min_ctas_per_sm = 3" in print_ir(g)


def test_more_ctas_an_sm_than_its_threads_hold_are_refused():
    spec, f = kernel("rmsnorm_bwd", 4096)
    with pytest.raises(PassError, match="min_ctas_per_sm=5 CTAs of 512 threads do not fit the 2048 threads"):
        run_pipeline(f, ROW_PIPELINE.replace(",tile,", ",tile{threads=512,ctas_per_sm=5},"), check=spec.check)


def test_a_barrier_takes_one_or_two_stages():
    from kfc.ir.smem_ops import BARRIER_TYPE, MbarrierAllocOp

    with pytest.raises(VerifyError, match="stages must be 1 or 2"):
        MbarrierAllocOp(results=(Value(BARRIER_TYPE, "b"),), stages=3).verify_()

"""The epilogue through shared memory (accelerate-matmul{store=tma}): the interpreter computes the
product with it in every kernel form (one role, warp-specialised, persistent, threads' copies, a
fused epilogue, an f32 output) at odd shapes; a slot written while its store reads it, a store
of unfenced writes and a program ending with stores in flight are found by the barrier check;
the kernel builds for sm_90a with its TMA stores; what cannot take it is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from kfc.codegen.toolchain import disassemble
from kfc.compile import compile_op
from kfc.diagnostics import KfcError, VerifyError
from kfc.frontend import load_kfc
from kfc.frontend.spec import parse_kfc
from kfc.ir import parse_ir, print_ir, verify
from kfc.ir.core import Block
from kfc.ir.interpreter import run
from kfc.ir.mma_ops import FenceProxyAsyncOp, StageFragmentOp, TmaStoreOp, TmaStoreWaitOp
from kfc.ir.specialize import specialize
from kfc.model.target import parse_target
from kfc.passes import PassContext, PassManager, parse_pipeline
from test_matmul import lowered, operands

WS = "producer=warpgroup,inflight=1"
GEMM_F32 = """
op gemm_f32(a: bf16[M, K], b: bf16[K, N]) -> (c: f32[M, N]) {
  c = dot(a, b)
}
"""


@pytest.mark.parametrize("m,n,k,options", [
    (1, 8, 8, "bn=64,stages=2"),
    (130, 264, 200, ""),                                   # one role, the TMA mainloop
    (130, 264, 200, WS),
    (100, 72, 136, f"{WS},bm=64,bn=64,stages=2"),
    (70, 72, 37, "bn=64"),                                 # K odd: the threads copy the operands
    (300, 600, 200, f"{WS},tiles=persistent,stages=3"),    # 3 CTAs of the interpreter, 4 tiles each
    (300, 600, 200, f"{WS},tiles=persistent,bn=192,stages=3"),  # 3 chunks a tile: slots alternate across tiles
])
def test_the_product_stored_through_shared_memory_is_the_product(m, n, k, options):
    pipe = f"canonicalize,accelerate-matmul{{{options + ',' if options else ''}store=tma}},cse,dce"
    func, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": m, "N": n, "K": k}, pipe)
    assert any(isinstance(op, TmaStoreOp) for op in low.walk())
    args = operands(m, n, k)
    want = run(func, args)["c"].astype(np.float32)
    got = run(low, args)["c"].astype(np.float32)
    assert not np.isnan(got).any(), "an output element was never stored"
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-2)


def test_an_f32_output_and_a_fused_epilogue_are_stored_through_shared_memory():
    f32 = parse_kfc(GEMM_F32)
    func, low = lowered(f32, {"M": 90, "N": 100, "K": 64}, f"canonicalize,accelerate-matmul{{{WS},store=tma}}")
    stage = next(op for op in low.walk() if isinstance(op, StageFragmentOp))
    assert stage.operands[1].ttype.shape == (2, 1, 128, 32)  # 32 f32 columns: one 128-byte row of a slot
    args = operands(90, 100, 64)
    np.testing.assert_allclose(run(low, args)["c"], run(func, args)["c"], rtol=1e-5, atol=1e-4)

    spec = load_kfc("kernels/gemm_bias_gelu.kfc")
    dims = {"M": 70, "N": 136, "K": 64}
    func, low = lowered(spec, dims, f"canonicalize,accelerate-matmul{{{WS},store=tma}},cse,dce")
    rng = np.random.default_rng(1)
    args = {**operands(70, 136, 64), "bias": rng.standard_normal(136).astype(np.float32)}
    want = run(func, args)["c"].astype(np.float32)
    np.testing.assert_allclose(run(low, args)["c"].astype(np.float32), want, rtol=2 ** -7, atol=1e-2)


def test_the_tma_store_ir_prints_and_parses_back():
    _, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": 64, "N": 64, "K": 64},
                     f"canonicalize,accelerate-matmul{{{WS},tiles=persistent,store=tma}}")
    text = print_ir(low)
    assert "gpu.stage_fragment" in text and "gpu.tma_store " in text and "gpu.tma_store_wait" in text
    assert print_ir(verify(parse_ir(text))) == text


def _rewritten(func, fn):
    """A planted fault: fn rewrites every block's ops."""
    def block(b: Block) -> Block:
        ops = [op.evolve(regions=tuple(block(r) for r in op.regions)) if op.regions else op for op in b.ops]
        return Block(b.args, fn(ops))
    return func.evolve(regions=(block(func.body),))


def _stored(options=WS):
    return lowered(load_kfc("kernels/gemm.kfc"), {"M": 128, "N": 256, "K": 128},
                   f"canonicalize,accelerate-matmul{{{options},store=tma}}")[1]


@pytest.mark.parametrize("options", [WS, "bm=64"])
def test_a_slot_written_while_its_store_reads_it_is_found(options):
    bad = _rewritten(_stored(options), lambda ops: [o for o in ops if not (isinstance(o, TmaStoreWaitOp)
                                                                             and o.pending)])
    with pytest.raises(VerifyError, match="writes slot 0 of %sc while a TMA store reading it is in flight"):
        verify(bad)


def test_a_store_of_unfenced_writes_is_found():
    def unfenced(ops):
        stores = any(isinstance(o, TmaStoreOp) for o in ops)
        return [o for o in ops if not (stores and isinstance(o, FenceProxyAsyncOp))]
    with pytest.raises(VerifyError, match="stores slot 0 of %sc, which the threads wrote, before a "
                                          "gpu.fence_proxy_async"):
        verify(_rewritten(_stored(), unfenced))


def test_a_program_ending_with_stores_in_flight_is_found():
    bad = _rewritten(_stored("bm=64"), lambda ops: [o for o in ops if not (isinstance(o, TmaStoreWaitOp)
                                                                           and not o.pending)])
    with pytest.raises(VerifyError, match="ends with 2 TMA store"):
        verify(bad)


def test_the_tma_store_gemm_builds_for_sm90a_with_its_stores():
    r = compile_op(load_kfc("kernels/gemm.kfc"), parse_target("sm_90a"),
                   pipeline=f"canonicalize,accelerate-matmul{{{WS},store=tma}}", shape={"M": 4096, "N": 4096, "K": 4096})
    sass = disassemble(r.kernel.cubin)
    assert "UTMASTG" in sass and "HGMMA.64x256x16.F32.BF16" in sass
    assert r.kernel.report.spills == 0
    [entry] = r.report["kernels"]
    assert entry["smem_dynamic_bytes"] <= 227 * 1024
    maps = [p for p in entry["params"] if p["kind"] == "tensor_map"]
    assert [(p["name"], p["is_output"], p["box"]) for p in maps] == \
        [("c", True, [64, 64]), ("a", False, [128, 64]), ("b", False, [64, 64])]


def test_what_a_tma_store_cannot_take_is_refused_by_name():
    spec = load_kfc("kernels/gemm.kfc")
    with pytest.raises(KfcError, match="a TMA store takes rows whose pitch is a multiple of 16 bytes; a row of c "
                                       "is 14"):
        compile_op(spec, parse_target("sm_90a"), pipeline="accelerate-matmul{store=tma}",
                   shape={"M": 8, "N": 7, "K": 8})
    with pytest.raises(KfcError, match="store=tma stages wgmma's fragments"):
        compile_op(spec, parse_target("sm_100a"), pipeline="accelerate-matmul{store=tma}",
                   shape={"M": 128, "N": 256, "K": 64})


def test_store_auto_takes_tma_where_the_output_the_mma_and_shared_memory_allow_it():
    spec = load_kfc("kernels/gemm.kfc")

    def stores_by_tma(dims, options, target="sm_90a"):
        pm = f"canonicalize,accelerate-matmul{{{options}}}"
        low = PassManager(parse_pipeline(pm), PassContext(target=parse_target(target))).run(
            specialize(spec.func, dims))
        return any(isinstance(op, TmaStoreOp) for op in low.walk())

    square = {"M": 256, "N": 512, "K": 128}
    assert stores_by_tma(square, f"{WS},store=auto")
    assert not stores_by_tma({"M": 8, "N": 7, "K": 8}, f"{WS},store=auto")        # a row of 14 bytes
    assert not stores_by_tma(square, f"{WS},bn=192,stages=5,store=auto")         # 200 KB of stages: no room
    assert not stores_by_tma(square, "store=auto", target="sm_100a")              # tcgen05 stores directly
    # K odd: the threads copy the operands, and the kernel stays free of tensor maps (packageable)
    assert not stores_by_tma({"M": 33, "N": 64, "K": 17}, f"{WS},store=auto")


@pytest.mark.parametrize("pieces,n,width", [(1, 128, 64), (2, 128, 64), (2, 192, 64), (1, 72, 8)])
def test_staging_a_chunk_of_columns_takes_every_piece_of_every_row_once(pieces, n, width):
    """gpu.stage_fragment's register range: each thread's registers of [column, column + width)
    cover the warpgroup's 64·P rows by those columns exactly once. (The interpreter stages by
    element, so only this sees the emitted loop; a range blind to pieces once stored half a
    128-row pingpong tile and left the rest garbage on the GPU.)"""
    from kfc.codegen.tma_store_rules import staged_registers
    from kfc.ir.layouts import WgmmaAccumulator

    frag = WgmmaAccumulator(warpgroups=1, pieces=pieces)
    threads = np.arange(128)[:, None]
    for column in range(0, n, width):
        first, last = staged_registers(frag, column, width)
        rows, cols = frag.element(threads, np.arange(first, last)[None, :])
        got = sorted(zip(rows.ravel().tolist(), cols.ravel().tolist()))
        want = [(r, c) for r in range(64 * pieces) for c in range(column, min(column + width, n))]
        assert got == sorted(want)

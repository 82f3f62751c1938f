"""Blackwell (sm_100a): accelerate-matmul builds on tcgen05 there (mma=auto): a producer
warpgroup's thread loads stages by TMA, one thread issues tcgen05.mma into tensor memory and
commits each stage back, the warpgroup loads the accumulator 32 columns at a time for the
epilogue. The interpreter computes the product from that IR and finds planted protocol faults;
ptxas builds it and the SASS holds UTCHMMA, UTCBAR and LDTM. No B200 is lent: this is the whole
of the proof for Blackwell."""

from __future__ import annotations

import numpy as np
import pytest

from kfc.cli import main
from kfc.codegen.toolchain import disassemble
from kfc.compile import compile_op
from kfc.diagnostics import InterpretError, KfcError, VerifyError
from kfc.frontend import load_kfc, parse_kfc
from kfc.ir import parse_ir, print_ir, verify
from kfc.ir.core import Block
from kfc.ir.interpreter import run
from kfc.ir.mma_ops import MbarrierWaitParityOp, RolesOp, Tcgen05CommitOp, Tcgen05MmaOp, TmemLoadOp
from kfc.ir.specialize import specialize
from kfc.model.target import parse_target
from kfc.passes import MATMUL_PIPELINE, PassContext, PassManager, parse_pipeline
from test_matmul import operands

BLACKWELL = parse_target("sm_100a")
BIAS_RELU = """
op gemm_bias_relu(a: bf16[M, K], b: bf16[K, N], bias: f32[N]) -> (c: bf16[M, N]) {
  c = bf16(max(dot(a, b) + bias, 0.0))
}
"""


def lowered(spec, dims, pipeline=MATMUL_PIPELINE):
    func = specialize(spec.func, dims)
    return func, PassManager(parse_pipeline(pipeline), PassContext(target=BLACKWELL)).run(func)


@pytest.mark.parametrize("m,n,k,pipe", [
    (1, 8, 8, MATMUL_PIPELINE), (130, 264, 200, MATMUL_PIPELINE), (257, 520, 1024, MATMUL_PIPELINE),
    (64, 128, 384, "accelerate-matmul{bn=128,stages=2}"), (128, 64, 256, "accelerate-matmul{mma=tcgen05,bn=64,bk=128,stages=3}"),
])
def test_the_tcgen05_program_computes_the_product(m, n, k, pipe):
    func, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": m, "N": n, "K": k}, f"canonicalize,{pipe},cse,dce")
    assert any(isinstance(op, Tcgen05MmaOp) for op in low.walk())
    args = operands(m, n, k)
    want = run(func, args)["c"].astype(np.float32)
    got = run(low, args)["c"].astype(np.float32)
    assert not np.isnan(got).any(), "an output element was never stored"
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-2)


def test_the_epilogue_runs_on_each_loaded_chunk():
    spec = parse_kfc(BIAS_RELU, "gemm_bias_relu.kfc")
    func, low = lowered(spec, {"M": 130, "N": 264, "K": 64})
    rng = np.random.default_rng(2)
    args = {**operands(130, 264, 64, seed=2), "bias": rng.standard_normal(264).astype(np.float32)}
    np.testing.assert_allclose(run(low, args)["c"].astype(np.float32), run(func, args)["c"].astype(np.float32),
                               rtol=2 ** -7, atol=1e-2)


def test_the_tcgen05_ir_prints_and_parses_back():
    _, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": 128, "N": 256, "K": 256})
    text = print_ir(low)
    assert "gpu.tcgen05_mma" in text and "gpu.tmem_load" in text
    assert print_ir(verify(parse_ir(text))) == text


def _small(k=512):
    return lowered(load_kfc("kernels/gemm.kfc"), {"M": 128, "N": 256, "K": k})[1]


def _rewrite(func, fn, in_role=None):
    """A planted fault: fn rewrites each op (a list in its place) of role `in_role` (or all)."""
    def block(b: Block, here: bool) -> Block:
        ops = []
        for op in b.ops:
            if isinstance(op, RolesOp):
                op = op.evolve(regions=tuple(block(r, in_role in (None, i)) for i, r in enumerate(op.regions)))
            elif op.regions:
                op = op.evolve(regions=tuple(block(r, here) for r in op.regions))
            ops.extend(fn(op) if here else [op])
        return Block(b.args, ops)

    return func.evolve(regions=(block(func.body, in_role is None),))


def test_reading_the_accumulator_before_the_mmas_are_done_is_a_hazard():
    bad = _rewrite(_small(), lambda op: [] if isinstance(op, MbarrierWaitParityOp) and
                   op.operands[0].name == "done" else [op], in_role=1)
    with pytest.raises(VerifyError, match="tmem_load: reads .*acc while a tcgen05.mma writing it is in flight"):
        verify(bad)
    with pytest.raises(InterpretError, match="while a tcgen05.mma writing it is in flight"):
        run(bad, operands(128, 256, 512))


def test_refilling_a_stage_nobody_waited_free_is_found_under_some_schedule():
    bad = _rewrite(_small(), lambda op: [] if isinstance(op, MbarrierWaitParityOp) else [op], in_role=0)
    with pytest.raises(VerifyError, match="overwrites stage .* while a tcgen05.mma reading it is in flight"):
        verify(bad)


def test_a_missing_final_commit_is_a_deadlock_at_the_epilogues_wait():
    def drop_done_commit(op):
        return [] if isinstance(op, Tcgen05CommitOp) and op.operands[0].name == "done" else [op]

    with pytest.raises(VerifyError, match="deadlock: waits on %done"):
        verify(_rewrite(_small(), drop_done_commit, in_role=1))


TRANSPOSED = """
op gemm_t(a: bf16[K, M], b: bf16[N, K]) -> (c: f32[M, N]) {
  c = dot(a, b, trans_a=true, trans_b=true)
}
"""


@pytest.mark.parametrize("m,n,k", [(1, 7, 5), (33, 65, 17), (130, 257, 129)])
def test_operands_tma_cannot_move_are_copied_by_the_threads(m, n, k):
    func, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": m, "N": n, "K": k})
    assert any(op.NAME == "gpu.copy_stage" for op in low.walk()) and not any(isinstance(op, RolesOp) for op in low.walk())
    args = operands(m, n, k)
    np.testing.assert_allclose(run(low, args)["c"].astype(np.float32), run(func, args)["c"].astype(np.float32),
                               rtol=2 ** -7, atol=1e-2)


def test_transposed_operands_are_copied_transposed_on_blackwell():
    spec = parse_kfc(TRANSPOSED, "gemm_t.kfc")
    func, low = lowered(spec, {"M": 70, "N": 72, "K": 40})
    rng = np.random.default_rng(5)
    import ml_dtypes
    args = {"a": rng.standard_normal((40, 70)).astype(ml_dtypes.bfloat16),
            "b": rng.standard_normal((72, 40)).astype(ml_dtypes.bfloat16)}
    np.testing.assert_allclose(run(low, args)["c"], run(func, args)["c"], rtol=1e-5, atol=1e-4)


def test_copying_over_a_stage_an_mma_still_reads_is_a_hazard():
    low = lowered(load_kfc("kernels/gemm.kfc"), {"M": 33, "N": 65, "K": 300})[1]

    def drop_loop_wait(op):
        if op.NAME == "tile.if":  # the wait for the MMAs of k-tile kt - 1, which read the other stage
            return [op.evolve(regions=tuple(Block(r.args, [o for o in r.ops if not isinstance(o, MbarrierWaitParityOp)])
                                            for r in op.regions))]
        return [op]

    with pytest.raises(VerifyError, match="overwrites stage .* while a tcgen05.mma reading it is in flight"):
        verify(_rewrite(low, drop_loop_wait))


def test_wgmma_named_on_blackwell_is_refused_with_what_to_use():
    with pytest.raises(KfcError, match="wgmma") as info:
        lowered(load_kfc("kernels/gemm.kfc"), {"M": 128, "N": 256, "K": 64}, "accelerate-matmul{mma=wgmma}")
    assert "mma at auto, or give mma=tcgen05" in info.value.hint


@pytest.mark.parametrize("options, names", [("bm=64", "not bm=64"), ("tiles=persistent", "not tiles=persistent"),
                                            ("producer=warpgroup,tiles=persistent", "not tiles=persistent")])
def test_what_the_tcgen05_kernel_does_not_take_is_named(options, names):
    """The refusal names the option the kernel cannot take (a persistent schedule was blamed on
    bm, which the caller had not given)."""
    with pytest.raises(KfcError, match=names):
        lowered(load_kfc("kernels/gemm.kfc"), {"M": 128, "N": 256, "K": 64},
                f"accelerate-matmul{{mma=tcgen05,{options}}}")


def test_gemm_compiles_for_sm100a_to_utchmma(tmp_path):
    r = compile_op(load_kfc("kernels/gemm.kfc"), BLACKWELL)
    assert r.arch == "sm_100a" and "tcgen05" in r.report["features"]
    sass = disassemble(r.kernel.cubin)
    assert "UTCHMMA" in sass and "UTCBAR" in sass and "LDTM" in sass and "UTMALDG" in sass
    assert r.kernel.report.spills == 0
    [entry] = r.report["kernels"]
    assert entry["grid"] == ["512", "1", "1"] and entry["block"] == [256, 1, 1]
    assert main(["compile", "kernels/gemm_bias_relu.kfc", "--target", "sm_100a", "-o", str(tmp_path / "out")]) == 0
    odd = compile_op(load_kfc("kernels/gemm.kfc"), BLACKWELL, shape={"M": 33, "N": 65, "K": 17})
    assert "UTCHMMA" in disassemble(odd.kernel.cubin) and odd.report["kernels"][0]["block"] == [128, 1, 1]

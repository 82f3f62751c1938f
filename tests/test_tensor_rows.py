"""rows-of-tensors on the CPU: programs written on whole tensors (a column sum, rmsnorm's
backward with dw = sum(..., axis=0)) become parallel loops over their rows, equal to the
whole-tensor program in the interpreter (odd sizes, one row, one column); the rows stay a
run-time size; the programs compile for sm_90a and sm_100a at the acceptance row lengths; what
does not compute row by row is refused with the reason."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kfc.compile import compile_op, row_dims
from kfc.diagnostics import KfcError
from kfc.frontend import load_kfc, parse_kfc
from kfc.ir.interpreter import run
from kfc.ir.specialize import specialize
from kfc.ir.tile_ops import ParallelOp, ReduceOp
from kfc.passes import PassContext
from kfc.passes.tensor_rows import RowsOfTensors
from kfc.model.target import parse_target

COLSUM = "kernels/colsum.kfc"
RMSNORM_BWD = "kernels/rmsnorm_bwd_tensors.kfc"


def rows(spec, n):
    func = specialize(spec.func, {"N": n}, partial=True)
    return func, RowsOfTensors().run(func, PassContext(parse_target("sm_90a")))


def rmsnorm_bwd_inputs(m, n, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16),
            "w": rng.standard_normal(n).astype(np.float32),
            "dout": rng.standard_normal((m, n)).astype(ml_dtypes.bfloat16),
            "rstd": rng.uniform(0.5, 2.0, m).astype(np.float32)}


def test_the_rows_stay_a_run_time_size():
    assert row_dims(load_kfc(COLSUM, {"T": "bf16"}).func) == ["M"]
    assert row_dims(load_kfc(RMSNORM_BWD, {"T": "bf16"}).func) == ["M"]
    assert row_dims(load_kfc("kernels/gemm.kfc").func) == [], "a matrix product is not a row program"


@pytest.mark.parametrize("m,n", [(1, 1), (7, 4095), (33, 7), (5, 256)])
def test_a_column_sum_is_a_sum_across_the_loop(m, n):
    func, low = rows(load_kfc(COLSUM, {"T": "bf16"}), n)
    (loop,) = [op for op in low.body.ops if isinstance(op, ParallelOp)]
    assert loop.reduce == ("sum",) and not any(isinstance(op, ReduceOp) for op in loop.body.ops)
    x = np.random.default_rng(m * n).standard_normal((m, n)).astype(ml_dtypes.bfloat16)
    want = x.astype(np.float64).sum(0)
    got = run(low, {"x": x}, {"M": m})["y"]
    assert np.allclose(got, run(func, {"x": x}, {"M": m})["y"], rtol=1e-6, atol=1e-6)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,n", [(1, 1), (3, 1), (7, 4095), (4, 7)])
def test_the_whole_tensor_rmsnorm_backward_is_the_row_one(m, n):
    """The same dx and dw as kernels/rmsnorm_bwd.kfc (written as a loop over rows) and the
    whole-tensor program itself."""
    func, low = rows(load_kfc(RMSNORM_BWD, {"T": "bf16"}), n)
    args = rmsnorm_bwd_inputs(m, n)
    row_func = specialize(load_kfc("kernels/rmsnorm_bwd.kfc", {"T": "bf16"}).func, {"N": n}, partial=True)
    ref = run(row_func, args, {"M": m})
    for got in (run(low, args, {"M": m}), run(func, args, {"M": m})):
        np.testing.assert_allclose(got["dw"], ref["dw"], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got["dx"].astype(np.float32), ref["dx"].astype(np.float32), rtol=1e-2, atol=1e-2)


def test_a_mean_over_the_rows_adds_each_rows_share():
    spec = parse_kfc("""
op colmean(x: f32[M, N]) -> (y: f32[N], z: f32[M, N]) {
  z = x * 2.0
  y = mean(x, axis=0)
}
""", "colmean.kfc")
    func, low = rows(spec, 9)
    x = np.random.default_rng(1).standard_normal((6, 9)).astype(np.float32)
    got = run(low, {"x": x}, {"M": 6})
    np.testing.assert_allclose(got["y"], x.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["z"], x * 2)


@pytest.mark.parametrize("path", [COLSUM, RMSNORM_BWD])
@pytest.mark.parametrize("target,n", [("sm_90a", 1), ("sm_90a", 4095), ("sm_90a", 16384), ("sm_100a", 16384)])
def test_the_whole_tensor_programs_compile_under_verify_each(path, target, n):
    r = compile_op(load_kfc(path, {"T": "bf16"}), parse_target(target), shape={"N": n}, verify_each=True)
    assert r.report["dynamic_dims"] == ["M"] and r.kernel.report.spills == 0
    assert [k["name"].endswith("_sums") for k in r.report["kernels"]] == [False, True], "two phases, no atomics"
    assert "atom" not in r.kernel.ptx


@pytest.mark.parametrize("body,why", [
    ("y = sum(x - mean(x, axis=0), axis=0)", "second pass over the rows"),
    ("y = max(x, axis=0)", "max over the rows"),
])
def test_what_is_not_row_by_row_is_refused_with_the_reason(body, why):
    spec = parse_kfc(f"op bad(x: f32[M, N]) -> (y: f32[N]) {{\n  {body}\n}}\n", "bad.kfc")
    with pytest.raises(KfcError, match=why) as info:
        compile_op(spec, parse_target("sm_90a"), shape={"N": 64})
    assert "rows-of-tensors" in str(info.value)

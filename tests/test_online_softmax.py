"""Online softmax on the CPU: the online-softmax pass makes a row's max(x) and sum(exp(x - max(x)))
one tile.max_sumexp, which the interpreter computes as the two reductions did; lower-reductions
carries the (max, sum) pair through the thread, warp, CTA and cluster steps, whose interpreter
semantics agree with the op on rows that hold -inf, NaN and huge values (--verify-each); softmax
then reads a staged row twice and crosses the cluster once, in code that builds without spills
(the default pipeline, which leaves the pass out, crosses twice).
"""

import numpy as np
import pytest

from kfc.compile import compile_op
from kfc.frontend import load_kfc, parse_kfc
from kfc.ir import parse_ir, print_ir
from kfc.ir.gpu_ops import (
    ClusterMaxSumExpOp, CtaMaxSumExpOp, ThreadMaxSumExpOp, UniformOp, WarpMaxSumExpOp,
)
from kfc.ir.interpreter import run
from kfc.ir.tile_ops import MaxSumExpOp, ReduceOp
from kfc.passes import ROW_PIPELINE, VerifyEach
from kfc.passes.stage_rows import stretches
from kfc.passes.rows import find_row_loop
from kfc.model.target import parse_target
from tests.pipelines import kernel, ops_of, run_pipeline

LSE = """
op lse(x: f32[M, N]) -> (y: f32[M]) {
  parallel m in 0..M {
    xr = x[m, :]
    mx = max(xr)
    y[m] = mx + log(sum(exp(xr - mx)))
  }
}
"""
# the sum is of another row's exponentials: nothing to fuse
ONLINE = ROW_PIPELINE.replace("stage-rows", "online-softmax,stage-rows")
OTHER_ROW = """
op other(x: f32[M, N], z: f32[M, N]) -> (y: f32[M]) {
  parallel m in 0..M {
    xr = x[m, :]
    zr = z[m, :]
    y[m] = sum(exp(zr - max(xr)))
  }
}
"""


def rows_with_edges(m: int, n: int) -> np.ndarray:
    """Random rows, and rows that test the pair's rules: one half -inf (lanes without a finite
    element), all -inf (NaN, as torch gives), one NaN, one huge value."""
    x = (np.random.default_rng(1).standard_normal((m, n)) * 3).astype(np.float32)
    x[1, : n // 2] = -np.inf
    x[2, :] = -np.inf
    x[3, n // 3] = np.nan
    x[4, n - 1] = 1e30
    return x


def test_the_pass_fuses_softmax_and_changes_no_result():
    spec, f = kernel("softmax", 4095, "f32")
    g, ctx = run_pipeline(f, "canonicalize,online-softmax", check=spec.check)
    assert len(ops_of(g, MaxSumExpOp)) == 1 and not ops_of(g, ReduceOp)
    assert any("1 max and sum of exponentials fused" in m for _, m in ctx.notes)
    x = rows_with_edges(6, 4095)
    want, got = run(f, {"x": x})["y"], run(g, {"x": x})["y"]
    np.testing.assert_array_equal(want, got)  # the op computes what the two reductions did
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(1, keepdims=True))
    reference = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(got[[0, 1, 4]], reference[[0, 1, 4]], rtol=1e-5)
    assert np.isnan(got[2]).all() and np.isnan(got[3]).all()


def test_a_logsumexp_fuses_and_another_row_s_sum_does_not(tmp_path):
    lse = parse_kfc(LSE, str(tmp_path / "lse.kfc"))
    g, _ = run_pipeline(lse.func, "online-softmax")
    assert len(ops_of(g, MaxSumExpOp)) == 1
    other = parse_kfc(OTHER_ROW, str(tmp_path / "other.kfc"))
    g, _ = run_pipeline(other.func, "online-softmax")
    assert not ops_of(g, MaxSumExpOp) and len(ops_of(g, ReduceOp)) == 2


def test_softmax_reads_a_staged_row_in_two_stretches():
    spec, f = kernel("softmax", 65536)
    assert stretches(find_row_loop(f).body) == 3
    g, _ = run_pipeline(f, "canonicalize,online-softmax", check=spec.check)
    assert stretches(find_row_loop(g).body) == 2


@pytest.mark.parametrize("n, tile, steps", [
    (7, "tile", (ThreadMaxSumExpOp, WarpMaxSumExpOp)),
    (4095, "tile{threads=256,cluster=1}", (ThreadMaxSumExpOp, WarpMaxSumExpOp, CtaMaxSumExpOp)),
    (4096, "tile{threads=64,cluster=4}", (ThreadMaxSumExpOp, WarpMaxSumExpOp, CtaMaxSumExpOp, ClusterMaxSumExpOp)),
    (1000, "tile{threads=32,cluster=2,vec=1}", (ThreadMaxSumExpOp, WarpMaxSumExpOp, ClusterMaxSumExpOp)),
])
def test_the_pair_steps_agree_with_the_op_under_verify_each(n, tile, steps):
    spec, f = kernel("softmax", n, "f32")
    ve = VerifyEach({"N": n, "M": 6}, spec.check, seeds=(0, 1))
    g, _ = run_pipeline(f, f"canonicalize,online-softmax,stage-rows,{tile},lower-reductions,lower-ptx", check=spec.check,
                        verify_each=ve)
    made = [type(op) for op in g.walk() if type(op).__name__.endswith("MaxSumExpOp")]
    assert tuple(made) == steps and len(ops_of(g, UniformOp)) == 2
    assert all(op.approx for op in g.walk() if isinstance(op, steps))
    # rows with -inf, NaN and a huge value: the lowered steps give the op's results
    x = rows_with_edges(6, n)
    want, got = run(f, {"x": x})["y"], run(g, {"x": x})["y"]
    finite = [0, 1, 4, 5]
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-30)
    assert np.isnan(got[2]).all() and np.isnan(got[3]).all()
    # a lowered program prints and parses back
    assert print_ir(parse_ir(print_ir(g))) == print_ir(g)


def test_without_approx_the_steps_take_expf():
    spec, f = kernel("softmax", 4096, "f32")
    g, _ = run_pipeline(f, "canonicalize,online-softmax,tile,lower-reductions,lower-ptx{approx=off}", check=spec.check)
    assert not any(op.approx for op in g.walk() if isinstance(op, (ThreadMaxSumExpOp, WarpMaxSumExpOp)))
    from kfc.codegen.cuda import generate_cuda

    code, _ = generate_cuda(g)
    assert "expf(" in code and "kfc_ex2_approx(" not in code.split("extern \"C\"")[1]
    g, _ = run_pipeline(f, "canonicalize,online-softmax,tile,lower-reductions,lower-ptx{approx=on}", check=spec.check)
    code, _ = generate_cuda(g)
    assert "expf(" not in code and "kfc_ex2_approx((" in code


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("n", [65536, 262143, 262144])
def test_softmax_crosses_the_cluster_once_without_spills(target, n):
    spec = load_kfc("kernels/softmax.kfc", {"T": "bf16"})
    r = compile_op(spec, parse_target(target), pipeline=ONLINE, shape={"N": n})
    assert r.plan.cluster > 1 and r.kernel.report.spills == 0
    cu = r.kernel.cu
    assert "kfc_cbar0" in cu and "kfc_cbar1" not in cu, "one cluster crossing: the (max, sum) pair"
    if n % 2 == 0:
        assert cu.count("ld.shared.v4.b32") == 2, "the staged row is read twice: the pair, then the output"
    default = compile_op(spec, parse_target(target), shape={"N": n}).kernel.cu
    assert "kfc_cbar1" in default, "the default pipeline reduces the max and the sum apart"

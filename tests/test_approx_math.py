"""approx-math: a tile program's f32 exp, rsqrt and sigmoid on ex2.approx and rsqrt.approx
(kfc.passes.approx_math): which values it takes, what the interpreter computes on its IR, and
the instructions it saves in KDA's prepare kernel. What the GPU computes against the final IR is
checked on the GPU machine (tests/gpu/test_final_ir_gpu.py)."""

import re

import numpy as np
import pytest

from kfc.cli import main
from kfc.codegen.toolchain import disassemble
from kfc.compile import compile_op
from kfc.frontend import load_kfc, parse_kfc
from kfc.ir.interpreter import run
from kfc.ir.ptx_ops import Ex2ApproxOp, RsqrtApproxOp
from kfc.ir.tile_ops import UNARY_CLASSES
from kfc.model.target import parse_target
from kfc.passes import TILE_PIPELINE, PassContext, PassManager, parse_pipeline

MATH = """
op math(x: f32[B, 16, 32], n: i32[B, 16]) -> (y: f32[B, 16, 32], s: f32[B, 16], c: i32[B, 16]) {
  parallel b in 0..B {
    X = x[b, :, :]
    y[b, :, :] = exp(X - 1.0) * sigmoid(X)
    s[b, :] = rsqrt(sum(X * X, axis=1) + 1e-6)
    c[b, :] = i32(exp(x[b, :, 0]) > 2.0) + n[b, :]  # an exact output: its exp stays exact
  }
}
check {
  tolerance = {f32: %s}
}
"""

APPROX = (Ex2ApproxOp, RsqrtApproxOp)


def lowered(tolerance="1e-3", pipeline="canonicalize,cse,dce,approx-math"):
    spec = parse_kfc(MATH % tolerance)
    ctx = PassContext(target=parse_target("sm_90a"), check=spec.check)
    return spec, PassManager(parse_pipeline(pipeline), ctx).run(spec.func), ctx


def counts(func) -> dict[str, int]:
    names = {"exp": UNARY_CLASSES["exp"], "rsqrt": UNARY_CLASSES["rsqrt"], "sigmoid": UNARY_CLASSES["sigmoid"],
             "ex2": Ex2ApproxOp, "rsqrt_approx": RsqrtApproxOp}
    return {k: sum(type(op) is c for op in func.walk()) for k, c in names.items()}


def test_the_pass_takes_the_floats_no_exact_output_depends_on():
    _, func, ctx = lowered()
    # exp(X - 1) and sigmoid(X) of y, rsqrt of s; the exp that c's comparison reads stays
    assert counts(func) == {"exp": 1, "rsqrt": 0, "sigmoid": 0, "ex2": 2, "rsqrt_approx": 1}
    assert any("1 exp, 1 rsqrt, 1 sigmoid approximated" in m for _, m in ctx.notes)
    assert len(ctx.approximations) == 3 and all(".approx for" in what for _, what, _ in ctx.approximations)


@pytest.mark.parametrize("tolerance, pipeline", [("1e-6", "approx-math"), ("1e-3", "approx-math{approx=off}")])
def test_nothing_is_taken_under_a_tight_tolerance_or_with_approx_off(tolerance, pipeline):
    _, func, ctx = lowered(tolerance, pipeline)
    assert counts(func)["ex2"] == counts(func)["rsqrt_approx"] == 0
    assert any("nothing approximated" in m for _, m in ctx.notes)


def test_the_interpreter_computes_the_approximated_ir_within_the_bound():
    spec, func, _ = lowered()
    rng = np.random.default_rng(0)
    args = {"x": (rng.standard_normal((3, 16, 32)) * 4).astype(np.float32),
            "n": rng.integers(-5, 5, (3, 16)).astype(np.int32)}
    exact, approx = run(spec.func, args), run(func, args)
    for name in ("y", "s"):
        np.testing.assert_allclose(approx[name], exact[name], rtol=1e-5, atol=1e-30)
    np.testing.assert_array_equal(approx["c"], exact["c"])


def test_kdas_prepare_kernel_passes_its_check_and_issues_fewer_instructions(capsys):
    # the default takes it first (canonicalize and cse then place its constants); without it, expf
    assert TILE_PIPELINE.startswith("approx-math,")
    exact = TILE_PIPELINE.replace("approx-math,", "")
    assert main(["check", "kernels/kda_prepare_flashkda.kfc", "--dtype", "C=16"]) == 0
    capsys.readouterr()
    spec = load_kfc("kernels/kda_prepare_flashkda.kfc", {"C": "16"})
    shape = {"T": 4096, "K": 128, "V": 128}
    plain = compile_op(spec, parse_target("sm_90a"), exact, shape=shape)
    fast = compile_op(spec, parse_target("sm_90a"), shape=shape)
    assert fast.pipeline == TILE_PIPELINE and plain.pipeline == exact
    assert "expf(" in plain.kernel.cu and "expf(" not in fast.kernel.cu
    assert "ex2.approx.ftz.f32" in fast.kernel.cu
    assert not fast.kernel.report.spills
    assert fast.kernel.cu.count("__syncthreads();") == plain.kernel.cu.count("__syncthreads();")

    def sass(r):
        return re.findall(r"/\*[0-9a-f]{4,5}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", disassemble(r.kernel.cubin))

    assert len(sass(fast)) < 0.92 * len(sass(plain))
    # the exponentials on the SFU; the sigmoids' reciprocals one MUFU.RCP each, not a division
    assert sass(fast).count("MUFU.EX2") >= sass(plain).count("MUFU.EX2")
    assert "rcp.approx.ftz.f32" in fast.kernel.cu and "1.0f / (1.0f +" not in fast.kernel.cu

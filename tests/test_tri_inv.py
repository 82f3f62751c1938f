"""tile.tri_inv, (I + tril(x, -1))^-1 of a square f32 tile (KDA's chunk solve): the interpreter
inverts it by forward substitution and reads only the strictly lower part; the builder refuses
what it cannot invert by name; lower-tri-inv writes it as a loop of tile ops that computes the
same bits, and the KDA kernels pass --verify-each through it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kfc.cli import main
from kfc.compile import compile_op
from kfc.diagnostics import KfcError
from kfc.frontend import parse_kfc
from kfc.ir.interpreter import run
from kfc.ir.tile_ops import TriInvOp
from kfc.model.target import parse_target
from kfc.passes import PassContext, PassManager, parse_pipeline

INVERT = """
op inv(x: f32[C, C]) -> (y: f32[C, C]) {
  y[:, :] = tri_inv(x[:, :])
}
"""


def _spec(c: int):
    return parse_kfc(INVERT.replace("C", str(c)))


@pytest.mark.parametrize("c", [1, 7, 64])
def test_the_inverse_is_numpys_and_reads_only_the_strict_lower_part(c):
    rng = np.random.default_rng(c)
    x = (0.3 * rng.standard_normal((c, c))).astype(np.float32)
    got = run(_spec(c).func, {"x": x})["y"]
    want = np.linalg.inv(np.eye(c) + np.tril(x.astype(np.float64), -1))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    noise = x + np.triu(rng.standard_normal((c, c)).astype(np.float32))  # the diagonal and above change
    np.testing.assert_array_equal(run(_spec(c).func, {"x": noise})["y"], got)


@pytest.mark.parametrize("sig,message", [
    ("x: f32[4, 8]) -> (y: f32[4, 8]", "tri_inv inverts a square tile of a fixed size, not [4, 8]"),
    ("x: f16[4, 4]) -> (y: f32[4, 4]", "tri_inv inverts an f32 tile, not f16"),
])
def test_what_tri_inv_cannot_invert_is_refused_where_it_is_written(sig, message):
    with pytest.raises(KfcError, match=re.escape(message)) as e:
        parse_kfc(f"op inv({sig}) {{\n  y[:, :] = f32(tri_inv(x[:, :]))\n}}\n", "inv.kfc")
    assert "inv.kfc:2:17: error" in str(e.value)


def test_lowered_to_a_loop_it_computes_the_same_bits():
    spec = _spec(16)
    low = PassManager(parse_pipeline("lower-tri-inv"), PassContext(target=parse_target("sm_90a"))).run(spec.func)
    assert not any(isinstance(op, TriInvOp) for op in low.walk())
    assert any(op.NAME == "tile.for" for op in low.walk())
    x = (0.3 * np.random.default_rng(5).standard_normal((16, 16))).astype(np.float32)
    np.testing.assert_array_equal(run(low, {"x": x})["y"], run(spec.func, {"x": x})["y"])


@pytest.mark.parametrize("kernel", ["kda_fwd", "kda_fwd_flashkda"])
def test_the_kda_kernels_pass_verify_each_through_the_lowering(kernel, tmp_path, capsys):
    out = tmp_path / f"{kernel}.kir"
    assert main(["opt", f"kernels/{kernel}.kfc", "-p", "lower-tri-inv", "--verify-each", "-o", str(out)]) == 0
    text = out.read_text()
    assert "tile.tri_inv" not in text and text.count("tile.for") == 2


@pytest.mark.parametrize("c", [2, 8, 16, 32])
def test_by_doubling_it_is_the_same_inverse_up_to_rounding(c):
    """tri-inv-doubling: (I + N)(I + N^2)(I + N^4)... with N = -tril(x, -1), log2(C) - 1
    squarings and as many products, no tri_inv left."""
    spec = _spec(c)
    ctx = PassContext(target=parse_target("sm_90a"))
    low = PassManager(parse_pipeline("tri-inv-doubling"), ctx).run(spec.func)
    assert not any(isinstance(op, TriInvOp) for op in low.walk())
    assert sum(op.NAME == "tile.dot" for op in low.walk()) == 2 * (c.bit_length() - 2)
    x = (0.3 * np.random.default_rng(c).standard_normal((c, c))).astype(np.float32)
    want = np.linalg.inv(np.eye(c) + np.tril(x.astype(np.float64), -1))
    np.testing.assert_allclose(run(low, {"x": x})["y"], want, rtol=1e-4, atol=1e-5)


def test_by_doubling_a_size_no_power_of_two_is_left_as_it_is():
    ctx = PassContext(target=parse_target("sm_90a"))
    low = PassManager(parse_pipeline("tri-inv-doubling"), ctx).run(_spec(12).func)
    assert any(isinstance(op, TriInvOp) for op in low.walk())
    assert any("of a size no power of two left as they are" in message for _, message in ctx.notes)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_kdas_prepare_kernel_inverts_by_doubling_on_tensor_cores(target, tmp_path):
    """Its 16 x 16 solve as six products that tf32-dots puts on tensor cores (beside the
    kernel's own seven): the interpreter passes it through --verify-each, and the tile emitter
    writes the squaring and the product sharing its B in one phase."""
    pipeline = "canonicalize,cse,dce,tri-inv-doubling,canonicalize,cse,dce,hoist-loads,tf32-dots"
    assert main(["opt", "kernels/kda_prepare_flashkda.kfc", "-p", pipeline, "--verify-each",
                 "-o", str(tmp_path / "p.kir")]) == 0
    assert main(["compile", "kernels/kda_prepare_flashkda.kfc", "--target", target, "-p", pipeline,
                 "--shape", "T=4096,K=128,V=128", "-o", str(tmp_path / "c")]) == 0
    cu = (tmp_path / "c" / "kda_prepare_flashkda.cu").read_text()
    assert cu.count("kfc_mma_tf32(") == 13 and "tile.tri_inv" not in (tmp_path / "c" / "kda_prepare_flashkda.kir").read_text()


INVERSES = """
op inverses(a: f32[B, 7, 7], c: f32[B, 32, 32], d: f32[B, 33, 33]) -> (x: f32[B, 7, 7], z: f32[B, 32, 32], w: f32[B, 33, 33]) {
  parallel i in 0..B {
    x[i, :, :] = tri_inv(a[i, :, :])
    z[i, :, :] = tri_inv(c[i, :, :])
    w[i, :, :] = tri_inv(d[i, :, :])
  }
}
"""


def test_up_to_a_warps_width_of_rows_the_inverse_is_a_lane_a_row():
    cu = compile_op(parse_kfc(INVERSES, "inverses.kfc"), parse_target("sm_90a")).kernel.cu
    # 7 rows in groups of 8 lanes, 32 in whole warps: one shuffle and one fma a step, n - 1 steps
    steps = re.findall(r"for \(int kfc_j\d+ = 0; kfc_j\d+ < (\d+); \+\+kfc_j\d+\) \{\n\s*const float kfc_x\d+ = "
                       r"__shfl_sync\(0xffffffffu, kfc_a\d+, kfc_j\d+, (\d+)\);", cu)
    assert steps == [("6", "8"), ("31", "32")]
    # 33 rows: a thread a column, its rows in turn
    assert len(re.findall(r"for \(int kfc_t\d+ = 0; kfc_t\d+ < 33; \+\+kfc_t\d+\)", cu)) == 1

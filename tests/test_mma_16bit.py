"""Products on tensor cores in 16 bits (kfc.codegen.tile_mma, mma.sync.m16n8k16): products of
bf16 or f16 tiles, exact there as they are, and f32 products the bf16-dots pass rounds to bf16.
The interpreter's rounding, the pass's reach, and what nvcc/ptxas build for Hopper and Blackwell;
the GPU against the final IR is tests/gpu/test_final_ir_gpu.py's."""

import re

import numpy as np
import pytest

from kfc.codegen.toolchain import disassemble
from kfc.compile import compile_op
from kfc.frontend import parse_kfc
from kfc.ir.interpreter import run
from kfc.ir.tile_ops import DotOp
from kfc.ir.tile_ops.matmul import round_bf16
from kfc.model.target import parse_target
from kfc.passes import PassContext, PassManager, parse_pipeline

HALVES = """
op halves(h: bf16[B, 32, 32], e: bf16[B, 32, 16], f: f16[B, 16, 32], a: f32[B, 32, 32], w: f32[B, 32, 16])
        -> (p: f32[B, 32, 16], q: f32[B, 16, 16], s: f32[B, 16, 16], y: f32[B, 32, 16], z: f32[B, 32, 24]) {
  parallel b in 0..B {
    E = e[b, :, :]
    F = f[b, :, :]
    A = a[b, :, :]
    p[b, :, :] = dot(h[b, :, :], E)                 # bf16 tiles: m16n8k16 as they are
    q[b, :, :] = dot(F, F, trans_b=true)            # f16, B transposed
    s[b, :, :] = dot(E, E, trans_a=true)            # bf16, A transposed
    y[b, :, :] = dot(A, w[b, :, :])                 # f32, whole 16x8x16 tiles: bf16-dots rounds them
    z[b, :, :] = dot(A, a[b, :, 0:24])              # f32, 24 columns: whole 8-column tiles too
  }
}
check {
  reference = "(h.float() @ e.float(), f.float() @ f.float().mT, e.float().mT @ e.float(), a @ w, a @ a[..., :24])"
  tolerance = {f32: 2e-2}
  shapes = [{B: 3}, {B: 1}]
}
"""
BF16_PIPELINE = "canonicalize,cse,dce,hoist-loads,sink-stores,bf16-dots,tf32-dots"


def _lowered(text=HALVES, pipeline=BF16_PIPELINE):
    spec = parse_kfc(text)
    ctx = PassContext(target=parse_target("sm_90a"), check=spec.check)
    return spec, PassManager(parse_pipeline(pipeline), ctx).run(spec.func), ctx


def test_rounding_to_bf16_is_to_nearest_with_ties_to_even():
    ulp = 2.0 ** -7  # a bf16 unit at 1
    x = np.array([1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 1 + ulp / 2 + 2 ** -23, 1 + ulp / 2 - 2 ** -23,
                  2 - ulp / 4, np.finfo(np.float32).max, np.inf, -np.inf, 0.0, -0.0], dtype=np.float32)
    want = [1.0, 1 + 2 * ulp, -1.0, 1 + ulp, 1.0, 2.0, np.inf, np.inf, -np.inf, 0.0, -0.0]
    got = round_bf16(x)
    np.testing.assert_array_equal(got, np.array(want, dtype=np.float32))
    assert np.signbit(got[-1]) and np.isnan(round_bf16(np.array([np.nan], np.float32))).all()
    r = np.random.default_rng(0).standard_normal(10000).astype(np.float32)
    # ml_dtypes rounds to nearest even too: the same bits
    import ml_dtypes
    np.testing.assert_array_equal(round_bf16(r), r.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_the_pass_marks_f32_products_of_whole_16x8x16_tiles_and_leaves_the_rest_to_tf32_dots():
    _, func, ctx = _lowered()
    got = {tuple(op.result.ttype.shape) + (op.operands[0].ttype.dtype.name, op.trans_a, op.trans_b): op.precision
           for op in func.walk() if isinstance(op, DotOp)}
    assert got == {(32, 16, "BF16", False, False): "ieee", (16, 16, "F16", False, True): "ieee",
                   (16, 16, "BF16", True, False): "ieee", (32, 16, "F32", False, False): "bf16",
                   (32, 24, "F32", False, False): "bf16"}
    assert any("2 product(s) on tensor cores in BF16" in m for _, m in ctx.notes)
    # contraction 24: not whole k16 steps, so tf32-dots takes it
    _, func, _ = _lowered("""
op k24(a: f32[B, 32, 24], w: f32[B, 24, 16]) -> (y: f32[B, 32, 16]) {
  parallel b in 0..B {
    y[b, :, :] = dot(a[b, :, :], w[b, :, :])
  }
}
check {
  tolerance = {f32: 2e-2}
}
""")
    assert [op.precision for op in func.walk() if isinstance(op, DotOp)] == ["tf32"]


def test_an_op_checked_tighter_than_bf16_allows_keeps_its_products_for_tf32_dots():
    _, func, ctx = _lowered(HALVES.replace("f32: 2e-2", "f32: 1e-2"))
    assert {op.precision for op in func.walk() if isinstance(op, DotOp)
            and op.operands[0].ttype.dtype.name == "F32"} == {"tf32"}
    assert any("kept in f32: the op's outputs are checked to 0.01, BF16 operands need 0.02" in m for _, m in ctx.notes)


def test_bf16_products_in_the_interpreter_round_their_operands():
    spec, func, _ = _lowered()
    rng = np.random.default_rng(3)
    args = {n: rng.standard_normal(shape).astype(np.float32) for n, shape in
            (("h", (2, 32, 32)), ("e", (2, 32, 16)), ("f", (2, 16, 32)), ("a", (2, 32, 32)), ("w", (2, 32, 16)))}
    import ml_dtypes
    args["h"], args["e"] = args["h"].astype(ml_dtypes.bfloat16), args["e"].astype(ml_dtypes.bfloat16)
    args["f"] = args["f"].astype(np.float16)
    exact, rounded = run(spec.func, args), run(func, args)
    want = np.matmul(round_bf16(args["a"]), round_bf16(args["w"]))
    np.testing.assert_allclose(rounded["y"], want, rtol=1e-5, atol=1e-5)
    assert not np.array_equal(rounded["y"], exact["y"])
    assert np.abs(rounded["y"] - exact["y"]).max() < 3e-2 * np.abs(exact["y"]).max()
    for name in "pqs":  # 16-bit operands: exact products, nothing rounded
        np.testing.assert_array_equal(rounded[name], exact[name])


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_the_tile_emitter_writes_16_bit_products_on_m16n8k16(target):
    r = compile_op(parse_kfc(HALVES), parse_target(target), shape={"B": 4}, pipeline=BF16_PIPELINE)
    cu = r.kernel.cu
    assert cu.count("kfc_mma_bf16(kfc_c") == 4 and cu.count("kfc_mma_f16(kfc_c") == 1 and "kfc_mma_tf32(kfc_c" not in cu
    # a register holds a lane's two adjacent contraction elements, the lower in the low half:
    # read at once where they lie side by side in a 16-bit buffer (A as it is, B transposed) ...
    pairs = re.findall(r"\*reinterpret_cast<const unsigned\*>\(&kfc_s\d+\[\(\(kfc_[ij]\d+ \+ 0 \+ kfc_g\d+( \+ 8)?\) "
                       r"\* \d+ \+ \(kfc_k\d+ \+ 2 \* kfc_t\d+( \+ 8)?\)\)\]\)", cu)
    assert len(pairs) == 4 + 4 + 2  # the registers of p's A (bf16), of q's A and its B transposed (f16)
    # ... else packed from two, rounded where f32 (c + 1's element the high half)
    assert re.search(r"kfc_cvt_pack_bf16\(kfc_bf16_to_f32\(kfc_s\d+\[\(\(kfc_k\d+ \+ 2 \* kfc_t\d+ \+ 1\) \* ", cu)
    assert re.search(r"kfc_cvt_pack_bf16\(kfc_s\d+\[\(\(kfc_i\d+ \+ 0 \+ kfc_g\d+\) \* \d+ \+ "
                     r"\(kfc_k\d+ \+ 2 \* kfc_t\d+ \+ 1\)\)\], kfc_s\d+", cu)
    assert not r.kernel.report.spills
    sass = disassemble(r.kernel.cubin)
    assert "HMMA.16816.F32.BF16" in sass and "HMMA.16816.F32" in sass and "HMMA.1688" not in sass


def test_kfc_check_passes_the_final_ir_with_bf16_products(tmp_path):
    from kfc.cli import main
    path = tmp_path / "halves.kfc"
    path.write_text(HALVES)
    assert main(["check", str(path), "-p", BF16_PIPELINE]) == 0
    assert main(["check", str(path)]) == 0


def test_a_bf16_product_off_tensor_cores_rounds_its_operands_as_they_would():
    import attrs
    from kfc.codegen.tile_emitter import TileKernelEmitter
    from kfc.ir.rewrite import rebuild
    text = HALVES.replace("y[b, :, :] = dot(A, w[b, :, :])", "y[b, 0:24, :] = dot(a[b, 0:24, :], w[b, :, :])")
    _, func, _ = _lowered(text, "canonicalize,cse,dce")
    dot = next(op for op in func.walk() if isinstance(op, DotOp) and op.result.ttype.shape[0] == 24)
    forced = rebuild(func, lambda op, vmap: [attrs.evolve(op, precision="bf16")] if op is dot else None)
    code, _ = TileKernelEmitter(forced, "k").generate()
    assert "kfc_round_bf16(" in code
    # and nvcc/ptxas take it (kfc_round_bf16's cvt.rn.bf16.f32 among the definitions used)
    from kfc.codegen.cuda import generate_cuda
    from kfc.codegen.toolchain import compile_cuda
    cu, _ = generate_cuda(forced)
    assert "kfc_round_bf16(" in cu and "F2FP.BF16.F32.PACK_AB" in disassemble(compile_cuda(cu, "sm_90a").cubin)

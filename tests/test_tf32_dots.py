"""Products on tensor cores in tile kernels: the tf32-dots pass, tile.dot's tf32 precision in
the interpreter, and the tile emitter's mma.sync phases (kfc.codegen.tile_mma), built by
nvcc/ptxas for Hopper and Blackwell. What the GPU computes against the final IR is checked on the
GPU machine (tests/gpu/test_final_ir_gpu.py runs examples/linear_attention.kfc and the KDA
kernels)."""

import json
import re

import ml_dtypes
import numpy as np
import pytest

from kfc.cli import main
from kfc.codegen.tile_mma import MAX_BLOCK_TILES, WARPS, mma_block
from kfc.codegen.tile_plan import Buffer
from kfc.codegen.toolchain import disassemble
from kfc.compile import compile_op
from kfc.frontend import load_kfc, parse_kfc
from kfc.ir.interpreter import run
from kfc.ir.tile_ops import DotOp
from kfc.ir.tile_ops.matmul import round_tf32
from kfc.ir.printer import print_ir
from kfc.model.target import parse_target
from kfc.passes import PassContext, PassManager, parse_pipeline
from kfc.proof import lower_stages

PRODUCTS = """
op products(a: f32[B, 32, 24], w: f32[B, 24, 16], c: f32[B, 16, 24], e: f32[B, 24, 12], h: bf16[B, 16, 16])
        -> (y: f32[B, 32, 16], z: f32[B, 24, 24], u: f32[B, 16, 16], x: f32[B, 16, 12], p: f32[B, 16, 16]) {
  parallel b in 0..B {
    A = a[b, :, :]
    W = w[b, :, :]
    C = c[b, :, :]
    y[b, :, :] = dot(A, W)                          # 32 x 16 x 24: on tensor cores
    z[b, :, :] = dot(A, A, trans_a=true)            # 24 rows: not whole 16-row tiles
    u[b, :, :] = dot(C, C, trans_b=true)            # 16 x 16 x 24, B transposed
    x[b, :, :] = dot(C, e[b, :, :])                 # 12 columns: not whole 8-column tiles
    p[b, :, :] = f32(dot(h[b, :, :], h[b, :, :]))   # bf16 operands: exact already, left alone
  }
}
check {
  tolerance = {f32: 5e-3}
}
"""


def test_rounding_to_tf32_is_to_nearest_with_ties_to_even_and_keeps_infinities_and_nans():
    one = np.float32(1.0)
    ulp = 2.0 ** -10  # a TF32 unit at 1
    x = np.array([1 + ulp / 2, -(1 + ulp / 2), 1 + 3 * ulp / 2, -(1 + 3 * ulp / 2), 1 + ulp / 4, 1 + 3 * ulp / 4,
                  1 + ulp / 2 + 2 ** -23, 1 + ulp / 2 - 2 ** -23, 2 - ulp / 4,
                  np.inf, -np.inf, np.finfo(np.float32).max, 0.0, -0.0], dtype=np.float32)
    got = round_tf32(x)
    want = [one, -one, 1 + 2 * ulp, -(1 + 2 * ulp), one, 1 + ulp, 1 + ulp, one, 2.0,
            np.inf, -np.inf, np.inf, 0.0, -0.0]
    np.testing.assert_array_equal(got, np.array(want, dtype=np.float32))
    assert np.signbit(got[-1])
    nans = np.array([np.nan, -np.nan], dtype=np.float32).view(np.uint32) | np.uint32(0x1FFF)
    assert np.isnan(round_tf32(nans.view(np.float32))).all()
    # every result has the low 13 mantissa bits clear and lies within half a TF32 unit
    r = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 1e3
    t = round_tf32(r)
    assert not (t.view(np.uint32) & np.uint32(0x1FFF)).any()
    assert (np.abs(t - r) <= np.abs(r) * 2.0 ** -11).all()


def _lowered(text=PRODUCTS, pipeline="canonicalize,cse,dce,tf32-dots"):
    spec = parse_kfc(text)
    ctx = PassContext(target=parse_target("sm_90a"), check=spec.check)
    return spec, PassManager(parse_pipeline(pipeline), ctx).run(spec.func), ctx


def test_the_pass_marks_the_f32_products_of_whole_16x8x8_tiles_and_nothing_else():
    _, func, ctx = _lowered()
    assert sorted(op.precision for op in func.walk() if isinstance(op, DotOp)) == ["ieee", "ieee", "ieee", "tf32", "tf32"]
    by_operands = {(op.operands[0].ttype.dtype.name, op.trans_b, tuple(op.result.ttype.shape)): op.precision
                   for op in func.walk() if isinstance(op, DotOp)}
    assert by_operands[("F32", False, (32, 16))] == "tf32" and by_operands[("F32", True, (16, 16))] == "tf32"
    assert by_operands[("F32", False, (16, 12))] == "ieee" and by_operands[("BF16", False, (16, 16))] == "ieee"
    assert any("2 product(s) on tensor cores" in m for _, m in ctx.notes)


def test_an_op_checked_tighter_than_tf32_allows_keeps_its_products_in_f32():
    _, func, ctx = _lowered(PRODUCTS.replace("f32: 5e-3", "f32: 1e-3"))
    assert all(op.precision == "ieee" for op in func.walk() if isinstance(op, DotOp))
    assert any("2 product(s) kept in f32: the op's outputs are checked to 0.001" in m for _, m in ctx.notes)
    # chunk_solve checks its f32 outputs to the default 1e-5: no tensor cores there
    r = compile_op(load_kfc("examples/chunk_solve.kfc"), parse_target("sm_90a"), shape={"B": 2, "D": 40})
    assert "kfc_mma_tf32" not in r.kernel.cu


def test_tf32_products_in_the_interpreter_round_their_operands():
    spec, func, _ = _lowered()
    rng = np.random.default_rng(3)
    args = {"a": rng.standard_normal((2, 32, 24)).astype(np.float32), "w": rng.standard_normal((2, 24, 16)).astype(np.float32),
            "c": rng.standard_normal((2, 16, 24)).astype(np.float32), "e": rng.standard_normal((2, 24, 12)).astype(np.float32),
            "h": rng.standard_normal((2, 16, 16)).astype(ml_dtypes.bfloat16)}
    exact, tf32 = run(spec.func, args)["y"], run(func, args)["y"]
    want = np.matmul(round_tf32(args["a"]), round_tf32(args["w"]))
    np.testing.assert_allclose(tf32, want, rtol=1e-5, atol=1e-5)
    assert not np.array_equal(tf32, exact)  # the rounding is not a no-op ...
    assert np.abs(tf32 - exact).max() < 1e-2 * np.abs(exact).max()  # ... and stays within TF32's reach
    # operands already TF32 values give the exact product
    args = {**args, "a": round_tf32(args["a"]), "w": round_tf32(args["w"])}
    np.testing.assert_allclose(run(func, args)["y"], run(spec.func, args)["y"], rtol=1e-6, atol=1e-6)


def test_precision_is_printed_parsed_and_verified():
    _, func, _ = _lowered()
    from kfc.ir.parser import parse_ir
    from kfc.ir.printer import print_ir
    from kfc.ir.verifier import verify
    text = print_ir(func)
    assert text.count('precision = "tf32"') == 2
    assert print_ir(parse_ir(text)) == text
    bad = text.replace('precision = "tf32"', 'precision = "fp8"', 1)
    with pytest.raises(Exception, match="precision 'fp8' is not one of ieee, tf32, tf32x3, bf16"):
        verify(parse_ir(bad))


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_the_tile_emitter_writes_marked_products_as_mma_sync_phases(target):
    r = compile_op(parse_kfc(PRODUCTS), parse_target(target), shape={"B": 4})
    cu = r.kernel.cu
    # the two tf32 products, and the bf16 one on m16n8k16 as it is (tests/test_mma_16bit.py)
    assert cu.count("][4] = {};") == 3 and "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in cu
    assert cu.count("kfc_mma_tf32(kfc_c") == 2 and cu.count("kfc_mma_bf16(kfc_c") == 1
    # rounded at fragment loads (or once where a buffer only products read is stored), never in a scalar loop
    assert "kfc_tf32_bits(" in cu and "fmaf(kfc_round_tf32" not in cu
    assert "tf32-dots" in r.report["pipeline"] and not r.kernel.report.spills
    sass = disassemble(r.kernel.cubin)
    assert "HMMA.1688.F32.TF32" in sass
    # operands rounded by one cvt.rn.tf32.f32 each, never by masking bits
    assert "F2FP.TF32.F32" in sass and "0xffffe000" not in sass


def test_a_product_summed_into_a_carried_tile_is_written_from_its_accumulators():
    spec = load_kfc("examples/linear_attention.kfc")
    r = compile_op(spec, parse_target("sm_90a"))
    cu = r.kernel.cu
    assert cu.count("][4] = {};") == 4  # a product phase an accumulator block
    # S = S + dot(kc, vc, trans_a): each accumulator read by S's update, in place, no buffer
    # (every value computed before any is stored, a pair of columns in one 8-byte store)
    update = re.findall(r"const float (kfc_x\d+) = \((kfc_s\d+)\[[^;]*\] \+ kfc_c\d+\[0\]\[\d\]\);", cu)
    assert len(update) == 4 and len({buf for _, buf in update}) == 1
    (state,) = {buf for _, buf in update}
    stores = re.findall(r"reinterpret_cast<float2\*>\(&(kfc_s\d+)\[[^;]*make_float2\((kfc_x\d+), (kfc_x\d+)\)", cu)
    assert {x for _, *pair in stores for x in pair} >= {x for x, _ in update} and {b for b, *_ in stores} == {state}


def test_a_tf32_product_off_tensor_cores_rounds_its_operands_as_they_would():
    spec, func, _ = _lowered()
    dot = next(op for op in func.walk() if isinstance(op, DotOp) and op.precision == "ieee"
               and op.operands[0].ttype.dtype.name == "F32")
    import attrs
    from kfc.codegen.tile_emitter import TileKernelEmitter
    from kfc.ir.rewrite import rebuild
    forced = rebuild(func, lambda op, vmap: [attrs.evolve(op, precision="tf32")] if op is dot else None)
    code, _ = TileKernelEmitter(forced, "k").generate()
    assert "kfc_round_tf32(" in code


def test_skewed_pitches_put_a_fragment_load_in_32_distinct_banks():
    g, t = np.meshgrid(np.arange(8), np.arange(4), indexing="ij")
    for last in (8, 16, 24, 128):
        a = Buffer("s", "float", (16, last), 0, 0, skew=4)
        b = Buffer("s", "float", (16, last), 0, 0, skew=8)
        assert a.pitch >= last and b.pitch >= last
        assert len(set(((g * a.pitch + t) % 32).ravel())) == 32  # A: rows across g, columns across t
        assert len(set(((t * b.pitch + g) % 32).ravel())) == 32  # B: rows across t, columns across g


def test_kda_at_a_chunk_of_64_falls_back_to_products_off_tensor_cores_to_fit(tmp_path, shared_memory_form):
    assert main(["compile", "kernels/kda_fwd_flashkda.kfc", "--dtype", "C=64", "--shape", "T=4096,K=128,V=128",
                 "-o", str(tmp_path / "c64")]) == 0
    report = json.loads((tmp_path / "c64" / "report.json").read_text())
    # approx-math kept, and every approximation its own (no TF32 rounding)
    assert report["pipeline"] == "approx-math,canonicalize,cse,dce,hoist-loads" and report["approximations"]
    assert all(a["pass"] == "approx-math" for a in report["approximations"])
    assert any("the products on tensor cores and the stores together needed" in n for n in report["pass_notes"])
    # and the final IR kfc check interprets (and tests/gpu compares the GPU with) is that one
    spec = load_kfc("kernels/kda_fwd_flashkda.kfc", {"C": "64"})
    stages = lower_stages(spec, parse_target("sm_90a"), None, {"N": 2, "T": 160, "H": 1, "K": 128, "V": 128})
    assert stages.pipeline == "approx-math,canonicalize,cse,dce,hoist-loads"
    assert "tf32" not in print_ir(stages.stages[-1][1])
    names = [name for name, _ in stages.stages]
    assert names[-5:] == ["approx-math", "canonicalize", "cse", "dce", "hoist-loads"] and "tf32-dots" not in names
    assert names.count("dce") == 1
    assert main(["compile", "kernels/kda_fwd_flashkda.kfc", "--dtype", "C=16", "--shape", "T=4096,K=128,V=128",
                 "-o", str(tmp_path / "c16")]) == 0
    report = json.loads((tmp_path / "c16" / "report.json").read_text())
    assert report["pipeline"].endswith("tf32-dots") and report["kernels"][0]["smem_dynamic_bytes"] <= 232448
    assert (tmp_path / "c16" / "kda_fwd_flashkda.cu").read_text().count("][4] = {};") == 5


def test_kfc_passes_names_the_tile_programs_default(capsys):
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    assert ("default pipeline for other tile programs: approx-math,canonicalize,cse,dce,hoist-loads,sink-stores,"
            "tf32-dots (without tf32-dots where") in out
    assert any(line.startswith("tf32-dots ") for line in out.splitlines())


@pytest.mark.parametrize("tiles_m, tiles_n, block", [
    (1, 16, (1, 2)),    # a 16-row product over 128 columns: two tiles a warp, one A fragment for both
    (8, 16, (2, 8)),    # KDA's state update: 16 tiles a warp, 2 A and 8 B fragments a step
    (2, 2, (1, 1)),     # fewer tiles than warps: one each
    (16, 16, (2, 8)),   # more than a block's worth a warp: the block stays at 16 tiles
    (3, 5, (1, 1)),
])
def test_a_warp_takes_a_block_of_tiles_that_keeps_every_warp_busy(tiles_m, tiles_n, block):
    bm, bn = mma_block(tiles_m, tiles_n)
    assert (bm, bn) == block
    assert tiles_m % bm == 0 and tiles_n % bn == 0 and bm * bn <= MAX_BLOCK_TILES
    assert (tiles_m // bm) * (tiles_n // bn) >= min(WARPS, tiles_m * tiles_n)


def test_a_buffer_only_products_read_is_stored_rounded_and_loaded_without_rounding_again(shared_memory_form):
    """KDA's recurrence: w, qg, kg and aqk (loaded) and U (u - w S, written from w S's
    accumulators) are read by products alone, so each is rounded to TF32 once as it is stored
    and its fragments are loaded as they are; the
    state S, also read elementwise by its update and carried, keeps its values and is rounded at
    each fragment load. Rounding twice gives the bits rounding once does, so what the GPU
    computes does not change."""
    r = compile_op(load_kfc("kernels/kda_recurrence.kfc", {"C": "16"}), parse_target("sm_90a"),
                   shape={"T": 4096, "K": 128, "V": 128})
    cu = _groups_inlined(r.kernel.cu)
    rounded = set(re.findall(r"(kfc_s\d+)\[[^;]*\]\) = \{kfc_round_tf32\(", cu))
    held = set(re.findall(r"__float_as_uint\((kfc_s\d+)\[", cu))
    again = set(re.findall(r"kfc_tf32_bits\((kfc_s\d+)\[", cu))
    temps = set(re.findall(r"const float (kfc_x\d+) = kfc_round_tf32\(", cu))
    pairs = re.findall(r"reinterpret_cast<float2\*>\(&(kfc_s\d+)\[[^;]*\]\) = make_float2\((kfc_x\d+),", cu)
    from_products = {b for b, x in pairs if x in temps}
    assert len(rounded) == 4 and len(from_products) == 1 and held == rounded | from_products
    state = re.search(r"p_ht\[[^;]*\]\) = \{(kfc_s\d+)\[", cu).group(1)
    assert again == {state} and state not in rounded


def _groups_inlined(cu: str) -> str:
    """The kernel with each group of lanes stored as one access (kfc.codegen.tile_writes) written
    as `target) = {values...}`, its temporary array replaced by the values it holds."""
    temps = dict(re.findall(r"alignas\(16\) \w+ (kfc_w\d+)\[\d+\] = (\{.*\});", cu))
    return re.sub(r"\*reinterpret_cast<const \w+\*>\((kfc_w\d+)\);", lambda m: temps[m.group(1)] + ";", cu)


def test_products_sharing_their_b_are_written_in_one_phase_from_the_same_fragments(shared_memory_form):
    """KDA's recurrence: U = u - w S and o = qg S + aqk U read S's fragments alike; w S's phase
    writes qg S too (qg is stored by then), one accumulator block each, B's fragments loaded once
    a step for both. Each product still sums its own terms in the same order: the same results."""
    r = compile_op(load_kfc("kernels/kda_recurrence.kfc", {"C": "16"}), parse_target("sm_90a"),
                   shape={"T": 4096, "K": 128, "V": 128})
    cu = r.kernel.cu
    assert len(re.findall(r"float kfc_c\d+\[(\d+)\]\[4\] = \{\};", cu)) == 3  # S's two products, aqk U, kg^T U
    phase = cu.split("[4][4] = {};", 1)[1].split("__syncthreads();", 1)[0]
    assert phase.count("kfc_tf32_bits(") == 4 and phase.count("kfc_mma_tf32(") == 4  # B of 2 tiles, 2 products
    # into two buffers (two columns in one 8-byte store where the rows allow)
    stores = r"\n\s+(?:\*reinterpret_cast<float2\*>\(&)?(kfc_s\d+)\[[^\n]*\]\)? = (?:kfc_|make_float2)"
    assert len(set(re.findall(stores, phase))) == 2
    assert not r.kernel.report.spills

"""The matrix product on tensor cores (accelerate-matmul, kfc.ir.mma_ops, kfc.codegen.mma_rules)
without a GPU: the lowered IR against the tile program in the interpreter at odd shapes, the
hazards the interpreter and verifier catch in planted faults, the build for sm_90a (HGMMA and
UTMALDG in the SASS, no serialised wgmma) and the target's variant chosen from the features."""

from __future__ import annotations

import ml_dtypes
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
from kfc.ir.mma_ops import CopyStageOp, ExpectTxAtOp, FenceProxyAsyncOp, GridOp, MbarrierWaitParityOp, TensorMapOp
from kfc.ir.mma_ops import WgmmaWaitOp
from kfc.ir.ptx_ops import TanhApproxOp
from kfc.ir.specialize import specialize
from kfc.passes import MATMUL_PIPELINE, PassContext, PassManager, parse_pipeline
from kfc.model.target import parse_target

EPILOGUE = """
op gemm_relu(a: bf16[M, K], b: bf16[K, N], scale: f32 = 0.5) -> (c: f32[M, N]) {
  c = max(dot(a, b) * scale, 0.0)
}
"""


def lowered(spec, dims, pipeline=MATMUL_PIPELINE):
    func = specialize(spec.func, dims)
    return func, PassManager(parse_pipeline(pipeline), PassContext(target=parse_target("sm_90a"))).run(func)


def operands(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16),
            "b": rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)}


SMALL = "accelerate-matmul{bn=64,stages=2}"


@pytest.mark.parametrize("m,n,k,pipe", [
    (1, 8, 8, SMALL), (33, 72, 24, SMALL), (100, 72, 136, SMALL),  # K not a multiple of bk
    (130, 264, 200, "accelerate-matmul"),                             # the default tiles and 4 stages
    (64, 128, 256, "accelerate-matmul{bm=64,bn=128,bk=128,stages=3}"),
])
def test_the_lowered_program_computes_the_product(m, n, k, pipe):
    func, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": m, "N": n, "K": k}, f"canonicalize,{pipe},cse,dce")
    args = operands(m, n, k)
    want = run(func, args)["c"].astype(np.float32)
    got = run(low, args)["c"].astype(np.float32)
    assert not np.isnan(got).any(), "an output element was never stored"
    # the same f32 products summed in another order, then rounded to bf16: one bf16 step apart at most
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-2)


def test_the_epilogue_runs_on_the_accumulator():
    spec = parse_kfc(EPILOGUE, "gemm_relu.kfc")
    func, low = lowered(spec, {"M": 70, "N": 72, "K": 40}, f"canonicalize,{SMALL},cse,dce")
    grid = next(op for op in low.body.ops if isinstance(op, GridOp))
    assert [op for op in low.body.ops if op.NAME.startswith("tile.") and op.NAME != "tile.const"] == []
    assert any(op.NAME == "tile.max" for op in grid.walk())
    args = operands(70, 72, 40, seed=3)
    want = np.maximum((args["a"].astype(np.float32) @ args["b"].astype(np.float32)) * 0.5, 0)
    np.testing.assert_allclose(run(low, args)["c"], want, rtol=1e-5, atol=1e-4)


def test_the_lowered_ir_prints_and_parses_back():
    _, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": 64, "N": 64, "K": 64}, f"canonicalize,{SMALL}")
    text = print_ir(low)
    assert print_ir(verify(parse_ir(text))) == text


def _rewrite(func, fn):
    """func with fn applied to every block of the grid (a planted fault)."""
    def block(b: Block) -> Block:
        ops = []
        for op in b.ops:
            if op.regions:
                op = op.evolve(regions=tuple(block(r) for r in op.regions))
            ops.extend(fn(op))
        return Block(b.args, ops)

    return func.evolve(regions=(block(func.body),))


def _small():
    return lowered(load_kfc("kernels/gemm.kfc"), {"M": 64, "N": 64, "K": 256}, f"canonicalize,{SMALL}")[1]


def test_a_missing_expect_tx_is_a_deadlock_at_the_wait():
    bad = _rewrite(_small(), lambda op: [] if isinstance(op, ExpectTxAtOp) else [op])
    with pytest.raises(InterpretError, match="deadlock: waits on %full"):
        run(bad, operands(64, 64, 256))


def test_refilling_a_stage_before_its_wgmma_retired_is_a_hazard():
    # the k loop's wait goes: the refill after it overwrites a stage the last wgmma still reads
    def no_loop_wait(op):
        if op.NAME == "tile.for" and any(isinstance(o, WgmmaWaitOp) for o in op.body.ops):
            return [op.evolve(regions=(Block(op.body.args, [o for o in op.body.ops
                                                            if not isinstance(o, WgmmaWaitOp)]),))]
        return [op]

    bad = _rewrite(_small(), no_loop_wait)
    with pytest.raises(InterpretError, match="overwrites stage .* while a wgmma reading it is in flight"):
        run(bad, operands(64, 64, 256))


def test_a_wait_with_the_wrong_parity_is_a_hazard():
    def flip(op):
        if isinstance(op, MbarrierWaitParityOp):
            return [op.evolve(operands=(op.operands[0], op.operands[1], op.operands[1]))]  # the stage as parity
        return [op]

    with pytest.raises(InterpretError, match="parity"):
        run(_rewrite(_small(), flip), operands(64, 64, 256))


def _drop(kind):
    return lambda op: [] if isinstance(op, kind) else [op]


def _no_loop_wgmma_wait(op):
    if op.NAME == "tile.for" and any(isinstance(o, WgmmaWaitOp) for o in op.body.ops):
        return [op.evolve(regions=(Block(op.body.args, [o for o in op.body.ops if not isinstance(o, WgmmaWaitOp)]),))]
    return [op]


def _stage_as_parity(op):
    if isinstance(op, MbarrierWaitParityOp):
        return [op.evolve(operands=(op.operands[0], op.operands[1], op.operands[1]))]
    return [op]


PLANTED = {  # fault: (the program with it, what both the interpreter and the static check say)
    "missing expect-tx": (lambda: _rewrite(_small(), _drop(ExpectTxAtOp)), "deadlock: waits on %full"),
    "stage reused before its wgmma retired": (lambda: _rewrite(_small(), _no_loop_wgmma_wait),
                                              "overwrites stage .* while a wgmma reading it is in flight"),
    "wait with the wrong parity": (lambda: _rewrite(_small(), _stage_as_parity), "parity"),
    "copy never waited for": (lambda: _rewrite(_small(), _drop(MbarrierWaitParityOp)),
                              "reads stage .* while the copy into it is in flight"),
    "unfenced thread copies": (lambda: _rewrite(lowered(load_kfc("kernels/gemm.kfc"), {"M": 33, "N": 65, "K": 17},
                                                        "canonicalize,accelerate-matmul{bn=64}")[1],
                                                _drop(FenceProxyAsyncOp)), "before a gpu.fence_proxy_async"),
}


@pytest.mark.parametrize("fault", sorted(PLANTED))
def test_the_barrier_check_proves_the_grid_protocol_statically(fault):
    build, message = PLANTED[fault]
    with pytest.raises(VerifyError, match=message):
        verify(build())


def test_the_barrier_check_accepts_every_lowering_it_is_given():
    for dims, pipe in [({"M": 64, "N": 64, "K": 256}, SMALL), ({"M": 300, "N": 520, "K": 1000}, "accelerate-matmul"),
                       ({"M": 33, "N": 65, "K": 17}, "accelerate-matmul{bn=64}"),
                       ({"M": 64, "N": 128, "K": 640}, "accelerate-matmul{bm=64,bn=128,bk=128,stages=3}")]:
        verify(lowered(load_kfc("kernels/gemm.kfc"), dims, f"canonicalize,{pipe}")[1])


def test_a_stage_chosen_by_the_program_id_is_refused_by_the_barrier_check():
    low = _small()
    pm = next(op for op in low.walk() if isinstance(op, GridOp)).body.args[0]
    bad = _rewrite(low, lambda o: [o.evolve(operands=(o.operands[0], pm))] if isinstance(o, ExpectTxAtOp) else [o])
    with pytest.raises(VerifyError, match="cannot follow this program: .* program id"):
        verify(bad)


def test_a_wrong_swizzle_is_refused_by_the_verifier():
    def swizzle64(op):
        if isinstance(op, TensorMapOp):
            t = op.result.ttype
            layout = type(t.layout)("tensor_map", (("rows", op.box[0]), ("cols", op.box[1]), ("swizzle", 64)))
            return [op.evolve(swizzle=64, results=(type(op.result)(t.__class__(t.dtype, t.shape, t.space, layout),
                                                                    op.result.name),))]
        return [op]

    with pytest.raises(VerifyError, match="swizzle"):
        verify(_rewrite(_small(), swizzle64))


def test_tma_asked_for_a_row_pitch_it_cannot_take_is_refused_with_what_to_do():
    with pytest.raises(KfcError, match="multiple of 16 bytes") as e:
        compile_op(load_kfc("kernels/gemm.kfc"), parse_target("sm_90a"), shape={"M": 1, "N": 7, "K": 5},
                   pipeline="canonicalize,accelerate-matmul{copy=tma}")
    assert "copy at auto" in (e.value.hint or "") and "pad" in e.value.hint


@pytest.mark.parametrize("m,n,k,pipe", [
    (1, 7, 5, "accelerate-matmul{bn=64}"), (33, 65, 17, "accelerate-matmul{bn=64}"),
    (70, 100, 130, "accelerate-matmul"),                    # K over two k-tiles, a partial last one
    (130, 264, 200, "accelerate-matmul{copy=threads}"),     # aligned pitches, copied by the threads all the same
])
def test_the_threads_copy_path_computes_the_product(m, n, k, pipe):
    func, low = lowered(load_kfc("kernels/gemm.kfc"), {"M": m, "N": n, "K": k}, f"canonicalize,{pipe},cse,dce")
    assert any(isinstance(op, CopyStageOp) for op in low.walk()) and not any(
        isinstance(op, TensorMapOp) for op in low.walk())
    args = operands(m, n, k)
    want = run(func, args)["c"].astype(np.float32)
    got = run(low, args)["c"].astype(np.float32)
    assert not np.isnan(got).any(), "an output element was never stored"
    np.testing.assert_allclose(got, want, rtol=2 ** -7, atol=1e-2)


def test_a_wgmma_reading_copies_no_fence_made_visible_is_a_hazard():
    low = lowered(load_kfc("kernels/gemm.kfc"), {"M": 33, "N": 65, "K": 17}, "canonicalize,accelerate-matmul{bn=64}")[1]
    bad = _rewrite(low, lambda op: [] if isinstance(op, FenceProxyAsyncOp) else [op])
    with pytest.raises(InterpretError, match="before a gpu.fence_proxy_async"):
        run(bad, operands(33, 65, 17))


def test_odd_pitches_compile_to_hgmma_without_tma():
    r = compile_op(load_kfc("kernels/gemm.kfc"), parse_target("sm_90a"), shape={"M": 4095, "N": 4097, "K": 127})
    sass = disassemble(r.kernel.cubin)
    assert "HGMMA.64x256x16.F32.BF16" in sass and "UTMALDG" not in sass
    assert r.report["features"] == ["wgmma"] and r.kernel.report.spills == 0
    assert "C7514" not in r.kernel.ptxas_log, "ptxas serialised the wgmmas"
    assert any("copied by the threads" in note for note in r.report["pass_notes"])


@pytest.fixture(scope="module")
def gemm_4096():
    return compile_op(load_kfc("kernels/gemm.kfc"), parse_target("sm_90a"))


def test_gemm_compiles_for_sm90a_to_hgmma_and_utmaldg(gemm_4096):
    r = gemm_4096
    assert r.arch == "sm_90a" and r.report["features"] == ["mbarrier", "tma", "wgmma"]
    sass = disassemble(r.kernel.cubin)
    assert "HGMMA.64x256x16.F32.BF16" in sass and "UTMALDG.2D" in sass
    assert "C7514" not in r.kernel.ptxas_log, "ptxas serialised the wgmmas"
    assert r.kernel.report.spills == 0
    [entry] = r.report["kernels"]
    assert entry["grid"] == ["512", "1", "1"] and entry["block"] == [384, 1, 1], "a producer warpgroup and two MMA ones"
    assert [(p["kind"], p["name"]) for p in entry["params"]] == \
        [("tensor", "a"), ("tensor", "b"), ("tensor", "c"), ("tensor_map", "c"), ("tensor_map", "a"), ("tensor_map", "b")]
    assert "UTMASTG" in sass, "the default stores its tiles by TMA (store=auto)"


def test_a_plain_target_is_built_for_its_arch_specific_variant_and_says_so(capsys):
    r = compile_op(load_kfc("kernels/gemm.kfc"), parse_target("sm_90"), shape={"M": 128, "N": 256, "K": 64})
    assert r.arch == "sm_90a" and r.report["target"] == "sm_90"
    assert any("built for sm_90a, not sm_90: the kernel uses wgmma" in n for n in r.report["pass_notes"])


def test_the_epilogue_gemm_is_one_kernel_for_sm90a(tmp_path):
    spec = parse_kfc(EPILOGUE, str(tmp_path / "gemm_relu.kfc"))
    r = compile_op(spec, parse_target("sm_90a"), shape={"M": 256, "N": 512, "K": 128})
    assert len(r.report["kernels"]) == 1
    assert "HGMMA" in disassemble(r.kernel.cubin)


def test_a_bias_along_the_columns_is_read_for_the_tile_and_added_in_the_kernel():
    spec = load_kfc("kernels/gemm_bias_relu.kfc")
    func, low = lowered(spec, {"M": 100, "N": 72, "K": 40}, f"canonicalize,{SMALL},cse,dce")
    assert [op.NAME for op in low.body.ops] == ["gpu.grid"]
    assert any(op.NAME == "gpu.load_columns" for op in low.walk())
    args = {**operands(100, 72, 40, seed=5), "bias": np.random.default_rng(6).standard_normal(72).astype(np.float32)}
    want = run(func, args)["c"].astype(np.float32)
    np.testing.assert_allclose(run(low, args)["c"].astype(np.float32), want, rtol=2 ** -7, atol=1e-2)
    r = compile_op(spec, parse_target("sm_90a"), shape={"M": 256, "N": 512, "K": 128})
    assert len(r.report["kernels"]) == 1 and "HGMMA" in disassemble(r.kernel.cubin)


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_an_optional_bias_left_out_reads_as_zeros_in_the_interpreter_and_the_kernel(target):
    """`bias: f32[N]?`: the lowered program run without it equals the product alone (the
    interpreter read None as a vector, an internal error), and the kernel tests the pointer
    before it reads (the runtime passes a null pointer for an input left out)."""
    spec = parse_kfc("""
op opt_bias(a: bf16[M, K], b: bf16[K, N], bias: f32[N]?) -> (c: bf16[M, N]) {
  c = bf16(dot(a, b) + bias)
}
""", "opt_bias.kfc")
    func, low = lowered(spec, {"M": 100, "N": 72, "K": 40}, f"canonicalize,{SMALL},cse,dce")
    args = operands(100, 72, 40, seed=5)
    np.testing.assert_allclose(run(low, {**args, "bias": None})["c"].astype(np.float32),
                               run(func, {**args, "bias": None})["c"].astype(np.float32), rtol=2 ** -7, atol=1e-2)
    r = compile_op(spec, parse_target(target), shape={"M": 256, "N": 512, "K": 128})
    assert "__ldg(&p_bias[" in r.kernel.cu and r.kernel.cu.count("p_bias != nullptr && ") >= 1


@pytest.mark.parametrize("target", ["sm_90a", "sm_100a"])
def test_a_16_bit_bias_is_read_through_its_bits(target):
    """`bias: f16[N]` added to the product: __ldg has no overload for kfc's 16-bit float types,
    so the kernel reads the vector's bits (nvcc refused the generated kernel before)."""
    spec = parse_kfc("""
op g(a: f16[M, K], b: f16[K, N], bias: f16[N]) -> (c: f16[M, N]) {
  c = f16(dot(a, b)) + bias
}
""", "g.kfc")
    r = compile_op(spec, parse_target(target), shape={"M": 256, "N": 256, "K": 64})
    assert "kfc_f16_of_bits(__ldg(reinterpret_cast<const unsigned short*>(&p_bias[" in r.kernel.cu


def test_a_tensor_the_epilogue_cannot_read_is_refused_by_name(tmp_path):
    """A residual (a whole [M, N] tensor beside the product) is not one the epilogue reads yet."""
    spec = parse_kfc("""
op residual(a: bf16[M, K], b: bf16[K, N], r: f32[M, N]) -> (c: f32[M, N]) {
  c = dot(a, b) + r
}
""", str(tmp_path / "residual.kfc"))
    with pytest.raises(KfcError, match=r"cannot generate code for residual yet: the matrix-product kernel cannot "
                       r"take the residual 'r' \[64, 64\] \(a tensor the size of the product\)") as e:
        compile_op(spec, parse_target("sm_90a"), shape={"M": 64, "N": 64, "K": 64})
    assert "tile." not in e.value.message and "second op" in e.value.hint


TRANSPOSED = {
    (True, False): "op g(a: bf16[K, M], b: bf16[K, N]) -> (c: bf16[M, N]) {\n  c = bf16(dot(a, b, trans_a=true))\n}\n",
    (False, True): "op g(a: bf16[M, K], b: bf16[N, K]) -> (c: bf16[M, N]) {\n  c = bf16(dot(a, b, trans_b=true))\n}\n",
    (True, True): "op g(a: f16[K, M], b: f16[N, K]) -> (c: f32[M, N]) {\n"
                  "  c = dot(a, b, trans_a=true, trans_b=true)\n}\n",
}


@pytest.mark.parametrize("trans", TRANSPOSED, ids=["trans_a", "trans_b", "trans_ab_f16_f32"])
@pytest.mark.parametrize("m,n,k", [(33, 65, 17), (130, 264, 200)])
def test_transposed_operands_are_copied_transposed_by_the_threads(trans, m, n, k):
    spec = parse_kfc(TRANSPOSED[trans], "g.kfc")
    func, low = lowered(spec, {"M": m, "N": n, "K": k}, "canonicalize,accelerate-matmul,cse,dce")
    copies = [op for op in low.walk() if isinstance(op, CopyStageOp)]
    assert {op.transpose for op in copies if op.operands[0].name == "a"} == {trans[0]}
    assert {op.transpose for op in copies if op.operands[0].name == "b"} == {trans[1]}
    rng = np.random.default_rng(m + n + k)
    dt = ml_dtypes.bfloat16 if not all(trans) else np.float16
    a = rng.standard_normal((k, m) if trans[0] else (m, k)).astype(dt)
    b = rng.standard_normal((n, k) if trans[1] else (k, n)).astype(dt)
    ref = (a.astype(np.float32).T if trans[0] else a.astype(np.float32)) @ \
        (b.astype(np.float32).T if trans[1] else b.astype(np.float32))
    got = run(low, {"a": a, "b": b})["c"].astype(np.float32)
    np.testing.assert_allclose(got, ref, rtol=2 ** -7, atol=2e-2)


def test_tma_asked_for_transposed_operands_is_refused():
    with pytest.raises(KfcError, match="not transposed") as e:
        compile_op(parse_kfc(TRANSPOSED[(False, True)], "g.kfc"), parse_target("sm_90a"),
                   shape={"M": 128, "N": 256, "K": 64}, pipeline="canonicalize,accelerate-matmul{copy=tma}")
    assert "copy at auto" in e.value.hint


def test_f16_operands_and_an_f32_result_transposed_compile_to_hgmma():
    r = compile_op(parse_kfc(TRANSPOSED[(True, True)], "g.kfc"), parse_target("sm_90a"),
                   shape={"M": 256, "N": 512, "K": 192})
    sass = disassemble(r.kernel.cubin)
    assert "HGMMA.64x256x16.F32" in sass
    assert "HGMMA.64x256x16.F32.BF16" not in sass, "f16 operands"
    assert r.kernel.report.spills == 0 and "C7514" not in r.kernel.ptxas_log


def test_an_epilogue_tanh_is_approximated_only_where_the_outputs_precision_hides_it():
    """approx=auto (the default): tanh.approx (error about 2^-11) for a bf16 output checked at
    1e-2; an f32 output keeps tanhf, as does approx=off."""
    spec = load_kfc("kernels/gemm_bias_gelu.kfc")
    auto = "canonicalize,cse,dce,accelerate-matmul{producer=warpgroup,inflight=1,store=auto,approx=auto}"
    r = compile_op(spec, parse_target("sm_90a"), shape={"M": 64, "N": 128, "K": 64})
    assert [a["what"] for a in r.report["approximations"]] == ["tanh.approx for tanh"]
    assert "tanh.approx.f32" in r.kernel.cu and "MUFU.TANH" in disassemble(r.kernel.cubin)
    off = compile_op(spec, parse_target("sm_90a"), pipeline=auto.replace("approx=auto", "approx=off"),
                     shape={"M": 64, "N": 128, "K": 64})
    assert not off.report["approximations"] and "tanh.approx" not in off.kernel.cu
    # the same math into an f32 output: its rounding no longer hides the error
    text = open("kernels/gemm_bias_gelu.kfc").read().replace("-> (c: bf16[M, N])", "-> (c: f32[M, N])") \
        .replace("c = bf16(h", "c = (h")
    wide = parse_kfc(text.split("check {")[0])
    func, low = lowered(wide, {"M": 64, "N": 128, "K": 64}, auto)
    assert not any(isinstance(op, TanhApproxOp) for op in low.walk())
    func, low = lowered(spec, {"M": 70, "N": 136, "K": 64}, auto)
    assert any(isinstance(op, TanhApproxOp) for op in low.walk())
    args = {**operands(70, 136, 64), "bias": np.random.default_rng(0).standard_normal(136).astype(np.float32)}
    np.testing.assert_allclose(run(low, args)["c"].astype(np.float32), run(func, args)["c"].astype(np.float32),
                               rtol=2 ** -7, atol=1e-2)


def test_a_spilling_product_is_told_the_options_that_free_registers():
    """kfc compile's spill message: the matrix product's own remedies (its consumers' register
    budget, a narrower tile), where a row program is told to spread its row wider."""
    from kfc.compile import spill_remedy

    hint = spill_remedy(parse_pipeline("cse,accelerate-matmul{producer=warpgroup,cluster=2},dce"))
    assert "registers=232" in hint and "bn=192" in hint
    hint = spill_remedy(parse_pipeline("accelerate-matmul{producer=warpgroup,registers=232,bn=64}"))
    assert hint.startswith("choose a tile with fewer elements per thread")
    assert spill_remedy(parse_pipeline("accelerate-matmul{bn=128}")) == "take a narrower tile (bn=64)"
    # only widths the pass takes with these options: 192 -> 128, and a cluster of 2 keeps 128
    assert spill_remedy(parse_pipeline("accelerate-matmul{bn=192}")) == "take a narrower tile (bn=128)"
    hint = spill_remedy(parse_pipeline("accelerate-matmul{producer=warpgroup,registers=232,cluster=2,bn=128}"))
    assert hint.startswith("choose a tile with fewer elements per thread")
    assert "more threads" in spill_remedy(parse_pipeline("tile,lower-ptx"))

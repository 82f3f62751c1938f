"""What the GPU computes equals what the interpreter computes on the final IR: every op in
kernels/ and examples/, at each of its check shapes (scaled down as `kfc check` scales them, so
the odd ones stay odd), on fresh random inputs into poisoned outputs. Exact outputs (integers,
bools, fp8) must match bit for bit, floats at the op's tolerance. And the quantisation examples
write torch's bytes (the CPU reference, kfc's authority for exact outputs) at odd and large
shapes, hostile values included. Run with `pytest -m gpu`."""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kfc.check.runner import compare, make_inputs, scale_down  # noqa: E402
from kfc.check.tensors import to_torch  # noqa: E402
from kfc.codegen import cuda  # noqa: E402
from kfc.frontend import instances, load_kfc  # noqa: E402
from kfc.ir.dtypes import DType  # noqa: E402
from kfc.ir.interpreter import run  # noqa: E402
from kfc.model.target import parse_target  # noqa: E402
from kfc.proof import lower_stages  # noqa: E402
from kfc.runtime.kernel import KfcKernel  # noqa: E402

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
OPS = sorted([*ROOT.glob("kernels/*.kfc"), *ROOT.glob("examples/*.kfc")])
BUDGET = 1 << 18  # elements per case: the interpreter runs the final IR on every one
_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def requires_gpu():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA GPU: GPU tests run on the device machine (pytest -m gpu)")


def poisoned(shape, dtype: DType):
    """An output tensor no kernel result looks like: NaN in every float format, the most
    negative integer, True."""
    t = torch.empty(shape, dtype=dtype.torch, device="cuda")
    if dtype.is_float:
        t.view(_RAW[dtype.itemsize]).fill_(-1)  # all ones: a NaN in bf16, f16, f32, e4m3 and e5m2
    elif dtype.is_bool:
        t.fill_(True)
    else:
        t.fill_(int(np.iinfo(dtype.np).min))
    return t


def as_numpy(t, dtype: DType) -> np.ndarray:
    """A GPU tensor as the numpy array the interpreter would hold (bf16 and fp8 by their bits)."""
    t = t.detach().cpu().contiguous()
    if dtype in (DType.BF16, DType.E4M3, DType.E5M2):
        return t.view(_RAW[dtype.itemsize]).numpy().view(dtype.np)
    return t.numpy()


# one-byte dtypes in every position: row loads and stores, a scalar load, a scalar store, casts
NARROW = """
op narrow_{src}(x: bf16[M, N], a: {src}[M, N]) -> (q: {src}[M, N], back: bf16[M, N], first: {src}[M]) {{
  parallel m in 0..M {{
    xr = f32(x[m, :])
    q[m, :] = {src}(xr * 8.0)
    back[m, :] = bf16(f32(a[m, :]) + xr + f32(a[m, 0]))
    first[m] = {src}(max(xr) * 100.0)
  }}
}}
check {{
  shapes = [{{M: 300, N: 4096}}, {{M: 7, N: 7}}, {{M: 5, N: 4095}}, {{M: 3, N: 1}}]
}}
"""


# a tile program (the shared-memory tile emitter): keepdims, a loop carrying two tiles and a
# scalar for a run-time count (one tile updated in place, one through a copy: it reads itself
# transposed), a product, a transpose, a reversed scan, a reshape, a product reduction and a
# whole-tile reduction to a scalar
TILE_MIX = """
op tile_mix(x: f32[B, 8, 12], w: bf16[12, 6], n: i32[B], r: f32[B, 8, 8])
        -> (y: f32[B, 6, 8], z: f32[B, 96], c: i32[B, 8], s: f32[B], q: f32[B, 8, 8]) {
  parallel b in 0..B {
    xt = x[b, :, :]
    e = exp(xt - max(xt, axis=1, keepdims=true))
    p = e / sum(e, axis=1, keepdims=true)
    acc = zeros([8, 12])
    tot = 0.0
    R = r[b, :, :]
    for i in 0..n[b] carry (acc, tot, R) {
      acc = acc * 0.5 + p
      tot = tot + sum(acc)
      R = transpose(R, [1, 0]) * 0.5 + 1.0
    }
    q[b, :, :] = R
    y[b, :, :] = transpose(dot(acc, f32(w)), [1, 0])
    z[b, :] = reshape(cummax(xt, axis=1, reverse=true), [96])
    c[b, :] = i32(prod(where(xt > 0.0, 1.0, 2.0), axis=1))
    s[b] = tot + min(xt)
  }
}
check {
  inputs = {n: randint(0, 5)}
  shapes = [{B: 300}, {B: 1}]
}
"""
# reductions of a tile program with fewer outputs than threads, over a warp's width or more: a
# warp an output (floats and integers, keepdims, a mean); one with many short outputs stays a
# thread an output
TILE_REDUCE = """
op tile_reduce(x: f32[B, 4, 96], i: i32[B, 40, 3]) -> (a: f32[B, 4], m: f32[B, 4, 1], n: f32[B, 96], c: i32[B, 3]) {
  parallel b in 0..B {
    xt = x[b, :, :]
    a[b, :] = sum(xt * xt, axis=1)
    m[b, :, :] = max(xt, axis=1, keepdims=true) - mean(xt, axis=1, keepdims=true)
    n[b, :] = min(xt, axis=0)
    c[b, :] = sum(i[b, :, :], axis=0)
  }
}
check {
  inputs = {i: randint(-1000, 1000)}
  shapes = [{B: 300}, {B: 1}]
}
"""
# blocks of columns of a tensor's last axis, from a start and up to a limit that are multiples
# of four: a group of four at a time (TileWrites.grouped_last_axis), the last block cut at 100
TILE_COLUMNS = """
op tile_columns(x: f32[B, 16, 100], w: bf16[B, 16, 100]) -> (y: f32[B, 16, 100]) {
  parallel b in 0..B, c in 0..4 {
    c0 = c * 32
    t = x[b, :, c0:c0+32 limit 100] * f32(w[b, :, c0:c0+32 limit 100])
    y[b, :, c0:c0+32 limit 100] = exp(t) + cumsum(t, axis=0)
  }
}
check {
  shapes = [{B: 3}, {B: 1}]
}
"""
# triangular inverses a lane a row (kfc.codegen.tile_loops): a group of 8 lanes for 7 rows, of
# 32 for 17 (lanes past the rows idle) and for 32; 33 rows a thread a column
TILE_TRI_INV = """
op tile_tri_inv(a: f32[B, 7, 7], b: f32[B, 17, 17], c: f32[B, 32, 32], d: f32[B, 33, 33])
        -> (x: f32[B, 7, 7], y: f32[B, 17, 17], z: f32[B, 32, 32], w: f32[B, 33, 33]) {
  parallel i in 0..B {
    x[i, :, :] = tri_inv(a[i, :, :])
    y[i, :, :] = tri_inv(b[i, :, :] * 0.5)
    z[i, :, :] = tri_inv(c[i, :, :])
    w[i, :, :] = tri_inv(d[i, :, :])
  }
}
check {
  inputs = {a: uniform(-0.3, 0.3), b: uniform(-0.3, 0.3), c: uniform(-0.2, 0.2), d: uniform(-0.2, 0.2)}
  shapes = [{B: 3}, {B: 1}]
}
"""
# integer floor divisions and remainders of negative values: by powers of two a shift or a mask
# (kfc.codegen.elementwise_rules), by 12 kfc_floordiv; in a row and in a scalar
DIVISIONS = """
op divisions(x: i32[M, N], s: i64[M]) -> (y: i32[M, N], z: i64[M]) {
  parallel m in 0..M {
    y[m, :] = x[m, :] // 16 + x[m, :] % 8 - x[m, :] // 12 + x[m, :] % 1
    z[m] = s[m] // 4 + s[m] % 1099511627776 + s[m] // 1
  }
}
check {
  inputs = {x: randint(-1000, 1000), s: randint(-100000, 100000)}
  shapes = [{M: 300, N: 4096}, {M: 7, N: 7}]
}
"""
WRITTEN = {**{f"narrow_{d}": NARROW.format(src=d) for d in ("e4m3", "e5m2", "i8", "u8")}, "tile_mix": TILE_MIX,
           "tile_reduce": TILE_REDUCE, "tile_columns": TILE_COLUMNS, "tile_tri_inv": TILE_TRI_INV,
           "divisions": DIVISIONS}


# instances besides each op's first: KDA's kernels where their loops prefetch (C = 16, 32; the
# one-kernel kda_fwd's are run against the fp64 recurrence by tests/gpu/test_kda_gpu.py) and the
# pair with bf16 workspaces (f32 is each one's first), fla's prepare kernel with its decays as
# products (DECAY = 2), the recurrence writing f16
BOUND = {"kda_recurrence_c16": ("kda_recurrence", {"C": "16"}), "kda_recurrence_c32": ("kda_recurrence", {"C": "32"}),
         "kda_fwd_flashkda_c16": ("kda_fwd_flashkda", {"C": "16"}), "kda_fwd_fla_c16": ("kda_fwd_fla", {"C": "16"}),
         "kda_recurrence_c16_bf16": ("kda_recurrence", {"C": "16", "WD": "bf16"}),
         "kda_prepare_flashkda_bf16": ("kda_prepare_flashkda", {"WD": "bf16"}),
         "kda_prepare_fla_decay2": ("kda_prepare_fla", {"DECAY": "2"}),
         "kda_recurrence_c16_f16": ("kda_recurrence", {"C": "16", "O": "f16"})}


@pytest.mark.parametrize("path", OPS + [Path(f"{name}.kfc") for name in [*WRITTEN, *BOUND]], ids=lambda p: p.stem)
def test_the_gpu_computes_what_the_final_ir_computes(path, tmp_path):
    requires_gpu()
    bind = None
    if path.stem in WRITTEN:
        text = WRITTEN[path.stem]
        path = tmp_path / path.name
        path.write_text(text)
    elif path.stem in BOUND:
        name, bind = BOUND[path.stem]
        path = ROOT / "kernels" / f"{name}.kfc"
    spec = instances(load_kfc(path, bind))[0]
    target = parse_target("sm_90a")
    kernel = KfcKernel(spec, target)
    checked = 0
    for ci, case in enumerate(spec.check.shapes):
        dims = scale_down(spec, dict(case), BUDGET)
        stages = lower_stages(spec, target, None, dims)
        assert hasattr(stages, "stages"), f"{path.stem} at {dims}: {stages.reason}"
        final = stages.stages[-1][1]
        args = make_inputs(spec, dims, np.random.default_rng(1000 + ci), True)
        want = run(final, {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()})
        given = {}
        for v in spec.func.tensor_inputs:
            if v.name in args:
                given[v.name] = to_torch(args[v.name], v.ttype.dtype).cuda()
        for v in spec.func.scalar_inputs:
            if v.name in args:
                given[v.name] = args[v.name].item() if hasattr(args[v.name], "item") else args[v.name]
        outs = tuple(poisoned(want[v.name].shape, v.ttype.dtype) for v in spec.func.outputs)
        kernel(**given, out=outs if len(outs) > 1 else outs[0])
        torch.cuda.synchronize()
        for v, o in zip(spec.func.outputs, outs):
            d = v.ttype.dtype
            got, ref = as_numpy(o, d), want[v.name]
            what = f"{spec.instance_name} case {ci} {dims}: {v.name} ({d})"
            if d.is_exact:
                assert got.tobytes() == np.ascontiguousarray(ref).tobytes(), \
                    f"{what}: {int((got.view(np.uint8) != ref.view(np.uint8)).sum())} byte(s) differ"
            else:
                tol = spec.check.tolerance_for(str(d))
                _, rel, ok, note = compare(got, ref, tol)
                if not ok and d in (DType.BF16, DType.F16) and note.split(" element(s) off")[0].isdigit() and rel <= tol:
                    # each side rounds an f32 value to 16 bits; two a hair apart may round to
                    # neighbours, a unit apart, which near a power of two is more than tol
                    beyond = off_by_more_than_a_unit(got, ref, d, tol)
                    ok, note = not beyond, f"{beyond} element(s) off by more than a unit in the last place"
                assert ok, f"{what}: {note or f'relative RMSE {rel:.3g}'}"
        checked += 1
    assert checked


def off_by_more_than_a_unit(got, ref, d: DType, tol: float) -> int:
    """Elements of a 16-bit float output off the reference by more than the tolerance and by
    more than one unit in the last place of the output's type at the reference."""
    g, r = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    a = np.abs(r)
    unit = (np.spacing(a.astype(np.float32)).astype(np.float64) * 2.0 ** 16 if d is DType.BF16
            else np.spacing(a.astype(np.float16)).astype(np.float64))
    scale = tol * (a + np.sqrt(np.mean(r * r)))
    return int((np.abs(g - r) > np.maximum(scale, unit)).sum())


def hostile_rows(m: int, n: int, dtype):
    """Normal rows, with a row of zeros, one with a huge value, and one of tiny values among them."""
    x = torch.randn(m, n, dtype=torch.float32)
    if m >= 4:
        x[1] = 0
        x[2, n // 2] = 3e4
        x[3] *= 1e-30
    return x.to(dtype)


QUANT = {
    "fp8_quant": (448.0, lambda x, s: (x.float() / s[:, None]).to(torch.float8_e4m3fn)),
    "int8_quant": (127.0, lambda x, s: (x.float() / s[:, None]).round().clamp(-127, 127).to(torch.int8)),
}


@pytest.mark.parametrize("name", sorted(QUANT))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("m, n", [(1, 7), (7, 4095), (5, 1), (3, 65537), (16384, 4096), (4096, 16384)])
def test_quantisation_writes_torchs_bytes(name, dtype, m, n):
    requires_gpu()
    import kfc

    top, quantise = QUANT[name]
    op = kfc.load(ROOT / "examples" / f"{name}.kfc")
    x = hostile_rows(m, n, dtype)
    scale = x.float().abs().amax(-1).clamp(min=1e-12) / top
    want_q = quantise(x, scale)
    q_dtype = want_q.dtype
    got_q = torch.empty(m, n, dtype=q_dtype, device="cuda")
    got_q.view(torch.uint8).fill_(0xFF)
    got_s = torch.full((m,), float("nan"), device="cuda")
    op(x=x.cuda(), out=(got_q, got_s))
    assert torch.equal(got_s.cpu().view(torch.int32), scale.view(torch.int32)), "scales differ from torch's"
    diff = got_q.cpu().view(torch.uint8) != want_q.view(torch.uint8)
    assert not diff.any(), f"{int(diff.sum())} of {m * n} codes differ from torch's, first at {diff.nonzero()[0].tolist()}"


@pytest.mark.parametrize("name, double, staged", [
    ("kda_recurrence_c16", False, False), ("kda_recurrence_c16", True, False), ("kda_recurrence_c32", False, False),
    ("kda_recurrence_split", False, False), ("kda_fwd_flashkda_c16", False, False), ("kda_fwd_fla_c16", False, False),
    ("kda_recurrence_c16", False, True), ("kda_recurrence_c32", False, True), ("kda_recurrence_split", False, True),
    ("kda_fwd_flashkda_c16", False, True), ("kda_fwd_fla_c16", False, True)])
def test_column_registers_compute_what_the_final_ir_computes(name, double, staged, tmp_path, monkeypatch):
    """The recurrence with its state in registers, a warp to 16 columns (kfc.codegen.tile_columns),
    with two copies of its loads, and with its 16-bit stores through the warp's rows
    (TILE_STAGED_STORES): its check shapes take it at V = 128 and 32 (two warps of eight), the
    default emitter at V = 24 and 8; the split's first instance at VB = 64 (four warps); the
    one-kernel FlashKDA and fla forms. The switches are part of the JIT cache's key
    (kfc.codegen.cuda.switches)."""
    monkeypatch.setattr(cuda, "TILE_COLUMN_REGISTERS", True)
    monkeypatch.setattr(cuda, "TILE_DOUBLE_BUFFER", double)
    monkeypatch.setattr(cuda, "TILE_STAGED_STORES", staged)
    path = ROOT / "kernels" / "kda_recurrence_split.kfc" if name == "kda_recurrence_split" else Path(f"{name}.kfc")
    test_the_gpu_computes_what_the_final_ir_computes(path, tmp_path)


def test_products_sharing_their_a_compute_what_the_final_ir_computes(tmp_path, monkeypatch):
    """The prepare kernel's w and u (both Ainv times a tile) in one phase from the same A
    fragments (kfc.codegen.tile_mma.sharing_a, off by default until timed), and with every load
    in the first phase."""
    monkeypatch.setattr(cuda, "TILE_SHARE_A", True)
    test_the_gpu_computes_what_the_final_ir_computes(ROOT / "kernels" / "kda_prepare_flashkda.kfc", tmp_path)
    monkeypatch.setattr(cuda, "TILE_EARLY_LOADS", True)
    test_the_gpu_computes_what_the_final_ir_computes(ROOT / "kernels" / "kda_prepare_flashkda.kfc", tmp_path / "early")


@pytest.mark.parametrize("name", ["kda_prepare_flashkda", "kda_fwd_flashkda_c16", "kda_fwd_fla_c16"])
def test_approximate_exponentials_compute_what_the_final_ir_computes(name, tmp_path, monkeypatch):
    """exp, rsqrt and sigmoid on ex2.approx and rsqrt.approx (the approx-math pass, first in the
    default pipeline): the final IR holds the approximate ops, which the interpreter computes; and
    without the pass, expf and the rest as before."""
    import kfc.passes
    assert kfc.passes.TILE_PIPELINE.startswith("approx-math,")
    path = ROOT / "kernels" / f"{name}.kfc" if name == "kda_prepare_flashkda" else Path(f"{name}.kfc")
    test_the_gpu_computes_what_the_final_ir_computes(path, tmp_path)
    monkeypatch.setattr(kfc.passes, "TILE_PIPELINE", kfc.passes.TILE_PIPELINE.replace("approx-math,", ""))
    test_the_gpu_computes_what_the_final_ir_computes(path, tmp_path / "exact")


@pytest.mark.parametrize("name", ["linear_attention", "kda_recurrence_c16", "kda_fwd_fla_c16"])
def test_3xtf32_products_compute_what_the_final_ir_computes(name, tmp_path, monkeypatch):
    """Products in 3xTF32 (`tf32-dots{split=3}`: two TF32 values an operand, three mma.sync a
    step, kfc_tf32_lo): over shared memory (linear attention), with the state in registers (the
    recurrence), and in the one-kernel fla form that chunk_kda runs at K = 256 this way."""
    import kfc.passes
    split = kfc.passes.TILE_PIPELINE.replace("tf32-dots", "tf32-dots{split=3}")
    monkeypatch.setattr(kfc.passes, "TILE_PIPELINE", split)
    path = ROOT / "examples" / "linear_attention.kfc" if name == "linear_attention" else Path(f"{name}.kfc")
    test_the_gpu_computes_what_the_final_ir_computes(path, tmp_path)


def test_16_bit_products_compute_what_the_final_ir_computes(tmp_path, monkeypatch):
    """Products on mma.sync.m16n8k16 (kfc.codegen.tile_mma): of bf16 and f16 tiles as they are
    (the default), A or B transposed, and f32 ones the bf16-dots pass rounds to bf16 (not in the
    default pipeline), beside a tf32 one."""
    import kfc.passes
    from tests.test_mma_16bit import HALVES
    path = tmp_path / "halves.kfc"
    path.write_text(HALVES)
    test_the_gpu_computes_what_the_final_ir_computes(path, tmp_path)
    with_bf16 = kfc.passes.TILE_PIPELINE.replace("tf32-dots", "bf16-dots,tf32-dots")
    monkeypatch.setattr(kfc.passes, "TILE_PIPELINE", with_bf16)
    test_the_gpu_computes_what_the_final_ir_computes(path, tmp_path / "bf16")


PRODUCT = """
op product(a: f32[B, 16, {k}], w: f32[B, {k}, 8]) -> (y: f32[B, 16, 8]) {{
  parallel b in 0..B {{
    y[b, :, :] = dot(a[b, :, :], w[b, :, :])
  }}
}}
check {{
  tolerance = {{f32: {tol}}}
}}
"""


def product_bits(k: int, tol: str, a, w) -> np.ndarray:
    """y = dot(a, w), a [B, 16, k] by w [B, k, 8] built by the default tile pipeline, on the GPU,
    as its bits."""
    from kfc.frontend import parse_kfc
    kernel = KfcKernel(instances(parse_kfc(PRODUCT.format(k=k, tol=tol)))[0], parse_target("sm_90a"))
    y = torch.full((a.shape[0], 16, 8), float("nan"), device="cuda")
    kernel(a=torch.from_numpy(a).cuda(), w=torch.from_numpy(w).cuda(), out=y)
    torch.cuda.synchronize()
    return y.cpu().numpy().view(np.uint32)


def normal_bits(shape, half_unit: int, seed: int) -> np.ndarray:
    """Random normal f32 bit patterns of both signs, the first half of the batch ties: the bits
    below half_unit's cleared, half_unit's set."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0x00800000, 0x7F000000, size=shape, dtype=np.uint32)
    b = shape[0]
    bits[: b // 2] = (bits[: b // 2] & ~np.uint32(2 * half_unit - 1)) | np.uint32(half_unit)
    return bits | rng.integers(0, 2, size=shape, dtype=np.uint32) << np.uint32(31)


def test_the_gpu_rounds_to_tf32_as_the_interpreter_does_bit_for_bit():
    """A product by the identity on tensor cores returns its A rounded to TF32 and summed with
    exact zeros, so y must be kfc.ir.tile_ops.matmul.round_tf32(a) bit for bit: on ties (the low
    13 bits exactly 0x1000, both signs, odd and even kept parts), just either side of them, and a
    carry into the exponent. Normal finite values only: an infinity times the identity's zeros
    is NaN across its row."""
    from kfc.ir.tile_ops.matmul import round_tf32
    requires_gpu()
    b = 64
    bits = normal_bits((b, 16, 8), 0x1000, 7)
    bits[-1, 0] = [0x3F801000, 0x3F803000, 0x3F800FFF, 0x3F801001, 0x3FFFF000, 0xBF801000, 0xBF803000, 0x7EFFF000]
    a = bits.view(np.float32)
    w = np.broadcast_to(np.eye(8, dtype=np.float32), (b, 8, 8)).copy()
    got, want = product_bits(8, "5e-3", a, w), round_tf32(a).view(np.uint32)
    ties = (bits & np.uint32(0x1FFF)) == np.uint32(0x1000)
    assert ties.sum() > 4000 and not np.array_equal(want, (bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000))
    diff = got != want
    assert not diff.any(), (f"{int(diff.sum())} element(s) differ ({int((diff & ties).sum())} of them ties), "
                            f"first {a[diff][0]!r}: {got[diff][0]:#x} != {want[diff][0]:#x}")


def test_the_gpu_rounds_to_bf16_as_the_interpreter_does_bit_for_bit(monkeypatch):
    """The bf16-dots pass's products on m16n8k16, by the identity's left or right half: y is
    kfc.ir.tile_ops.matmul.round_bf16 of a's first eight columns (even b) or its last eight (odd
    b) bit for bit, ties (the low 16 bits exactly 0x8000) among them: the rounding, the packing
    of a lane's two elements and both halves of A's and B's fragments."""
    import kfc.passes
    from kfc.ir.tile_ops.matmul import round_bf16
    requires_gpu()
    with_bf16 = kfc.passes.TILE_PIPELINE.replace("tf32-dots", "bf16-dots,tf32-dots")
    monkeypatch.setattr(kfc.passes, "TILE_PIPELINE", with_bf16)
    b = 64
    a = normal_bits((b, 16, 16), 0x8000, 11).view(np.float32)
    w = np.zeros((b, 16, 8), np.float32)
    for i in range(b):
        w[i, np.arange(8) + 8 * (i % 2), np.arange(8)] = 1.0
    got = product_bits(16, "2e-2", a, w)
    want = np.stack([round_bf16(a[i, :, 8 * (i % 2): 8 * (i % 2) + 8]) for i in range(b)]).view(np.uint32)
    diff = got != want
    assert not diff.any(), f"{int(diff.sum())} element(s) differ, first at {np.argwhere(diff)[0].tolist()}"

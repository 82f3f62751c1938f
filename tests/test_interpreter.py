"""Semantics of the IR interpreter (kfc.ir.interpreter), op by op, against numpy references
written out here — never the interpreter's own tables — on fresh random inputs."""

from __future__ import annotations

import math
import os
import zlib

import ml_dtypes
import numpy as np
import pytest

from kfc.diagnostics import InterpretError, KfcError
from kfc.ir import ALL, Builder, BuildError, Slice, SymDim, parse_ir, scalar, tensor, verify
from kfc.ir.dtypes import DType
from kfc.ir.interpreter import bind_arguments, run
from kfc.ir.tile_ops import BINARY_OPS, UNARY_OPS, OperandKind

BF16 = np.dtype(ml_dtypes.bfloat16)
F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
I8, I32, I64 = np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
DT = {BF16: DType.BF16, F16: DType.F16, F32: DType.F32, F64: DType.F64, I8: DType.I8, I32: DType.I32,
      I64: DType.I64, BOOL: DType.BOOL}


@pytest.fixture
def rng(request):
    """A generator seeded from the test's id (and KFC_TEST_SEED, to draw other inputs)."""
    base = int(os.environ.get("KFC_TEST_SEED", "0"))
    return np.random.default_rng(base * 1_000_003 + zlib.crc32(request.node.nodeid.encode()))


def rand(rng, shape, dtype, lo=-3.0, hi=3.0, positive=False):
    """Random values of `dtype`, none of them zero."""
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        lo_i, hi_i = (1, int(hi) + 1) if positive else (int(lo), int(hi) + 1)
        x = rng.integers(lo_i, hi_i, size=shape)
        x = np.where(x == 0, 1, x)
        return x.astype(dtype)
    x = rng.uniform(lo, hi, size=shape)
    if positive:
        x = np.abs(x) + 0.05
    x = np.where(np.abs(x) < 1e-3, 0.5, x)
    return x.astype(dtype)


def run_tiles(arrays: dict[str, np.ndarray], fn, out_dtype, out_shape=None) -> np.ndarray:
    """Load each array whole as a tile, apply fn(b, *tiles), store the result into `y`."""
    b = Builder()
    first = next(iter(arrays.values()))
    out_shape = first.shape if out_shape is None else tuple(out_shape)
    ins = [(n, tensor(DT[a.dtype], *a.shape)) for n, a in arrays.items()]
    with b.func("t", inputs=ins, outputs=[("y", tensor(DT[np.dtype(out_dtype)], *out_shape))]) as f:
        *xs, y = f.args
        with b.parallel([(0, 1)]):
            b.store(fn(b, *[b.load(x, []) for x in xs]), y, [])
    out = run(verify(f.op), dict(arrays))["y"]
    assert out.dtype == np.dtype(out_dtype) and out.shape == out_shape
    return out


def ulps_bf16(a, b):
    """Distance in bf16 units in the last place (finite values)."""
    ia = a.view(np.int16).astype(np.int64)
    ib = b.view(np.int16).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFF), ib)
    return np.abs(ia - ib)


# ---------------------------------------------------------------------------------------------
# unary ops

def _softplus64(x):
    return np.where(x > 30, x, np.log1p(np.exp(np.minimum(x, 30))))


UNARY_REF64 = {
    "neg": lambda x: -x, "abs": np.abs, "exp": np.exp, "exp2": lambda x: 2.0 ** x, "log": np.log,
    "log2": lambda x: np.log(x) / np.log(2.0), "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "softplus": _softplus64, "tanh": np.tanh, "round": np.rint,
}
# the same functions as an fp32 computation would do them (for the narrow-float rule)
UNARY_F32 = {
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2,
    "sqrt": np.sqrt, "rsqrt": lambda x: np.float32(1) / np.sqrt(x), "tanh": np.tanh, "round": np.rint,
    "sigmoid": lambda x: (1.0 / (1.0 + np.exp(-x.astype(F64)))).astype(F32),
    "softplus": lambda x: _softplus64(x.astype(F64)).astype(F32),
}
POSITIVE = {"log", "log2", "sqrt", "rsqrt"}
CORRECTLY_ROUNDED = {"neg", "abs", "sqrt", "round"}  # one IEEE operation: fp32 result is exact-rounded


def test_unary_table_is_covered():
    assert set(UNARY_OPS) == set(UNARY_REF64) | {"not"}


@pytest.mark.parametrize("fn", sorted(UNARY_REF64))
def test_unary_f32(fn, rng):
    x = rand(rng, (4, 33), F32, -8, 8, positive=fn in POSITIVE)
    got = run_tiles({"x": x}, lambda b, t: b.unary(fn, t), F32)
    want = UNARY_REF64[fn](x.astype(F64))
    np.testing.assert_allclose(got.astype(F64), want, rtol=4e-7 if fn in CORRECTLY_ROUNDED else 3e-6,
                               atol=0)


def test_sigmoid_keeps_relative_precision_far_out(rng):
    # sigmoid(-20) = 2.06e-9 is an ordinary fp32 number; it must not flush to 0
    x = np.array([-80.0, -30.0, -20.0, -8.0, 0.0, 8.0, 20.0, np.inf, -np.inf], dtype=F32)
    got = run_tiles({"x": x}, lambda b, t: b.unary("sigmoid", t), F32)
    want = 1.0 / (1.0 + np.exp(-x.astype(F64)))
    np.testing.assert_allclose(got.astype(F64), want, rtol=3e-6, atol=0)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("fn", sorted(UNARY_REF64))
def test_unary_narrow_float_is_fp32_then_rounded(fn, dtype, rng):
    x = rand(rng, (8, 32), F32, -6, 6, positive=fn in POSITIVE).astype(dtype)
    got = run_tiles({"x": x}, lambda b, t: b.unary(fn, t), dtype)
    want = UNARY_F32[fn](x.astype(F32)).astype(F32).astype(dtype)
    if fn in ("sigmoid", "softplus"):
        # computed here through fp64: the fp32 value may differ by an ulp, which can flip a rounding
        g, w = got.astype(F32), want.astype(F32)
        assert np.mean(g == w) > 0.97
        assert dtype != BF16 or ulps_bf16(got, want).max() <= 1
        np.testing.assert_allclose(g, w, rtol=2 ** -7 if dtype == BF16 else 2 ** -10)
    else:
        np.testing.assert_array_equal(got.astype(F32), want.astype(F32))


def test_narrow_float_rounds_once_from_fp32():
    # exp(6.84375) = 938.00000x: fp32 gives exactly 938, a bf16 tie that goes to even (936);
    # computing in fp64 and rounding once would give 940
    x = np.array([6.84375, 1.0], dtype=BF16)
    got = run_tiles({"x": x}, lambda b, t: b.unary("exp", t), BF16)
    assert np.exp(np.float32(6.84375)) == np.float32(938.0)
    assert float(got[0]) == 936.0
    assert float(got[1]) == float(np.float32(np.e).astype(BF16))


@pytest.mark.parametrize("dtype", [I32, I8, I64], ids=["i32", "i8", "i64"])
def test_unary_int(dtype, rng):
    x = rand(rng, (5, 7), dtype, -100, 100)
    x.flat[0] = 0
    assert np.array_equal(run_tiles({"x": x}, lambda b, t: b.unary("neg", t), dtype),
                          np.array([-int(v) for v in x.flat]).reshape(x.shape).astype(dtype))
    assert np.array_equal(run_tiles({"x": x}, lambda b, t: b.unary("abs", t), dtype),
                          np.array([abs(int(v)) for v in x.flat]).reshape(x.shape).astype(dtype))
    assert np.array_equal(run_tiles({"x": x}, lambda b, t: b.unary("not", t), dtype),
                          np.array([-int(v) - 1 for v in x.flat]).reshape(x.shape).astype(dtype))


def test_unary_not_bool(rng):
    x = rand(rng, (6, 5), BOOL)
    got = run_tiles({"x": x}, lambda b, t: b.unary("not", t), BOOL)
    assert np.array_equal(got, np.array([not v for v in x.flat]).reshape(x.shape))


@pytest.mark.parametrize("fn", sorted(f for f, k in UNARY_OPS.items() if k is OperandKind.FLOAT))
def test_float_only_unary_rejects_ints(fn):
    b = Builder()
    with b.func("t", inputs=[("x", tensor(DType.I32, 4))], outputs=[]) as f:
        with b.parallel([(0, 1)]):
            with pytest.raises(BuildError, match="i32"):
                b.unary(fn, b.load(f.args[0], [ALL]))


# ---------------------------------------------------------------------------------------------
# binary ops

def _floor_mod(a, b):
    r = np.fmod(a, b)
    return np.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


BINARY_FLOAT_REF = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "rem": _floor_mod, "max": lambda a, b: np.where(a > b, a, b),
    "min": lambda a, b: np.where(a < b, a, b), "pow": lambda a, b: np.exp(b * np.log(a)),
}
BINARY_INT_REF = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a // b, "rem": lambda a, b: a % b, "max": max, "min": min,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
}


def test_binary_table_is_covered():
    assert set(BINARY_OPS) == set(BINARY_FLOAT_REF) | set(BINARY_INT_REF)


@pytest.mark.parametrize("fn", sorted(BINARY_FLOAT_REF))
def test_binary_f32(fn, rng):
    a = rand(rng, (6, 17), F32, -4, 4, positive=fn == "pow")
    c = rand(rng, (6, 17), F32, -4, 4)
    if fn in ("max", "min"):
        c[0, :3] = a[0, :3]  # ties
    got = run_tiles({"a": a, "b": c}, lambda b, x, y: b.binary(fn, x, y), F32)
    want = BINARY_FLOAT_REF[fn](a.astype(F64), c.astype(F64))
    if fn == "rem":
        want = _floor_mod(a, c)  # exact in fp32
        np.testing.assert_array_equal(got, want)
        assert np.all((got == 0) | (np.sign(got) == np.sign(c)))  # Python / torch.remainder sign rule
    else:
        np.testing.assert_allclose(got.astype(F64), want, rtol=6e-7 if fn != "pow" else 3e-6, atol=0)


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("fn", sorted(BINARY_FLOAT_REF))
def test_binary_narrow_float_is_fp32_then_rounded(fn, dtype, rng):
    a = rand(rng, (8, 32), F32, -4, 4, positive=fn == "pow").astype(dtype)
    c = rand(rng, (8, 32), F32, -4, 4).astype(dtype)
    got = run_tiles({"a": a, "b": c}, lambda b, x, y: b.binary(fn, x, y), dtype)
    a32, c32 = a.astype(F32), c.astype(F32)
    f32_ops = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "rem": _floor_mod,
               "max": np.maximum, "min": np.minimum, "pow": np.power}
    want = f32_ops[fn](a32, c32).astype(F32).astype(dtype)
    np.testing.assert_array_equal(got.astype(F32), want.astype(F32))


@pytest.mark.parametrize("dtype", [I32, I8, I64], ids=["i32", "i8", "i64"])
@pytest.mark.parametrize("fn", sorted(BINARY_INT_REF))
def test_binary_int(fn, dtype, rng):
    lim = 11 if dtype == I8 else 1000
    a = rand(rng, (5, 9), dtype, -lim, lim)
    c = rand(rng, (5, 9), dtype, -lim, lim)  # never zero: a divisor
    got = run_tiles({"a": a, "b": c}, lambda b, x, y: b.binary(fn, x, y), dtype)
    ref = BINARY_INT_REF[fn]
    want = np.array([ref(int(x), int(y)) for x, y in zip(a.flat, c.flat)]).reshape(a.shape)
    assert np.array_equal(got, want.astype(dtype)), (fn, got, want)


def test_int_division_by_zero_is_an_error(rng):
    a = rand(rng, (4,), I32, -9, 9)
    c = rand(rng, (4,), I32, -9, 9)
    c[2] = 0
    for fn in ("div", "rem"):
        with pytest.raises(InterpretError, match="by zero"):
            run_tiles({"a": a, "b": c}, lambda b, x, y: b.binary(fn, x, y), I32)


def test_int32_arithmetic_wraps(rng):
    a = np.array([2**31 - 1, -(2**31), 65536], dtype=I32)
    c = np.array([1, -1, 65536], dtype=I32)
    assert list(run_tiles({"a": a, "b": c}, lambda b, x, y: b.binary("add", x, y), I32)) == [-(2**31), 2**31 - 1, 131072]
    assert list(run_tiles({"a": a, "b": c}, lambda b, x, y: b.binary("mul", x, y), I32)) == [2**31 - 1, -(2**31), 0]


@pytest.mark.parametrize("fn", ["and", "or", "xor"])
def test_binary_bool(fn, rng):
    a, c = rand(rng, (7, 3), BOOL), rand(rng, (7, 3), BOOL)
    got = run_tiles({"a": a, "b": c}, lambda b, x, y: b.binary(fn, x, y), BOOL)
    ref = {"and": lambda x, y: x and y, "or": lambda x, y: x or y, "xor": lambda x, y: x != y}[fn]
    assert np.array_equal(got, np.array([ref(bool(x), bool(y)) for x, y in zip(a.flat, c.flat)]).reshape(a.shape))


def test_binary_broadcasts_and_literals(rng):
    a = rand(rng, (3, 1), F32)
    c = rand(rng, (5,), F32)
    got = run_tiles({"a": a, "b": c}, lambda b, x, y: b.binary("sub", b.binary("mul", x, 2.0), y), F32, (3, 5))
    np.testing.assert_array_equal(got, (a * np.float32(2.0)) - c[None, :])


# ---------------------------------------------------------------------------------------------
# cmp, where, cast

CMP_REF = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
           "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}


@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=["f32", "bf16", "i32"])
@pytest.mark.parametrize("pred", sorted(CMP_REF))
def test_cmp(pred, dtype, rng):
    a = rand(rng, (6, 11), F32, -3, 3).astype(dtype)
    c = rand(rng, (6, 11), F32, -3, 3).astype(dtype)
    c[::2] = a[::2]  # equal elements on every other row
    got = run_tiles({"a": a, "b": c}, lambda b, x, y: b.cmp(pred, x, y), BOOL)
    want = np.array([CMP_REF[pred](float(x), float(y)) for x, y in zip(a.flat, c.flat)]).reshape(a.shape)
    assert np.array_equal(got, want)


def test_cmp_nan_is_unordered():
    a = np.array([np.nan, 1.0, np.nan], dtype=F32)
    c = np.array([np.nan, np.nan, 2.0], dtype=F32)
    assert not run_tiles({"a": a, "b": c}, lambda b, x, y: b.cmp("eq", x, y), BOOL).any()
    assert run_tiles({"a": a, "b": c}, lambda b, x, y: b.cmp("ne", x, y), BOOL).all()
    assert not run_tiles({"a": a, "b": c}, lambda b, x, y: b.cmp("lt", x, y), BOOL).any()


@pytest.mark.parametrize("dtype", [F32, BF16, I32, BOOL], ids=["f32", "bf16", "i32", "bool"])
def test_where(dtype, rng):
    cond = rand(rng, (5, 8), BOOL)
    a = rand(rng, (5, 8), F32).astype(dtype)
    c = rand(rng, (5, 8), F32).astype(dtype) if dtype != BOOL else ~a
    got = run_tiles({"c": cond, "a": a, "b": c}, lambda b, k, x, y: b.where(k, x, y), dtype)
    want = np.array([x if k else y for k, x, y in zip(cond.flat, a.flat, c.flat)], dtype=dtype).reshape(a.shape)
    assert np.array_equal(got.astype(F32) if dtype == BF16 else got, want.astype(F32) if dtype == BF16 else want)


def test_where_broadcasts_condition_and_literal(rng):
    cond = rand(rng, (4, 1), BOOL)
    a = rand(rng, (4, 6), F32)
    got = run_tiles({"c": cond, "a": a}, lambda b, k, x: b.where(k, x, -1.5), F32, (4, 6))
    np.testing.assert_array_equal(got, np.where(np.repeat(cond, 6, axis=1), a, np.float32(-1.5)))


def test_cast_float_to_int_truncates(rng):
    x = rand(rng, (50,), F32, -100, 100)
    x[:6] = [2.7, -2.7, 0.5, -0.5, 3.0, -3.0]
    for dt in (I32, I64, I8):
        xx = np.clip(x, -120, 120) if dt == I8 else x
        got = run_tiles({"x": xx}, lambda b, t: b.cast(t, DT[dt]), dt)
        assert list(got) == [int(v) for v in xx]   # Python's int() truncates toward zero
    got = run_tiles({"x": x.astype(BF16)}, lambda b, t: b.cast(t, DType.I32), I32)
    assert list(got[:6]) == [2, -2, 0, 0, 3, -3]


def _bf16_rne(x32: np.ndarray) -> np.ndarray:
    """Round fp32 to bf16, nearest even, by bit arithmetic (finite inputs)."""
    bits = x32.view(np.uint32).astype(np.uint64)
    bias = 0x7FFF + ((bits >> 16) & 1)
    return ((bits + bias) >> 16).astype(np.uint16).view(BF16)


def test_cast_f32_to_bf16_rounds_to_nearest_even(rng):
    x = rand(rng, (256,), F32, -1000, 1000)
    # exact ties: the dropped 16 bits are 0x8000, both with an even and an odd kept lsb
    base = rng.integers(0x3F80, 0x4780, size=32).astype(np.uint32) << 16
    ties = (base | 0x8000).view(F32)
    above = (base | 0x8001).view(F32)
    below = (base | 0x7FFF).view(F32)
    x = np.concatenate([x, ties, -ties, above, below]).astype(F32)
    got = run_tiles({"x": x}, lambda b, t: b.cast(t, DType.BF16), BF16)
    want = _bf16_rne(x)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    # ties went to the even neighbour
    t = got[256:288].view(np.uint16)
    assert np.all(t % 2 == 0)


def test_cast_bool(rng):
    x = rand(rng, (20,), F32)
    x[:4] = [0.0, -0.0, 0.25, np.nan]
    assert list(run_tiles({"x": x}, lambda b, t: b.cast(t, DType.BOOL), BOOL)) == [bool(v) for v in x]
    i = rand(rng, (20,), I32, -3, 3)
    i[:2] = 0
    assert list(run_tiles({"x": i}, lambda b, t: b.cast(t, DType.BOOL), BOOL)) == [v != 0 for v in i]
    m = rand(rng, (20,), BOOL)
    assert list(run_tiles({"x": m}, lambda b, t: b.cast(t, DType.F32), F32)) == [1.0 if v else 0.0 for v in m]
    assert list(run_tiles({"x": m}, lambda b, t: b.cast(t, DType.I32), I32)) == [int(v) for v in m]


def test_cast_int_to_float_and_between_floats(rng):
    i = rand(rng, (30,), I32, -(2**30), 2**30)
    got = run_tiles({"x": i}, lambda b, t: b.cast(t, DType.F32), F32)
    assert list(got) == [np.float32(float(v)) for v in i]  # nearest fp32
    h = rand(rng, (30,), F32, -65000, 65000)
    got = run_tiles({"x": h}, lambda b, t: b.cast(t, DType.F16), F16)
    np.testing.assert_array_equal(got, h.astype(F16))  # IEEE round to nearest
    bf = rand(rng, (30,), F32).astype(BF16)
    got = run_tiles({"x": bf}, lambda b, t: b.cast(t, DType.F32), F32)
    assert np.array_equal(got.view(np.uint32), bf.view(np.uint16).astype(np.uint32) << 16)  # exact widening


# ---------------------------------------------------------------------------------------------
# reductions and scans

def _reduce_ref(kind, x, axes, keepdims):
    x = x.astype(F64) if x.dtype.kind == "f" or x.dtype == BF16 else x.astype(object)
    fn = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min, "mean": np.mean}[kind]
    return fn(x, axis=axes, keepdims=keepdims)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axes", [(0,), (1,), (2,), (0, 2), (0, 1, 2)])
@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min", "prod"])
def test_reduce_f32(kind, axes, keepdims, rng):
    x = rand(rng, (3, 4, 5), F32, 0.7, 1.3) if kind == "prod" else rand(rng, (3, 4, 5), F32)
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keepdims or i not in axes)
    got = run_tiles({"x": x}, lambda b, t: b.reduce(kind, t, list(axes), keepdims=keepdims), F32, out_shape)
    want = _reduce_ref(kind, x, axes, keepdims)
    np.testing.assert_allclose(got.astype(F64), want, rtol=2e-6, atol=1e-6)
    if kind in ("max", "min"):
        assert set(np.ravel(got)) <= set(np.ravel(x))  # picks an element, no arithmetic


@pytest.mark.parametrize("kind", ["sum", "max", "min", "prod"])
def test_reduce_i32(kind, rng):
    x = rand(rng, (4, 6), I32, -5, 5) if kind == "prod" else rand(rng, (4, 6), I32, -10**6, 10**6)
    got = run_tiles({"x": x}, lambda b, t: b.reduce(kind, t, 1), I32, (4,))
    want = [{"sum": sum, "max": max, "min": min, "prod": math.prod}[kind](int(v) for v in row) for row in x]
    assert list(got) == want


def test_reduce_bool_max_min(rng):
    x = rand(rng, (5, 3), BOOL)
    x[0] = True
    x[1] = False
    assert list(run_tiles({"x": x}, lambda b, t: b.reduce("max", t, 1), BOOL, (5,))) == [any(r) for r in x]
    assert list(run_tiles({"x": x}, lambda b, t: b.reduce("min", t, 1), BOOL, (5,))) == [all(r) for r in x]


def test_reduce_bf16_accumulates_in_fp32(rng):
    # 1024 values near 1: a bf16 accumulator stalls at 256 (its ulp there is 2); fp32 does not
    x = rand(rng, (2, 1024), F32, 0.5, 1.5).astype(BF16)
    got = run_tiles({"x": x}, lambda b, t: b.reduce("sum", t, 1), BF16, (2,))
    want = x.astype(F64).sum(axis=1)
    assert np.all(np.abs(got.astype(F64) - want) <= np.abs(want) * 2 ** -8)
    got = run_tiles({"x": x}, lambda b, t: b.reduce("mean", t, 1), BF16, (2,))
    assert np.all(np.abs(got.astype(F64) - want / 1024) <= (want / 1024) * 2 ** -8)


def _scan_ref(kind, x, axis, exclusive, reverse, ident):
    x = np.moveaxis(x, axis, -1)
    out = np.empty(x.shape, dtype=object)
    n = x.shape[-1]
    comb = {"sum": lambda a, b: a + b, "prod": lambda a, b: a * b, "max": max, "min": min}[kind]
    for idx in np.ndindex(*x.shape[:-1]):
        row = [x[idx + (i,)].item() for i in range(n)]
        for i in range(n):
            if reverse:
                part = row[i + 1:] if exclusive else row[i:]
            else:
                part = row[:i] if exclusive else row[:i + 1]
            acc = ident
            for v in part:
                acc = comb(acc, v)
            out[idx + (i,)] = acc
    return np.moveaxis(out, -1, axis)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("kind", ["sum", "max", "min", "prod"])
def test_scan_f32(kind, axis, exclusive, reverse, rng):
    x = rand(rng, (5, 6), F32, 0.8, 1.25) if kind == "prod" else rand(rng, (5, 6), F32)
    got = run_tiles({"x": x}, lambda b, t: b.scan(kind, t, axis, exclusive=exclusive, reverse=reverse), F32)
    ident = {"sum": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}[kind]
    want = _scan_ref(kind, x.astype(F64), axis, exclusive, reverse, ident).astype(F64)
    np.testing.assert_allclose(got.astype(F64), want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("kind", ["sum", "max", "min", "prod"])
def test_scan_i32(kind, exclusive, reverse, rng):
    x = rand(rng, (3, 7), I32, -4, 4) if kind == "prod" else rand(rng, (3, 7), I32, -1000, 1000)
    got = run_tiles({"x": x}, lambda b, t: b.scan(kind, t, 1, exclusive=exclusive, reverse=reverse), I32)
    # the identity of an exclusive scan's first element is that of the i32 type itself
    ident = {"sum": 0, "prod": 1, "max": -(2**31), "min": 2**31 - 1}[kind]
    want = _scan_ref(kind, x.astype(np.int64), 1, exclusive, reverse, ident).astype(np.int64)
    assert np.array_equal(got.astype(np.int64), want), (got, want)


@pytest.mark.parametrize("kind", ["max", "min"])
def test_scan_bool_exclusive_identity(kind, rng):
    x = np.array([False, True, False, True])
    got = run_tiles({"x": x}, lambda b, t: b.scan(kind, t, 0, exclusive=True), BOOL)
    ident = kind == "min"  # max (or) starts from false, min (and) from true
    assert list(got) == list(_scan_ref(kind, x, 0, True, False, ident))


def test_scan_bf16_accumulates_in_fp32(rng):
    x = rand(rng, (1, 512), F32, 0.5, 1.5).astype(BF16)
    got = run_tiles({"x": x}, lambda b, t: b.scan("sum", t, 1), BF16)
    want = np.cumsum(x.astype(F64), axis=1)
    assert np.all(np.abs(got.astype(F64) - want) <= np.abs(want) * 2 ** -8)


# ---------------------------------------------------------------------------------------------
# dot, iota, tri

@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("dtype", [F32, BF16, F16, I8], ids=["f32", "bf16", "f16", "i8"])
def test_dot(dtype, trans_a, trans_b, rng):
    m, n, k = 5, 7, 300
    a = rand(rng, (k, m) if trans_a else (m, k), F32, -2, 2).astype(dtype) if dtype != I8 else \
        rand(rng, (k, m) if trans_a else (m, k), I8, -100, 100)
    c = rand(rng, (n, k) if trans_b else (k, n), F32, -2, 2).astype(dtype) if dtype != I8 else \
        rand(rng, (n, k) if trans_b else (k, n), I8, -100, 100)
    out = I32 if dtype == I8 else F32
    got = run_tiles({"a": a, "b": c}, lambda b, x, y: b.dot(x, y, trans_a=trans_a, trans_b=trans_b), out, (m, n))
    aa = a.astype(np.int64 if dtype == I8 else F64)
    cc = c.astype(np.int64 if dtype == I8 else F64)
    aa = aa.T if trans_a else aa
    cc = cc.T if trans_b else cc
    want = np.array([[sum(aa[i, j] * cc[j, l] for j in range(k)) for l in range(n)] for i in range(m)])
    if dtype == I8:
        assert np.array_equal(got, want.astype(I32))
    else:
        # fp32 accumulation of the exact products: far tighter than bf16/f16 accumulation would be
        scale = np.abs(aa) @ np.abs(cc)
        assert np.all(np.abs(got.astype(F64) - want) <= scale * 1e-6)


@pytest.mark.parametrize("dtype", [DType.I32, DType.I64, DType.INDEX, DType.I8])
def test_iota(dtype):
    b = Builder()
    with b.func("t", inputs=[], outputs=[("y", tensor(dtype if dtype is not DType.INDEX else DType.I64, 13))]) as f:
        with b.parallel([(0, 1)]):
            b.store(b.cast(b.iota(13, dtype), f.args[0].ttype.dtype), f.args[0], [ALL])
    assert list(run(verify(f.op), {})["y"]) == list(range(13))


@pytest.mark.parametrize("k", [-2, -1, 0, 1, 3])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("shape", [(4, 4), (3, 6), (6, 3)])
def test_tri(shape, lower, k):
    b = Builder()
    with b.func("t", inputs=[], outputs=[("y", tensor(DType.BOOL, *shape))]) as f:
        with b.parallel([(0, 1)]):
            b.store(b.tri(*shape, lower=lower, k=k), f.args[0], [])
    got = run(verify(f.op), {})["y"]
    want = [[(j <= i + k) if lower else (j >= i + k) for j in range(shape[1])] for i in range(shape[0])]
    assert got.tolist() == want


def test_const_and_shape_ops(rng):
    x = rand(rng, (2, 3, 4), F32)
    got = run_tiles({"x": x}, lambda b, t: b.transpose(t, [2, 0, 1]), F32, (4, 2, 3))
    assert np.array_equal(got, np.einsum("abc->cab", x))
    got = run_tiles({"x": x}, lambda b, t: b.reshape(t, [6, 4]), F32, (6, 4))
    assert np.array_equal(got, x.reshape(6, 4))
    got = run_tiles({"x": x}, lambda b, t: b.broadcast_to(b.expand_dims(t, [0, 3]), [3, 2, 3, 5, 4]), F32,
                    (3, 2, 3, 5, 4))
    assert all(np.array_equal(got[r, :, :, s, :], x) for r in range(3) for s in range(5))
    got = run_tiles({"x": x}, lambda b, t: b.binary("add", t, b.const(0.75, DType.F32, [3, 1])), F32)
    assert np.array_equal(got, x + np.float32(0.75))


# ---------------------------------------------------------------------------------------------
# loads and stores

def _copy_func(in_shape, out_shape, load_index, store_index, other=0.0, in_dtype=DType.F32,
               optional_in=False, optional_out=False, loop=None):
    """y[store_index] = x[load_index] inside a parallel loop over `loop` (default one iteration)."""
    b = Builder()
    with b.func("t", inputs=[("x", tensor(in_dtype, *in_shape, optional=optional_in))],
                outputs=[("y", tensor(in_dtype, *out_shape, optional=optional_out))]) as f:
        x, y = f.args
        with b.parallel(loop or [(0, 1)]) as ivs:
            li = load_index(b, *ivs) if callable(load_index) else load_index
            si = store_index(b, *ivs) if callable(store_index) else store_index
            b.store(b.load(x, li, other=other), y, si)
    return verify(f.op)


def test_load_store_points(rng):
    x = rand(rng, (4, 6), F32)
    f = _copy_func((4, 6), (6, 4), lambda b, i: [i, ALL], lambda b, i: [ALL, i], loop=[(0, 4)])
    assert np.array_equal(run(f, {"x": x})["y"], x.T)


def test_slice_past_the_end_reads_other(rng):
    x = rand(rng, (10,), F32)
    f = _copy_func((10,), (8,), [Slice(7, 8)], [ALL], other=-5.0)
    y = run(f, {"x": x})["y"]
    assert list(y) == list(x[7:]) + [-5.0] * 5


def test_slice_with_limit(rng):
    x = rand(rng, (10,), F32)
    f = _copy_func((10,), (8,), [Slice(2, 8, limit=5)], [ALL], other=np.inf)
    assert list(run(f, {"x": x})["y"]) == list(x[2:5]) + [np.inf] * 5
    # a limit beyond the extent: the extent still bounds it
    f = _copy_func((10,), (8,), [Slice(6, 8, limit=100)], [ALL], other=-1.0)
    assert list(run(f, {"x": x})["y"]) == list(x[6:]) + [-1.0] * 4


def test_negative_slice_start(rng):
    x = rand(rng, (10,), F32)
    f = _copy_func((10,), (8,), [Slice(-3, 8)], [ALL], other=7.0)
    assert list(run(f, {"x": x})["y"]) == [7.0] * 3 + list(x[:5])


def test_stores_skip_out_of_range_elements(rng):
    x = rand(rng, (8,), F32)
    # past the end
    f = _copy_func((8,), (10,), [ALL], [Slice(6, 8)])
    y = run(f, {"x": x})["y"]
    assert np.all(np.isnan(y[:6])) and list(y[6:]) == list(x[:4])
    # with a limit
    f = _copy_func((8,), (10,), [ALL], [Slice(1, 8, limit=4)])
    y = run(f, {"x": x})["y"]
    assert np.isnan(y[0]) and list(y[1:4]) == list(x[:3]) and np.all(np.isnan(y[4:]))
    # a negative start
    f = _copy_func((8,), (10,), [ALL], [Slice(-2, 8)])
    y = run(f, {"x": x})["y"]
    assert list(y[:6]) == list(x[2:]) and np.all(np.isnan(y[6:]))


def test_2d_slices_and_points(rng):
    x = rand(rng, (5, 9, 4), F32)
    f = _copy_func((5, 9, 4), (3, 4, 6),
                   lambda b, i: [Slice(3, 4), i, Slice(1, 6, limit=3)],
                   lambda b, i: [i, ALL, ALL], other=0.5, loop=[(1, 3)])
    y = run(f, {"x": x})["y"]
    assert np.all(np.isnan(y[0]))
    for i in (1, 2):
        want = np.full((4, 6), 0.5, dtype=F32)
        want[:2, :2] = x[3:5, i, 1:3]   # rows 5.. are past the end, columns 3.. past the limit
        assert np.array_equal(y[i], want)


def test_absent_optional_input_reads_as_other(rng):
    f = _copy_func((3, 4), (3, 4), [ALL, ALL], [ALL, ALL], other=-2.5, optional_in=True)
    assert np.all(run(f, {"x": None})["y"] == -2.5)
    assert np.all(run(f, {})["y"] == -2.5)
    x = rand(rng, (3, 4), F32)
    assert np.array_equal(run(f, {"x": x})["y"], x)


def test_store_to_absent_optional_output_is_skipped(rng):
    x = rand(rng, (3, 4), F32)
    f = _copy_func((3, 4), (3, 4), [ALL, ALL], [ALL, ALL], optional_out=True)
    outs = run(f, {"x": x}, outputs={"y": None})
    assert outs["y"] is None
    assert np.array_equal(run(f, {"x": x})["y"], x)  # given, it is written
    g = _copy_func((3, 4), (3, 4), [ALL, ALL], [ALL, ALL])
    with pytest.raises(KfcError, match="not optional"):
        run(g, {"x": x}, outputs={"y": None})


IR_OOB = """\
kfc.func @oob(%x: f32[N, 4] @global) -> (%y: f32[4] @global) {
  %0 = tile.const {value = 0} : () -> index
  %1 = tile.const {value = 3} : () -> index
  tile.parallel %0, %1 {
  ^(%i: index):
    %r = tile.load %x, %i {index = ["i", ":"]} : (f32[N, 4] @global, index) -> f32[4]
    tile.store %r, %y {index = [":"]} : (f32[4], f32[4] @global) -> ()
  } : (index, index) -> ()
}
"""


def test_out_of_bounds_point_raises_with_span(rng):
    f = verify(parse_ir(IR_OOB, "oob.kir"))
    run(f, {"x": rand(rng, (3, 4), F32)})  # in bounds
    with pytest.raises(InterpretError) as info:
        run(f, {"x": rand(rng, (2, 4), F32)})
    e = info.value
    assert "out of bounds" in e.message and "2" in e.message
    assert e.span is not None and (e.span.file, e.span.line, e.span.col) == ("oob.kir", 6, 5)


def test_out_of_bounds_negative_point_and_store(rng):
    x = rand(rng, (4,), F32)
    f = _copy_func((4,), (4,), [2], [-1])
    with pytest.raises(InterpretError, match="at index -1 of dim 0, which has 4 elements: out of bounds"):
        run(f, {"x": x})
    with pytest.raises(InterpretError, match="out of bounds"):
        run(_copy_func((4,), (), [4], []), {"x": x})


# ---------------------------------------------------------------------------------------------
# loops

def test_parallel_over_two_indices(rng):
    x = rand(rng, (5, 7), F32)
    b = Builder()
    M, N = SymDim("M"), SymDim("N")
    with b.func("t", inputs=[("x", tensor(DType.F32, M, N))], outputs=[("y", tensor(DType.F32, M, N))]) as f:
        x_, y = f.args
        with b.parallel([(1, b.dim("M")), (0, b.binary("sub", b.dim("N"), 2))]) as (i, j):
            v = b.load(x_, [i, j])
            w = b.binary("add", b.cast(b.binary("mul", i, 100), DType.F32), b.cast(j, DType.F32))
            b.store(b.binary("add", v, w), y, [i, j])
    y = run(verify(f.op), {"x": x})["y"]
    assert np.all(np.isnan(y[0])) and np.all(np.isnan(y[:, 5:]))
    want = x + (100 * np.arange(5)[:, None] + np.arange(7)[None, :]).astype(F32)
    assert np.array_equal(y[1:, :5], want[1:, :5])


def _loop_func(lo, hi, step):
    """(s, c) = for t in lo..hi step: (s + x[t], c + 1), from s = 0.5, c = 0."""
    b = Builder()
    with b.func("t", inputs=[("x", tensor(DType.F32, 20)), ("lo", scalar(DType.I32))],
                outputs=[("s", tensor(DType.F32)), ("c", tensor(DType.I32))]) as f:
        x, lo_, s_out, c_out = f.args
        with b.parallel([(0, 1)]):
            s0 = b.const(0.5, DType.F32, name="s")
            c0 = b.const(0, DType.I32, name="c")
            with b.for_(lo_, hi, step, carried=[s0, c0], iv_name="t") as fr:
                s, c = fr.carried
                fr.yield_([b.binary("add", s, b.load(x, [fr.iv])), b.binary("add", c, 1)])
            s_fin, c_fin = fr.results
            b.store(s_fin, s_out, [])
            b.store(c_fin, c_out, [])
    return verify(f.op)


@pytest.mark.parametrize("lo,hi,step", [(0, 20, 1), (3, 17, 4), (2, 20, 3), (5, 6, 7), (-0, 19, 19)])
def test_for_with_step_and_carried_values(lo, hi, step, rng):
    x = rand(rng, (20,), F32)
    out = run(_loop_func(lo, hi, step), {"x": x, "lo": np.int32(lo)})
    ts = list(range(lo, hi, step))
    s = np.float32(0.5)
    for t in ts:
        s = np.float32(s + x[t])
    assert out["c"] == len(ts)
    assert out["s"] == s


@pytest.mark.parametrize("lo,hi", [(5, 5), (9, 2)])
def test_for_without_iterations_returns_inits(lo, hi, rng):
    out = run(_loop_func(lo, hi, 1), {"x": rand(rng, (20,), F32), "lo": np.int32(lo)})
    assert out["s"] == 0.5 and out["c"] == 0


def test_nested_for_carries_through(rng):
    x = rand(rng, (6, 6), F32)
    b = Builder()
    with b.func("t", inputs=[("x", tensor(DType.F32, 6, 6))], outputs=[("y", tensor(DType.F32, 6))]) as f:
        x_, y = f.args
        with b.parallel([(0, 1)]):
            acc = b.const(0.0, DType.F32, [6])
            with b.for_(0, 6, 2, carried=[acc]) as outer:
                with b.for_(outer.iv, 6, 1, carried=[outer.carried[0]]) as inner:
                    inner.yield_([b.binary("add", inner.carried[0], b.load(x_, [inner.iv, ALL]))])
                outer.yield_([b.binary("mul", inner.results[0], 0.5)])
            b.store(outer.results[0], y, [ALL])
    got = run(verify(f.op), {"x": x})["y"]
    want = np.zeros(6, dtype=F32)
    for o in range(0, 6, 2):
        for i in range(o, 6):
            want = want + x[i]
        want = want * np.float32(0.5)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_unwritten_outputs_are_poisoned(rng):
    b = Builder()
    with b.func("t", inputs=[("x", tensor(DType.F32, 4, 3))],
                outputs=[("y", tensor(DType.F32, 4, 3)), ("n", tensor(DType.I32, 4)), ("m", tensor(DType.BF16, 4))]) as f:
        x, y, n, m = f.args
        with b.parallel([(1, 3)]) as (i,):
            b.store(b.load(x, [i]), y, [i])
            b.store(7, n, [i])
            b.store(b.cast(b.reduce("sum", b.load(x, [i])), DType.BF16), m, [i])
    x_ = rand(rng, (4, 3), F32)
    out = run(verify(f.op), {"x": x_})
    assert np.all(np.isnan(out["y"][[0, 3]])) and np.array_equal(out["y"][1:3], x_[1:3])
    assert list(out["n"]) == [np.iinfo(np.int32).min, 7, 7, np.iinfo(np.int32).min]
    assert np.isnan(out["m"][0].astype(F32)) and not np.isnan(out["m"][1].astype(F32))


# ---------------------------------------------------------------------------------------------
# binding arguments

def _sig_func():
    b = Builder()
    N = SymDim("N")
    with b.func("t", inputs=[("a", tensor(DType.F32, N, 4)), ("b", tensor(DType.I32, SymDim("N", 1))),
                             ("s", scalar(DType.F32))],
                outputs=[("y", tensor(DType.F32, N))], defaults={"s": "N * 2"}) as f:
        a, b_, s, y = f.args
        with b.parallel([(0, b.dim("N"))]) as (i,):
            b.store(b.binary("add", b.reduce("sum", b.load(a, [i])), s), y, [i])
    return verify(f.op)


def test_bind_arguments_binds_symbols_and_defaults(rng):
    f = _sig_func()
    a = rand(rng, (3, 4), F32)
    dims, env = bind_arguments(f, {"a": a, "b": rand(rng, (4,), I32)})
    assert dims == {"N": 3}
    assert float(env[f.arg("s")]) == 6.0
    assert np.all(np.isnan(env[f.arg("y")])) and env[f.arg("y")].shape == (3,)
    y = run(f, {"a": a, "b": rand(rng, (4,), I32), "s": 1.5})["y"]
    np.testing.assert_allclose(y, a.sum(1) + 1.5, rtol=1e-6)


def test_bind_arguments_errors(rng):
    f = _sig_func()
    a, bb = rand(rng, (3, 4), F32), rand(rng, (4,), I32)
    with pytest.raises(KfcError, match="dtype float64"):
        bind_arguments(f, {"a": a.astype(F64), "b": bb})
    with pytest.raises(KfcError, match=r"symbol N is 3 .* but 5 from 'b'"):
        bind_arguments(f, {"a": a, "b": rand(rng, (6,), I32)})
    with pytest.raises(KfcError, match="symbol N is 7 from the given dims"):
        bind_arguments(f, {"a": a, "b": bb}, dims={"N": 7})
    with pytest.raises(KfcError, match="missing input 'b'"):
        bind_arguments(f, {"a": a})
    with pytest.raises(KfcError, match="dim 1 is 5, the signature fixes it at 4"):
        bind_arguments(f, {"a": rand(rng, (3, 5), F32), "b": bb})
    with pytest.raises(KfcError, match="has 1 dims"):
        bind_arguments(f, {"a": a[0], "b": bb})
    with pytest.raises(KfcError, match="no input named 'c'"):
        bind_arguments(f, {"a": a, "b": bb, "c": a})
    with pytest.raises(KfcError, match="must be f32"):
        bind_arguments(f, {"a": a, "b": bb}, outputs={"y": np.zeros((4,), F32)})


def test_bind_arguments_scalars_and_unbound_symbols(rng):
    b = Builder()
    with b.func("t", inputs=[("a", tensor(DType.F32, 4)), ("s", scalar(DType.I32))],
                outputs=[("y", tensor(DType.F32, SymDim("Q")))]) as f:
        pass
    f = verify(f.op)
    a = rand(rng, (4,), F32)
    with pytest.raises(KfcError, match="missing scalar input 's'"):
        bind_arguments(f, {"a": a}, dims={"Q": 2})
    with pytest.raises(KfcError, match="cannot size output 'y'.*Q"):
        bind_arguments(f, {"a": a, "s": 3})
    dims, env = bind_arguments(f, {"a": a, "s": 3.9}, dims={"Q": 2})
    assert env[f.arg("s")].dtype == I32 and int(env[f.arg("s")]) == 3
    assert env[f.arg("y")].shape == (2,)


def test_every_op_carries_its_own_semantics():
    # the interpreter dispatches on nothing but an op's interpret method (kfc.func is the
    # program itself, tile.yield ends a block)
    import kfc.passes  # noqa: F401  (every dialect registered)
    from kfc.ir.core import OP_REGISTRY

    missing = sorted(name for name, cls in OP_REGISTRY.items() if not callable(getattr(cls, "interpret", None)))
    assert missing == ["kfc.func", "tile.yield"]


def test_an_op_without_semantics_is_reported_at_the_op():
    import attrs

    from kfc.ir.core import Op
    from kfc.ir.interpreter import Interpreter

    @attrs.frozen(eq=False, kw_only=True)
    class Mystery(Op):
        NAME = "test.mystery"

    with pytest.raises(InterpretError, match="no semantics for test.mystery"):
        Interpreter(None, {}).exec_op(Mystery(), {})

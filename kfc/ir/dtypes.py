"""Element types: their names in `.kfc` and IR text, their numpy/torch counterparts, promotion."""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    BF16 = "bf16"
    F16 = "f16"
    F32 = "f32"
    F64 = "f64"
    E4M3 = "e4m3"
    E5M2 = "e5m2"
    I8 = "i8"
    U8 = "u8"
    I32 = "i32"
    I64 = "i64"
    INDEX = "index"
    BOOL = "bool"

    def __str__(self) -> str:
        return self.value

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def is_bool(self) -> bool:
        return self is DType.BOOL

    @property
    def is_exact(self) -> bool:
        """Whether one rounding step moves a value to another code (integers, bools, fp8): such
        outputs get no approximate arithmetic and are compared bit for bit."""
        return not self.is_float or self.bits < 16

    @property
    def bits(self) -> int:
        return _BITS[self]

    @property
    def itemsize(self) -> int:
        return max(self.bits // 8, 1)

    @property
    def np(self) -> np.dtype:
        """The numpy dtype that holds values of this type exactly (ml_dtypes for bf16/fp8)."""
        return _NUMPY[self]

    @property
    def compute_np(self) -> np.dtype:
        """The numpy dtype arithmetic on this type is carried out in (fp32 for narrow floats)."""
        if self in (DType.BF16, DType.F16, DType.E4M3, DType.E5M2):
            return np.dtype(np.float32)
        return self.np

    @property
    def torch(self):
        import torch  # lazy: ~1 s cold (measured); kfc.ir loads without torch, only checks and runtime use it

        return {
            DType.BF16: torch.bfloat16,
            DType.F16: torch.float16,
            DType.F32: torch.float32,
            DType.F64: torch.float64,
            DType.E4M3: torch.float8_e4m3fn,
            DType.E5M2: torch.float8_e5m2,
            DType.I8: torch.int8,
            DType.U8: torch.uint8,
            DType.I32: torch.int32,
            DType.I64: torch.int64,
            DType.INDEX: torch.int64,
            DType.BOOL: torch.bool,
        }[self]


_NARROW_FLOATS = (np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))
_FLOATS = frozenset({DType.BF16, DType.F16, DType.F32, DType.F64, DType.E4M3, DType.E5M2})
_INTS = frozenset({DType.I8, DType.U8, DType.I32, DType.I64, DType.INDEX})
_BITS = {
    DType.BF16: 16, DType.F16: 16, DType.F32: 32, DType.F64: 64, DType.E4M3: 8,
    DType.E5M2: 8, DType.I8: 8, DType.U8: 8, DType.I32: 32, DType.I64: 64, DType.INDEX: 64, DType.BOOL: 1,
}
_NUMPY = {
    DType.BF16: np.dtype(ml_dtypes.bfloat16),
    DType.F16: np.dtype(np.float16),
    DType.F32: np.dtype(np.float32),
    DType.F64: np.dtype(np.float64),
    DType.E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DType.I8: np.dtype(np.int8),
    DType.U8: np.dtype(np.uint8),
    DType.I32: np.dtype(np.int32),
    DType.I64: np.dtype(np.int64),
    DType.INDEX: np.dtype(np.int64),
    DType.BOOL: np.dtype(np.bool_),
}

DTYPE_NAMES = {d.value: d for d in DType}

E4M3_MAX = 448.0  # e4m3fn has no infinity: torch saturates to its largest finite value


def convert(x, dtype: DType) -> np.ndarray:
    """x as an array of `dtype`, rounded as torch's `.to()` rounds, which is what the generated
    code computes too: floats to nearest even; e4m3 saturated to ±448 (infinities too); e5m2
    overflowing to ±inf; NaN to the sign-keeping NaN torch writes (0x7f/0xff in both fp8
    formats); floats to integers truncated toward zero, clamped to the integer's range, NaN to 0
    (the GPU's cvt.rzi; torch wraps out-of-range values on the CPU, a result C++ leaves undefined)."""
    a = np.asarray(x)
    src = a.dtype
    if src == _NUMPY[dtype]:  # nothing to round: the interpreter's common case, kept cheap
        return a.copy()
    if dtype.is_int and (np.issubdtype(src, np.floating) or src in _NARROW_FLOATS):
        f = a.astype(np.float64)
        info = np.iinfo(dtype.np)
        with np.errstate(invalid="ignore"):
            f = np.clip(np.trunc(np.nan_to_num(f, nan=0.0, posinf=info.max, neginf=info.min)), info.min, info.max)
        return f.astype(dtype.np)
    if dtype in (DType.E4M3, DType.E5M2) and a.dtype != dtype.np:
        # one rounding: narrow floats widen exactly, numpy's floats and integers convert directly
        f = a.astype(np.float32) if src in _NARROW_FLOATS else a if np.issubdtype(src, np.floating) else a.astype(np.float64)
        if dtype is DType.E4M3:
            with np.errstate(invalid="ignore"):
                f = np.where(np.isnan(f), f, np.clip(f, -E4M3_MAX, E4M3_MAX))
        out = np.asarray(f.astype(dtype.np))
        nan = np.isnan(f)
        if nan.any():
            bits = out.view(np.uint8).copy()
            bits[nan] = np.where(np.signbit(f[nan]), 0xFF, 0x7F)
            out = bits.view(dtype.np)
        return out
    with np.errstate(all="ignore"):
        return a.astype(dtype.np)


def parse_dtype(name: str) -> DType | None:
    return DTYPE_NAMES.get(name)


def dtype_of_torch(torch_dtype) -> DType | None:
    """The kfc dtype a torch dtype holds (index maps to i64's torch.int64, so i64 wins)."""
    for d in DType:
        if d is not DType.INDEX and d.torch == torch_dtype:
            return d
    return None


def spoken(dtype) -> str:
    """A dtype as a message names it: `index` (the IR's dtype of loop indices, dims and integer
    literals) is written i64 in a program, so users read i64; the IR text keeps `index`."""
    return "i64" if dtype is DType.INDEX else str(dtype)


def promote_ints(a: DType, b: DType) -> DType:
    """Integers mix freely, as in C: the wider wins and `index` counts as the widest."""
    if a is DType.INDEX or b is DType.INDEX:
        return DType.INDEX
    return a if a.bits >= b.bits else b


def poison_value(dtype: DType):
    """What an unwritten output element holds: NaN for floats, an unlikely value otherwise."""
    if dtype.is_float:
        return np.nan
    if dtype.is_bool:
        return True
    return np.iinfo(dtype.np).min

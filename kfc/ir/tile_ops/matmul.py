"""The tile dialect's contractions: tile.dot, a matrix product of 2-D tiles, and tile.tri_inv, the
inverse of a unit lower-triangular tile (KDA's chunk solve)."""

from __future__ import annotations

import numpy as np

from ..core import Op, define_op
from ..dtypes import DType
from ..types import TensorType, bare_type
from .checks import reg_tile_of, shape_str


PRECISIONS = ("ieee", "tf32", "tf32x3", "bf16")


def round_tf32(x: np.ndarray) -> np.ndarray:
    """f32 values rounded to TF32 (the top 10 of 23 mantissa bits) to nearest, ties to even, as
    cvt.rn.tf32.f32 (sm_90 and later; one F2FP instruction): just under half a TF32 unit, plus
    the kept part's lowest bit, added to the magnitude's bits, then the low 13 bits cleared.
    Infinities and NaNs pass unchanged (the carry would change their class)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    odd = (bits >> np.uint32(13)) & np.uint32(1)
    rounded = (bits + np.uint32(0xFFF) + odd) & np.uint32(0xFFFFE000)
    return np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """f32 values rounded to bf16 (the top 7 of 23 mantissa bits) to nearest, ties to even, and
    held in f32, as cvt.rn.bf16x2.f32 packs an mma.sync operand; NaNs pass unchanged."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    odd = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + odd) & np.uint32(0xFFFF0000)
    return np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)


OPERAND_ROUNDING = {"tf32": round_tf32, "bf16": round_bf16}


def split_tf32(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 values as the sum of two TF32 values, hi = x rounded and lo = what is left rounded:
    hi + lo is x to about 2^-22 of itself (3xTF32's operands)."""
    x = np.asarray(x, dtype=np.float32)
    hi = round_tf32(x)
    return hi, round_tf32(x - hi)


def tf32x3_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a b as three TF32 products summed in f32, lo(a) hi(b) + hi(a) lo(b) + hi(a) hi(b), the
    small terms first (lo lo, below f32's last bit of the sum, is left out): an f32 product to
    about 2^-21 on tensor cores."""
    (ah, al), (bh, bl) = split_tf32(a), split_tf32(b)
    return np.matmul(al, bh) + np.matmul(ah, bl) + np.matmul(ah, bh)


@define_op("tile.dot", traits={"pure"}, operands=2, results=1)
class DotOp(Op):
    """Matrix product of 2-D tiles with fp32 accumulation (i32 for integer operands).

    `precision` says how f32 operands enter the products: "ieee" as they are, "tf32" rounded to
    TF32 first (10 mantissa bits, to nearest, ties to even: cvt.rn.tf32.f32), as tensor
    cores take them (the tf32-dots pass sets it), "tf32x3" each split into two TF32 values and
    multiplied as three TF32 products (tf32x3_product; `tf32-dots{split=3}`), "bf16" rounded to
    bf16 (7 mantissa bits, as cvt.rn.bf16x2.f32; the bf16-dots pass); the interpreter rounds
    them the same way."""

    trans_a: bool = False
    trans_b: bool = False
    precision: str = "ieee"

    @staticmethod
    def mnk(a: TensorType, b: TensorType, trans_a: bool, trans_b: bool):
        m, ka = (a.shape[1], a.shape[0]) if trans_a else (a.shape[0], a.shape[1])
        kb, n = (b.shape[1], b.shape[0]) if trans_b else (b.shape[0], b.shape[1])
        return m, n, ka, kb

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        a, b = operand_types
        m, n, _, _ = cls.mnk(a, b, attributes.get("trans_a", False), attributes.get("trans_b", False))
        acc = DType.I32 if a.dtype.is_int else DType.F32
        return [TensorType(acc, (m, n))]

    def verify_(self) -> None:
        a = reg_tile_of(self, self.operands[0], "lhs")
        b = reg_tile_of(self, self.operands[1], "rhs")
        if a.rank != 2 or b.rank != 2:
            raise self.error(f"operands must be 2-D, not {shape_str(a.shape)} and {shape_str(b.shape)}")
        if a.dtype != b.dtype:
            raise self.error(f"operand dtypes differ: {a.dtype} and {b.dtype}")
        if not (a.dtype.is_float or a.dtype in (DType.I8,)):
            raise self.error(f"operands must be floating point or i8, not {a.dtype}")
        if a.dtype is DType.F64:  # the product sums in f32: f64 operands would lose their precision unseen
            raise self.error("sums its products in f32, so f64 operands would keep only f32's precision",
                             "convert them to say so: dot(f32(a), f32(b))")
        m, n, ka, kb = self.mnk(a, b, self.trans_a, self.trans_b)
        if ka != kb:
            raise self.error(f"contraction dims differ: {ka} and {kb} "
                             f"({shape_str(a.shape)}{'ᵀ' if self.trans_a else ''} · "
                             f"{shape_str(b.shape)}{'ᵀ' if self.trans_b else ''})")
        if self.precision not in PRECISIONS:
            raise self.error(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.precision != "ieee" and a.dtype is not DType.F32:
            raise self.error(f"precision {self.precision} rounds f32 operands, not {a.dtype}")
        if bare_type(self.result.type) != bare_type(self.infer_result_types([a, b], self.attributes())[0]):
            raise self.error(f"result type {self.result.type} must be {self.infer_result_types([a, b], self.attributes())[0]}")

    def interpret(self, interp, ins, env):
        a, b = ins
        if self.operands[0].ttype.dtype.is_int:
            a, b = a.astype(np.int64), b.astype(np.int64)
        else:
            a, b = a.astype(np.float32), b.astype(np.float32)
            if self.precision in OPERAND_ROUNDING:
                a, b = OPERAND_ROUNDING[self.precision](a), OPERAND_ROUNDING[self.precision](b)
        if self.trans_a:
            a = a.T
        if self.trans_b:
            b = b.T
        product = tf32x3_product(a, b) if self.precision == "tf32x3" else np.matmul(a, b)
        return [interp.result_array(self, product)]


@define_op("tile.tri_inv", traits={"pure"}, operands=1, results=1)
class TriInvOp(Op):
    """(I + tril(x, -1))^-1 of a square f32 tile: the inverse of the unit lower-triangular
    matrix whose strictly lower part is x's (x's diagonal and upper part are not read). Row i
    of the result is e_i minus row i of the strict lower part times the rows above it (forward
    substitution in f32, as the lower-tri-inv pass writes it with tile.dot)."""

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[0]]

    def verify_(self) -> None:
        x = reg_tile_of(self, self.operands[0], "operand")
        if x.rank != 2 or x.shape[0] != x.shape[1] or not isinstance(x.shape[0], int):
            raise self.error(f"inverts a square tile of a fixed size, not {shape_str(x.shape)}")
        if x.dtype is not DType.F32:
            raise self.error(f"inverts an f32 tile, not {x.dtype}", "cast it: tri_inv(f32(x))")
        if bare_type(self.result.type) != bare_type(x):
            raise self.error(f"its result is its operand's type {x}, not {self.result.type}")

    def interpret(self, interp, ins, env):
        strict = np.tril(np.asarray(ins[0], dtype=np.float32), -1)
        out = np.eye(strict.shape[0], dtype=np.float32)
        for i in range(1, strict.shape[0]):
            out[i] = out[i] - (strict[i:i + 1] @ out)[0]
        return [interp.result_array(self, out)]

"""The tile dialect's constants and generators (const, dim, iota, tri) and its elementwise ops:
unary and binary math declared as data, one class each, and cmp, where and cast.

Operands of elementwise ops have identical types (the builder inserts explicit broadcasts and
integer promotions).
"""

from __future__ import annotations

import enum
from typing import ClassVar

import attrs
import numpy as np

from ...diagnostics import InterpretError
from ..core import Op, define_op
from ..dtypes import DType, convert
from ..elementwise_fns import BINARY_FNS, CMP_FNS, UNARY_FNS
from ..types import TensorType
from .checks import check_operands, check_results, reg_tile_of, same_shape, shape_str


# ---------------------------------------------------------------------------------------------
# constants and generators


@define_op("tile.const", traits={"pure"}, operands=0, results=1)
class ConstOp(Op):
    """A tile (or scalar) whose every element is `value`."""

    value: bool | int | float

    def verify_(self) -> None:
        t = reg_tile_of(self, self.result, "result")
        v = self.value
        if t.dtype.is_bool and not isinstance(v, bool):
            raise self.error(f"a bool constant needs true or false, not {v!r}")
        if t.dtype.is_int and (isinstance(v, bool) or not isinstance(v, int)):
            raise self.error(f"an {t.dtype} constant needs an integer value, not {v!r}")
        if t.dtype.is_int:
            info = np.iinfo(t.dtype.np)  # u8 is 0 to 255, the signed types two's complement
            lo, hi = int(info.min), int(info.max)
            if not lo <= v <= hi:
                raise self.error(f"{v} does not fit in {t.dtype} (range {lo} to {hi})")
        if t.dtype.is_float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise self.error(f"a {t.dtype} constant needs a number, not {v!r}")

    def interpret(self, interp, ins, env):
        t = self.result.ttype
        return [convert(np.full(interp.shape_of(t), self.value, dtype=np.float64 if t.dtype.is_float else None), t.dtype)]


@define_op("tile.dim", traits={"pure"}, operands=0, results=1)
class DimOp(Op):
    """The run-time value of a symbolic dimension (specialisation turns it into a constant)."""

    sym: str

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [TensorType(DType.INDEX)]

    def interpret(self, interp, ins, env):
        if self.sym not in interp.dims:
            raise InterpretError(f"shape symbol {self.sym} is not bound", self.loc)
        return [np.asarray(interp.dims[self.sym], dtype=np.int64)]


@define_op("tile.iota", traits={"pure"}, operands=0, results=1)
class IotaOp(Op):
    """0, 1, ..., n-1 as a 1-D integer tile."""

    def verify_(self) -> None:
        t = reg_tile_of(self, self.result, "result")
        if t.rank != 1 or not t.dtype.is_int:
            raise self.error(f"result must be a 1-D integer tile, not {t}")

    def interpret(self, interp, ins, env):
        t = self.result.ttype
        return [np.arange(interp.shape_of(t)[0]).astype(t.dtype.np)]


@define_op("tile.tri", traits={"pure"}, operands=0, results=1)
class TriOp(Op):
    """A triangular boolean mask: lower keeps (i, j) with j <= i + k, upper j >= i + k."""

    lower: bool = True
    k: int = 0

    def verify_(self) -> None:
        t = reg_tile_of(self, self.result, "result")
        if t.rank != 2 or t.dtype is not DType.BOOL:
            raise self.error(f"result must be a 2-D bool tile, not {t}")

    def interpret(self, interp, ins, env):
        r, c = interp.shape_of(self.result.ttype)
        ones = np.ones((r, c), dtype=bool)
        return [np.tril(ones, self.k) if self.lower else np.triu(ones, self.k)]


# ---------------------------------------------------------------------------------------------
# elementwise


class OperandKind(enum.Enum):
    FLOAT = "float"          # floating point only
    NUMERIC = "numeric"      # float or integer
    LOGICAL = "logical"      # bool or integer
    ANY = "any"


def kind_accepts(kind: OperandKind, d: DType) -> bool:
    if kind is OperandKind.FLOAT:
        return d.is_float
    if kind is OperandKind.NUMERIC:
        return d.is_float or d.is_int
    if kind is OperandKind.LOGICAL:
        return d.is_bool or d.is_int
    return True


KIND_WORDS = {
    OperandKind.FLOAT: "a floating-point",
    OperandKind.NUMERIC: "a numeric",
    OperandKind.LOGICAL: "a bool or integer",
    OperandKind.ANY: "any",
}


@attrs.frozen(eq=False, kw_only=True)
class UnaryOp(Op):
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure", "elementwise"})
    OPERAND_KIND: ClassVar[OperandKind] = OperandKind.FLOAT

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[0]]

    def verify_(self) -> None:
        check_operands(self, 1)
        check_results(self, 1)
        t = reg_tile_of(self, self.operands[0], "operand")
        if not kind_accepts(self.OPERAND_KIND, t.dtype):
            raise self.error(f"needs {KIND_WORDS[self.OPERAND_KIND]} operand, not {t.dtype}",
                             "cast it first, e.g. f32(x)")
        if self.result.type != t:
            raise self.error(f"result type {self.result.type} differs from operand type {t}")

    def interpret(self, interp, ins, env):
        ct = self.operands[0].ttype.dtype.compute_np
        with np.errstate(all="ignore"):
            fn = getattr(self, "FN", None) or self.NAME.split(".")[1]
            return [interp.result_array(self, UNARY_FNS[fn](ins[0].astype(ct, copy=False)))]


@attrs.frozen(eq=False, kw_only=True)
class BinaryOp(Op):
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure", "elementwise"})
    OPERAND_KIND: ClassVar[OperandKind] = OperandKind.NUMERIC

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[0]]

    def verify_(self) -> None:
        check_operands(self, 2)
        check_results(self, 1)
        a = reg_tile_of(self, self.operands[0], "lhs")
        b = reg_tile_of(self, self.operands[1], "rhs")
        if a.dtype != b.dtype:
            raise self.error(f"operand dtypes differ: {a.dtype} and {b.dtype}")
        if not same_shape(a.shape, b.shape):
            raise self.error(f"operand shapes differ: {shape_str(a.shape)} and {shape_str(b.shape)}")
        if not kind_accepts(self.OPERAND_KIND, a.dtype):
            raise self.error(f"needs {KIND_WORDS[self.OPERAND_KIND]} operands, not {a.dtype}")
        if self.result.type != a:
            raise self.error(f"result type {self.result.type} differs from operand type {a}")

    def interpret(self, interp, ins, env):
        ct = self.operands[0].ttype.dtype.compute_np
        with np.errstate(all="ignore"):
            a, b = (x.astype(ct, copy=False) for x in ins)
            return [interp.result_array(self, BINARY_FNS[self.NAME.split(".")[1]](a, b))]


# name -> operand kind; declared as data, one class each
UNARY_OPS: dict[str, OperandKind] = {
    "neg": OperandKind.NUMERIC, "abs": OperandKind.NUMERIC, "not": OperandKind.LOGICAL,
    "exp": OperandKind.FLOAT, "exp2": OperandKind.FLOAT, "log": OperandKind.FLOAT,
    "log2": OperandKind.FLOAT, "sqrt": OperandKind.FLOAT, "rsqrt": OperandKind.FLOAT,
    "sigmoid": OperandKind.FLOAT, "softplus": OperandKind.FLOAT, "tanh": OperandKind.FLOAT,
    "round": OperandKind.FLOAT,
}
BINARY_OPS: dict[str, OperandKind] = {
    "add": OperandKind.NUMERIC, "sub": OperandKind.NUMERIC, "mul": OperandKind.NUMERIC,
    "div": OperandKind.NUMERIC, "rem": OperandKind.NUMERIC, "max": OperandKind.NUMERIC,
    "min": OperandKind.NUMERIC, "pow": OperandKind.FLOAT, "and": OperandKind.LOGICAL,
    "or": OperandKind.LOGICAL, "xor": OperandKind.LOGICAL,
}
COMMUTATIVE = frozenset({"add", "mul", "max", "min", "and", "or", "xor"})


def _make_elementwise(base: type, name: str, kind: OperandKind) -> type:
    traits = base.TRAITS | ({"commutative"} if name in COMMUTATIVE else set())
    cls = type(f"{name.capitalize()}Op", (base,), {"OPERAND_KIND": kind, "__doc__": f"Elementwise {name}."})
    return define_op(f"tile.{name}", traits=traits)(cls)


UNARY_CLASSES = {n: _make_elementwise(UnaryOp, n, k) for n, k in UNARY_OPS.items()}
BINARY_CLASSES = {n: _make_elementwise(BinaryOp, n, k) for n, k in BINARY_OPS.items()}


class CmpPred(enum.Enum):
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    EQ = "eq"
    NE = "ne"


@define_op("tile.cmp", traits={"pure", "elementwise"}, operands=2, results=1)
class CmpOp(Op):
    pred: CmpPred = attrs.field(converter=CmpPred)

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[0].with_dtype(DType.BOOL)]

    def verify_(self) -> None:
        a = reg_tile_of(self, self.operands[0], "lhs")
        b = reg_tile_of(self, self.operands[1], "rhs")
        if a != b:
            raise self.error(f"operand types differ: {a} and {b}")
        if self.result.type != a.with_dtype(DType.BOOL):
            raise self.error(f"result must be {a.with_dtype(DType.BOOL)}, not {self.result.type}")

    def interpret(self, interp, ins, env):
        ct = self.operands[0].ttype.dtype.compute_np
        a, b = (x.astype(ct, copy=False) for x in ins)
        return [np.asarray(CMP_FNS[self.pred.value](a, b))]


@define_op("tile.where", traits={"pure", "elementwise"}, operands=3, results=1)
class WhereOp(Op):
    """where(cond, a, b): a where cond holds, else b."""

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[1]]

    def verify_(self) -> None:
        c = reg_tile_of(self, self.operands[0], "condition")
        a = reg_tile_of(self, self.operands[1], "true value")
        b = reg_tile_of(self, self.operands[2], "false value")
        if c.dtype is not DType.BOOL:
            raise self.error(f"condition must be bool, not {c.dtype}", "compare to get a mask, e.g. x > 0")
        if a != b:
            raise self.error(f"the two values differ in type: {a} and {b}")
        if not same_shape(c.shape, a.shape):
            raise self.error(f"condition shape {shape_str(c.shape)} differs from value shape {shape_str(a.shape)}")
        if self.result.type != a:
            raise self.error(f"result type {self.result.type} differs from {a}")

    def interpret(self, interp, ins, env):
        c, a, b = ins
        return [interp.result_array(self, np.where(c, a, b))]


@define_op("tile.bitcast", traits={"pure", "elementwise"}, operands=1, results=1)
class BitcastOp(Op):
    """The same bits read as another dtype of the same width (an e4m3 code as a u8, an f32's
    bits as an i32)."""

    def verify_(self) -> None:
        a = reg_tile_of(self, self.operands[0], "operand")
        r = reg_tile_of(self, self.result, "result")
        if not same_shape(a.shape, r.shape):
            raise self.error(f"a bitcast keeps the shape: {shape_str(a.shape)} became {shape_str(r.shape)}")
        if a.dtype.is_bool or r.dtype.is_bool or a.dtype.bits != r.dtype.bits:
            raise self.error(f"a bitcast keeps the width: {a.dtype} has {a.dtype.bits} bits, {r.dtype} {r.dtype.bits}",
                             "bitcast between dtypes of one width (e4m3, e5m2, i8, u8; bf16, f16; f32, i32; f64, i64)")

    def interpret(self, interp, ins, env):
        x = np.ascontiguousarray(ins[0])
        return [x.view(self.result.ttype.dtype.np).reshape(x.shape)]


@define_op("tile.cast", traits={"pure", "elementwise"}, operands=1, results=1)
class CastOp(Op):
    """Convert element type as torch's `.to()` does (kfc.ir.dtypes.convert): floats round to
    nearest even, e4m3 saturates, floats to ints truncate and clamp, NaN to an int is 0."""

    def verify_(self) -> None:
        a = reg_tile_of(self, self.operands[0], "operand")
        r = reg_tile_of(self, self.result, "result")
        if not same_shape(a.shape, r.shape):
            raise self.error(f"a cast keeps the shape: {shape_str(a.shape)} became {shape_str(r.shape)}")

    def interpret(self, interp, ins, env):
        return [convert(ins[0], self.result.ttype.dtype)]

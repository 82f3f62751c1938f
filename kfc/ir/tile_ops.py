"""The `tile` dialect: hardware-agnostic tensor math over tiles, loads/stores of global tensors,
parallel loops and sequential loops with carried values.

Operands of elementwise ops have identical types (the builder inserts explicit broadcasts and
integer promotions); everything a later pass or the interpreter needs is in the types and the
attributes declared on each class.
"""

from __future__ import annotations

import enum
import itertools
from typing import ClassVar

import attrs
import numpy as np

from ..diagnostics import InterpretError
from .core import Op, Value, register_op
from .dtypes import DType
from .elementwise_fns import BINARY_FNS, CMP_FNS, UNARY_FNS
from .types import Dim, MemSpace, TensorType, bare_type


# ---------------------------------------------------------------------------------------------
# helpers shared by verify_ methods


def _tt(op: Op, v: Value, what: str) -> TensorType:
    if not isinstance(v.type, TensorType):
        raise op.error(f"{what} must be a tensor or tile, not {v.type}")
    return v.type


def _reg(op: Op, v: Value, what: str) -> TensorType:
    t = _tt(op, v, what)
    if t.space is not MemSpace.REG:
        raise op.error(f"{what} must be a register tile, not {t}",
                       "load the tensor into a tile first, e.g. x[m, :]")
    return t


def _int_scalar(op: Op, v: Value, what: str) -> None:
    t = _tt(op, v, what)
    if not (t.is_scalar and t.dtype.is_int):
        raise op.error(f"{what} must be an integer scalar, not {t}")


def _same_shape(a: tuple[Dim, ...], b: tuple[Dim, ...]) -> bool:
    return tuple(a) == tuple(b)


def _shape_str(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _check_results(op: Op, n: int) -> None:
    if len(op.results) != n:
        raise op.error(f"expects {n} result(s), has {len(op.results)}")


def _check_operands(op: Op, n: int) -> None:
    if len(op.operands) != n:
        raise op.error(f"expects {n} operand(s), has {len(op.operands)}")


# ---------------------------------------------------------------------------------------------
# constants and generators


@register_op
@attrs.frozen(eq=False, kw_only=True)
class ConstOp(Op):
    """A tile (or scalar) whose every element is `value`."""

    NAME: ClassVar[str] = "tile.const"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})
    value: bool | int | float

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 1)
        t = _reg(self, self.result, "result")
        v = self.value
        if t.dtype.is_bool and not isinstance(v, bool):
            raise self.error(f"a bool constant needs true or false, not {v!r}")
        if t.dtype.is_int and (isinstance(v, bool) or not isinstance(v, int)):
            raise self.error(f"an {t.dtype} constant needs an integer value, not {v!r}")
        if t.dtype.is_int:
            lo, hi = -(1 << (t.dtype.bits - 1)), (1 << (t.dtype.bits - 1)) - 1
            if not lo <= v <= hi:
                raise self.error(f"{v} does not fit in {t.dtype} (range {lo} to {hi})")
        if t.dtype.is_float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise self.error(f"a {t.dtype} constant needs a number, not {v!r}")

    def interpret(self, interp, ins, env):
        t = self.result.ttype
        return [np.full(interp.shape_of(t), self.value, dtype=t.dtype.np)]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class DimOp(Op):
    """The run-time value of a symbolic dimension (specialisation turns it into a constant)."""

    NAME: ClassVar[str] = "tile.dim"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})
    sym: str

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [TensorType(DType.INDEX)]

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 1)

    def interpret(self, interp, ins, env):
        if self.sym not in interp.dims:
            raise InterpretError(f"shape symbol {self.sym} is not bound", self.loc)
        return [np.asarray(interp.dims[self.sym], dtype=np.int64)]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class IotaOp(Op):
    """0, 1, ..., n-1 as a 1-D integer tile."""

    NAME: ClassVar[str] = "tile.iota"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 1)
        t = _reg(self, self.result, "result")
        if t.rank != 1 or not t.dtype.is_int:
            raise self.error(f"result must be a 1-D integer tile, not {t}")

    def interpret(self, interp, ins, env):
        t = self.result.ttype
        return [np.arange(interp.shape_of(t)[0]).astype(t.dtype.np)]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class TriOp(Op):
    """A triangular boolean mask: lower keeps (i, j) with j <= i + k, upper j >= i + k."""

    NAME: ClassVar[str] = "tile.tri"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})
    lower: bool = True
    k: int = 0

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 1)
        t = _reg(self, self.result, "result")
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
        _check_operands(self, 1)
        _check_results(self, 1)
        t = _reg(self, self.operands[0], "operand")
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
        _check_operands(self, 2)
        _check_results(self, 1)
        a = _reg(self, self.operands[0], "lhs")
        b = _reg(self, self.operands[1], "rhs")
        if a.dtype != b.dtype:
            raise self.error(f"operand dtypes differ: {a.dtype} and {b.dtype}")
        if not _same_shape(a.shape, b.shape):
            raise self.error(f"operand shapes differ: {_shape_str(a.shape)} and {_shape_str(b.shape)}")
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
    cls = type(f"{name.capitalize()}Op", (base,), {
        "NAME": f"tile.{name}", "OPERAND_KIND": kind, "TRAITS": frozenset(traits),
        "__doc__": f"Elementwise {name}.", "__slots__": (),
    })
    return register_op(cls)


UNARY_CLASSES = {n: _make_elementwise(UnaryOp, n, k) for n, k in UNARY_OPS.items()}
BINARY_CLASSES = {n: _make_elementwise(BinaryOp, n, k) for n, k in BINARY_OPS.items()}


class CmpPred(enum.Enum):
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    EQ = "eq"
    NE = "ne"


@register_op
@attrs.frozen(eq=False, kw_only=True)
class CmpOp(Op):
    NAME: ClassVar[str] = "tile.cmp"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure", "elementwise"})
    pred: CmpPred = attrs.field(converter=CmpPred)

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[0].with_dtype(DType.BOOL)]

    def verify_(self) -> None:
        _check_operands(self, 2)
        _check_results(self, 1)
        a = _reg(self, self.operands[0], "lhs")
        b = _reg(self, self.operands[1], "rhs")
        if a != b:
            raise self.error(f"operand types differ: {a} and {b}")
        if self.result.type != a.with_dtype(DType.BOOL):
            raise self.error(f"result must be {a.with_dtype(DType.BOOL)}, not {self.result.type}")

    def interpret(self, interp, ins, env):
        ct = self.operands[0].ttype.dtype.compute_np
        a, b = (x.astype(ct, copy=False) for x in ins)
        return [np.asarray(CMP_FNS[self.pred.value](a, b))]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class WhereOp(Op):
    """where(cond, a, b): a where cond holds, else b."""

    NAME: ClassVar[str] = "tile.where"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure", "elementwise"})

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[1]]

    def verify_(self) -> None:
        _check_operands(self, 3)
        _check_results(self, 1)
        c = _reg(self, self.operands[0], "condition")
        a = _reg(self, self.operands[1], "true value")
        b = _reg(self, self.operands[2], "false value")
        if c.dtype is not DType.BOOL:
            raise self.error(f"condition must be bool, not {c.dtype}", "compare to get a mask, e.g. x > 0")
        if a != b:
            raise self.error(f"the two values differ in type: {a} and {b}")
        if not _same_shape(c.shape, a.shape):
            raise self.error(f"condition shape {_shape_str(c.shape)} differs from value shape {_shape_str(a.shape)}")
        if self.result.type != a:
            raise self.error(f"result type {self.result.type} differs from {a}")

    def interpret(self, interp, ins, env):
        c, a, b = ins
        return [interp.result_array(self, np.where(c, a, b))]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class CastOp(Op):
    """Convert element type; floats round to nearest even, floats to ints truncate."""

    NAME: ClassVar[str] = "tile.cast"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure", "elementwise"})

    def verify_(self) -> None:
        _check_operands(self, 1)
        _check_results(self, 1)
        a = _reg(self, self.operands[0], "operand")
        r = _reg(self, self.result, "result")
        if not _same_shape(a.shape, r.shape):
            raise self.error(f"a cast keeps the shape: {_shape_str(a.shape)} became {_shape_str(r.shape)}")

    def interpret(self, interp, ins, env):
        src = self.operands[0].ttype.dtype
        dst = self.result.ttype.dtype
        x = ins[0]
        if src.is_float and (dst.is_int):
            with np.errstate(invalid="ignore"):
                x = np.trunc(x.astype(np.float64))
        if dst.is_float and not src.is_float:
            x = x.astype(np.float64)
        with np.errstate(all="ignore"):
            return [np.asarray(x).astype(dst.np)]


# ---------------------------------------------------------------------------------------------
# shape manipulation


def broadcast_compatible(src: tuple[Dim, ...], dst: tuple[Dim, ...]) -> bool:
    """numpy rules: align right; each source dim equals the target's or is 1."""
    if len(src) > len(dst):
        return False
    for s, d in zip(reversed(src), reversed(dst)):
        if s != d and s != 1:
            return False
    return True


@register_op
@attrs.frozen(eq=False, kw_only=True)
class BroadcastOp(Op):
    NAME: ClassVar[str] = "tile.broadcast"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})

    def verify_(self) -> None:
        _check_operands(self, 1)
        _check_results(self, 1)
        a = _reg(self, self.operands[0], "operand")
        r = _reg(self, self.result, "result")
        if a.dtype != r.dtype:
            raise self.error(f"broadcast keeps the dtype: {a.dtype} became {r.dtype}")
        if not broadcast_compatible(a.shape, r.shape):
            raise self.error(f"cannot broadcast {_shape_str(a.shape)} to {_shape_str(r.shape)}")

    def interpret(self, interp, ins, env):
        return [np.broadcast_to(ins[0], interp.shape_of(self.result.ttype))]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class ExpandDimsOp(Op):
    """Insert size-1 dims at `axes` (positions in the result)."""

    NAME: ClassVar[str] = "tile.expand_dims"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})
    axes: tuple[int, ...] = attrs.field(converter=tuple)

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        t = operand_types[0]
        axes = sorted(attributes["axes"])
        shape = list(t.shape)
        for a in axes:
            shape.insert(a, 1)
        return [t.with_shape(shape)]

    def verify_(self) -> None:
        _check_operands(self, 1)
        _check_results(self, 1)
        a = _reg(self, self.operands[0], "operand")
        rank = a.rank + len(self.axes)
        if len(set(self.axes)) != len(self.axes) or any(not 0 <= x < rank for x in self.axes):
            raise self.error(f"axes {list(self.axes)} are invalid for a rank-{rank} result")
        if bare_type(self.result.type) != bare_type(self.infer_result_types([a], self.attributes())[0]):
            raise self.error(f"result type {self.result.type} does not match the inserted axes")

    def interpret(self, interp, ins, env):
        return [np.expand_dims(ins[0], tuple(self.axes))]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class ReshapeOp(Op):
    NAME: ClassVar[str] = "tile.reshape"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})

    def verify_(self) -> None:
        _check_operands(self, 1)
        _check_results(self, 1)
        a = _reg(self, self.operands[0], "operand")
        r = _reg(self, self.result, "result")
        if a.dtype != r.dtype:
            raise self.error(f"reshape keeps the dtype: {a.dtype} became {r.dtype}")
        if a.is_static and r.is_static:
            if a.numel() != r.numel():
                raise self.error(f"cannot reshape {a.numel()} elements {_shape_str(a.shape)} "
                                 f"into {r.numel()} {_shape_str(r.shape)}")
        elif [d for d in a.shape if d != 1] != [d for d in r.shape if d != 1]:
            raise self.error(f"a symbolic reshape may only add or drop size-1 dims: "
                             f"{_shape_str(a.shape)} to {_shape_str(r.shape)}")

    def interpret(self, interp, ins, env):
        return [np.reshape(ins[0], interp.shape_of(self.result.ttype))]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class TransposeOp(Op):
    NAME: ClassVar[str] = "tile.transpose"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})
    perm: tuple[int, ...] = attrs.field(converter=tuple)

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        t = operand_types[0]
        return [t.with_shape([t.shape[p] for p in attributes["perm"]])]

    def verify_(self) -> None:
        _check_operands(self, 1)
        _check_results(self, 1)
        a = _reg(self, self.operands[0], "operand")
        if sorted(self.perm) != list(range(a.rank)):
            raise self.error(f"perm {list(self.perm)} is not a permutation of {a.rank} axes")
        if bare_type(self.result.type) != bare_type(self.infer_result_types([a], self.attributes())[0]):
            raise self.error(f"result type {self.result.type} does not match the permutation")

    def interpret(self, interp, ins, env):
        return [np.transpose(ins[0], self.perm)]


# ---------------------------------------------------------------------------------------------
# reductions, scans, contractions


class ReduceKind(enum.Enum):
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


def reduced_shape(shape, axes, keepdims) -> list[Dim]:
    out = []
    for i, d in enumerate(shape):
        if i in axes:
            if keepdims:
                out.append(1)
        else:
            out.append(d)
    return out


@register_op
@attrs.frozen(eq=False, kw_only=True)
class ReduceOp(Op):
    """Reduce over `axes` (normalised, ascending). Floats accumulate in at least fp32."""

    NAME: ClassVar[str] = "tile.reduce"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})
    kind: ReduceKind = attrs.field(converter=ReduceKind)
    axes: tuple[int, ...] = attrs.field(converter=tuple)
    keepdims: bool = False

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        t = operand_types[0]
        return [t.with_shape(reduced_shape(t.shape, attributes["axes"], attributes.get("keepdims", False)))]

    def verify_(self) -> None:
        _check_operands(self, 1)
        _check_results(self, 1)
        a = _reg(self, self.operands[0], "operand")
        if not self.axes:
            raise self.error("reduces over no axis")
        if list(self.axes) != sorted(set(self.axes)) or any(not 0 <= x < a.rank for x in self.axes):
            raise self.error(f"axes {list(self.axes)} must be distinct, ascending and within rank {a.rank}")
        if self.kind in (ReduceKind.SUM, ReduceKind.MEAN, ReduceKind.PROD) and not (a.dtype.is_float or a.dtype.is_int):
            raise self.error(f"{self.kind.value} needs a numeric operand, not {a.dtype}")
        if self.kind is ReduceKind.MEAN and not a.dtype.is_float:
            raise self.error(f"mean needs a floating-point operand, not {a.dtype}", "cast first, e.g. f32(x)")
        if bare_type(self.result.type) != bare_type(self.infer_result_types([a], self.attributes())[0]):
            raise self.error(f"result type {self.result.type} does not match reducing {a} over {list(self.axes)}")

    def interpret(self, interp, ins, env):
        x = ins[0]
        d = self.operands[0].ttype.dtype
        acc = np.float32 if d.is_float and d.bits <= 32 else (np.float64 if d.is_float else np.int64)
        if d.is_bool:
            acc = np.bool_
        x = x.astype(acc, copy=False)
        axes = tuple(self.axes)
        kind = self.kind.value
        if kind == "sum":
            r = np.sum(x, axis=axes, keepdims=self.keepdims, dtype=acc)
        elif kind == "mean":
            r = np.mean(x, axis=axes, keepdims=self.keepdims, dtype=acc)
        elif kind == "prod":
            r = np.prod(x, axis=axes, keepdims=self.keepdims, dtype=acc)
        elif kind == "max":
            r = np.max(x, axis=axes, keepdims=self.keepdims) if x.size else interp.empty_reduction(self, -np.inf)
        else:
            r = np.min(x, axis=axes, keepdims=self.keepdims) if x.size else interp.empty_reduction(self, np.inf)
        return [interp.result_array(self, r)]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class MaxSumExpOp(Op):
    """A row's maximum m and the sum of exp(x - m) over it, together (online-softmax makes it of
    max(x) and sum(exp(x - max(x)))): the code generator reduces the pair (m, s) in one sweep,
    rescaling partial sums as the maximum grows, where the two reductions took two."""

    NAME: ClassVar[str] = "tile.max_sumexp"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})

    def verify_(self) -> None:
        _check_operands(self, 1)
        _check_results(self, 2)
        a = _reg(self, self.operands[0], "operand")
        if a.dtype is not DType.F32 or a.rank != 1:
            raise self.error(f"reduces an f32 row, not {a}", "cast the row first: f32(x)")
        for name, r in zip(("maximum", "sum"), self.results):
            t = _reg(self, r, name)
            if bare_type(t) != TensorType(DType.F32):
                raise self.error(f"its {name} is an f32 scalar, not {t}")

    def interpret(self, interp, ins, env):
        # as max(x), then sum(exp(x - max(x))) compute it: f32 differences, exponentials, sum
        x = ins[0].astype(np.float32, copy=False)
        m = np.max(x) if x.size else np.float32(-np.inf)
        with np.errstate(all="ignore"):
            s = np.sum(np.exp((x - m).astype(np.float32)), dtype=np.float32)
        return [interp.result_array(self, m, 0), interp.result_array(self, s, 1)]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class ScanOp(Op):
    """Prefix reduction along `axis` (cumsum for kind=sum)."""

    NAME: ClassVar[str] = "tile.scan"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})
    kind: ReduceKind = attrs.field(converter=ReduceKind)
    axis: int
    exclusive: bool = False
    reverse: bool = False

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[0]]

    def verify_(self) -> None:
        _check_operands(self, 1)
        _check_results(self, 1)
        a = _reg(self, self.operands[0], "operand")
        if not 0 <= self.axis < a.rank:
            raise self.error(f"axis {self.axis} is out of range for {a}")
        if self.kind is ReduceKind.MEAN:
            raise self.error("a scan cannot take the mean")
        if self.result.type != a:
            raise self.error(f"result type {self.result.type} differs from {a}")

    def interpret(self, interp, ins, env):
        x = ins[0]
        d = self.operands[0].ttype.dtype
        acc = np.float32 if d.is_float and d.bits <= 32 else (np.float64 if d.is_float else np.int64)
        x = x.astype(acc, copy=False)
        axis = self.axis
        if self.reverse:
            x = np.flip(x, axis)
        kind = self.kind.value
        if kind == "sum":
            r, ident = np.cumsum(x, axis=axis, dtype=acc), 0
        elif kind == "prod":
            r, ident = np.cumprod(x, axis=axis, dtype=acc), 1
        elif kind == "max":  # identities of the operand's own type (the accumulator's would wrap)
            r, ident = np.maximum.accumulate(x, axis=axis), (-np.inf if d.is_float else False if d.is_bool else np.iinfo(d.np).min)
        else:
            r, ident = np.minimum.accumulate(x, axis=axis), (np.inf if d.is_float else True if d.is_bool else np.iinfo(d.np).max)
        if self.exclusive:
            pad = np.full_like(np.take(r, [0], axis=axis), ident)
            r = np.concatenate([pad, np.take(r, np.arange(r.shape[axis] - 1), axis=axis)], axis=axis)
        if self.reverse:
            r = np.flip(r, axis)
        return [interp.result_array(self, r)]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class DotOp(Op):
    """Matrix product of 2-D tiles with fp32 accumulation (i32 for integer operands)."""

    NAME: ClassVar[str] = "tile.dot"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})
    trans_a: bool = False
    trans_b: bool = False

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
        _check_operands(self, 2)
        _check_results(self, 1)
        a = _reg(self, self.operands[0], "lhs")
        b = _reg(self, self.operands[1], "rhs")
        if a.rank != 2 or b.rank != 2:
            raise self.error(f"operands must be 2-D, not {_shape_str(a.shape)} and {_shape_str(b.shape)}")
        if a.dtype != b.dtype:
            raise self.error(f"operand dtypes differ: {a.dtype} and {b.dtype}")
        if not (a.dtype.is_float or a.dtype in (DType.I8,)):
            raise self.error(f"operands must be floating point or i8, not {a.dtype}")
        m, n, ka, kb = self.mnk(a, b, self.trans_a, self.trans_b)
        if ka != kb:
            raise self.error(f"contraction dims differ: {ka} and {kb} "
                             f"({_shape_str(a.shape)}{'ᵀ' if self.trans_a else ''} · "
                             f"{_shape_str(b.shape)}{'ᵀ' if self.trans_b else ''})")
        if bare_type(self.result.type) != bare_type(self.infer_result_types([a, b], self.attributes())[0]):
            raise self.error(f"result type {self.result.type} must be {self.infer_result_types([a, b], self.attributes())[0]}")

    def interpret(self, interp, ins, env):
        a, b = ins
        if self.operands[0].ttype.dtype.is_int:
            a, b = a.astype(np.int64), b.astype(np.int64)
        else:
            a, b = a.astype(np.float32), b.astype(np.float32)
        if self.trans_a:
            a = a.T
        if self.trans_b:
            b = b.T
        return [interp.result_array(self, np.matmul(a, b))]


# ---------------------------------------------------------------------------------------------
# memory


@attrs.frozen
class IndexDim:
    """How one dimension of a tensor is indexed by a load or store.

    point: one index operand, the dim is dropped (`x[m, ...]`)
    all:   the whole dim, no operand (`x[:, ...]`)
    slice: `size` elements from a start operand (`x[t:t+64]`); with `limit`, a second operand
           bounds the valid indices (`x[t:t+64 limit eos]`). Elements at or past the limit or
           the tensor's extent read as the load's `other` and are not stored.
    """

    kind: str
    size: int = 0
    limit: bool = False

    def to_attr(self) -> str:
        if self.kind == "point":
            return "i"
        if self.kind == "all":
            return ":"
        return f"+{self.size}" + ("<" if self.limit else "")

    @classmethod
    def parse(cls, text) -> "IndexDim":
        if isinstance(text, IndexDim):
            return text
        if text == "i":
            return cls("point")
        if text == ":":
            return cls("all")
        if isinstance(text, str) and text.startswith("+"):
            limit = text.endswith("<")
            body = text[1:-1] if limit else text[1:]
            if body.isdigit() and int(body) > 0:
                return cls("slice", int(body), limit)
        raise ValueError(f"bad index entry {text!r}: expected \"i\", \":\", \"+N\" or \"+N<\"")

    @property
    def n_operands(self) -> int:
        return {"point": 1, "all": 0}.get(self.kind, 2 if self.limit else 1)


def _index_tuple(items) -> tuple[IndexDim, ...]:
    return tuple(IndexDim.parse(x) for x in items)


def indexed_shape(t: TensorType, index: tuple[IndexDim, ...]) -> list[Dim]:
    shape = []
    for d, ix in zip(t.shape, index):
        if ix.kind == "all":
            shape.append(d)
        elif ix.kind == "slice":
            shape.append(ix.size)
    return shape


def _verify_index(op: Op, tensor: TensorType, index: tuple[IndexDim, ...], idx_operands) -> None:
    if tensor.space is MemSpace.REG:
        raise op.error(f"indexes a register tile {tensor}; loads and stores address memory")
    if len(index) != tensor.rank:
        raise op.error(f"{len(index)} index entries for a rank-{tensor.rank} tensor")
    need = sum(ix.n_operands for ix in index)
    if len(idx_operands) != need:
        raise op.error(f"index needs {need} operand(s), has {len(idx_operands)}")
    for v in idx_operands:
        _int_scalar(op, v, "index")


@register_op
@attrs.frozen(eq=False, kw_only=True)
class LoadOp(Op):
    """Read a tile from a tensor: operands are the tensor, then the index operands in order.
    Reading an absent optional tensor gives a tile filled with `other`."""

    NAME: ClassVar[str] = "tile.load"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"reads_memory"})
    index: tuple[IndexDim, ...] = attrs.field(converter=_index_tuple)
    other: bool | int | float = 0

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        t = operand_types[0]
        return [TensorType(t.dtype, tuple(indexed_shape(t, _index_tuple(attributes["index"]))))]

    def verify_(self) -> None:
        _check_results(self, 1)
        if not self.operands:
            raise self.error("needs a tensor operand")
        t = _tt(self, self.operands[0], "tensor")
        _verify_index(self, t, self.index, self.operands[1:])
        if bare_type(self.result.type) != bare_type(self.infer_result_types([t], self.attributes())[0]):
            raise self.error(f"result type {self.result.type} must be "
                             f"{self.infer_result_types([t], self.attributes())[0]}")

    def interpret(self, interp, ins, env):
        arr = ins[0]
        rt = self.result.ttype
        out_shape = interp.shape_of(rt)
        if arr is None:  # an absent optional tensor reads as `other`
            return [np.full(out_shape, self.other, dtype=rt.dtype.np)]
        arr = interp.readable(self, arr)
        return [interp.gather(self, self.operands[0].ttype, self.index, ins[1:], arr, self.other, out_shape, rt.dtype.np)]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class StoreOp(Op):
    """Write a tile into a tensor: operands are the value, the tensor, then index operands."""

    NAME: ClassVar[str] = "tile.store"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"writes_memory"})
    index: tuple[IndexDim, ...] = attrs.field(converter=_index_tuple)

    def verify_(self) -> None:
        _check_results(self, 0)
        if len(self.operands) < 2:
            raise self.error("needs a value and a tensor operand")
        v = _reg(self, self.operands[0], "stored value")
        t = _tt(self, self.operands[1], "tensor")
        _verify_index(self, t, self.index, self.operands[2:])
        want = TensorType(t.dtype, tuple(indexed_shape(t, self.index)))
        if bare_type(v) != want:
            raise self.error(f"stores {v} where the indexed region is {want}")

    def interpret(self, interp, ins, env):
        value, arr = ins[0], ins[1]
        if arr is None:  # an absent optional output is not written
            return None
        t = self.operands[1].ttype
        plan = interp.gather_plan(self, t, self.index, ins[2:], arr.shape)
        dst = [pos[valid] for _, pos, valid in plan]
        if any(len(d) == 0 for d in dst):
            return None
        # positions inside the value tile: point dims are absent from it
        src = [np.nonzero(valid)[0] for kind, _, valid in plan if kind != "point"]
        v = np.asarray(value)
        block = v[np.ix_(*src)] if src else v
        target_shape = tuple(len(d) for d in dst)
        arr[np.ix_(*dst)] = np.reshape(block, target_shape)
        interp.record_write(self, dst)
        return None


# ---------------------------------------------------------------------------------------------
# control flow


def verify_loop_reductions(op: Op, body) -> None:
    """A parallel loop's results are reductions across its iterations: the body ends with a
    tile.yield of each iteration's contribution, one `reduce` kind per result, and a result has
    its contribution's dtype and shape (its layout, if any, stays inside the loop). Sums run in
    f32 so that every order of accumulation rounds alike."""
    kinds = op.reduce
    if len(kinds) != len(op.results):
        raise op.error(f"{len(op.results)} result(s) need as many reduce kinds, has {len(kinds)}")
    for k in kinds:
        if k not in LOOP_REDUCE_KINDS:
            raise op.error(f"reduce kind {k!r} is not one of {', '.join(LOOP_REDUCE_KINDS)}")
    ops = body.ops
    if not op.results:
        if ops and isinstance(ops[-1], YieldOp):
            raise op.error("a parallel loop without results ends without tile.yield")
        return
    if not ops or not isinstance(ops[-1], YieldOp):
        raise op.error("a parallel loop with results ends with a tile.yield of each iteration's contribution")
    yielded = ops[-1].operands
    if len(yielded) != len(op.results):
        raise op.error(f"yields {len(yielded)} value(s) for {len(op.results)} result(s)")
    for i, (y, r) in enumerate(zip(yielded, op.results)):
        yt, rt = _tt(op, y, "contribution"), _tt(op, r, "result")
        if yt.dtype is not DType.F32:
            raise op.error(f"contribution {i} is {yt}; reductions across a parallel loop accumulate f32",
                           "convert the contribution with f32(...)")
        if yt.space is not MemSpace.REG or rt.space is not MemSpace.REG or yt.shape != rt.shape \
                or yt.dtype != rt.dtype or rt.layout is not None:
            raise op.error(f"result {i} is {rt} for contributions of {yt}: a result has its contribution's dtype "
                           "and shape, without a layout")


LOOP_REDUCE_KINDS = ("sum",)


@register_op
@attrs.frozen(eq=False, kw_only=True)
class ParallelOp(Op):
    """Independent iterations over a box of indices: operands are n lower then n upper bounds;
    the region's n arguments are the indices. Results, if any, are reductions across the
    iterations (`reduce`, one kind per result) of what each iteration yields: `dw[:] += ...`
    inside the loop."""

    NAME: ClassVar[str] = "tile.parallel"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"loop"})
    reduce: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @property
    def rank(self) -> int:
        return len(self.operands) // 2

    @property
    def lowers(self) -> tuple[Value, ...]:
        return self.operands[: self.rank]

    @property
    def uppers(self) -> tuple[Value, ...]:
        return self.operands[self.rank:]

    @property
    def body(self):
        return self.regions[0]

    def verify_(self) -> None:
        if len(self.regions) != 1:
            raise self.error("needs exactly one region")
        verify_loop_reductions(self, self.body)
        n = len(self.body.args)
        if n == 0 or len(self.operands) != 2 * n:
            raise self.error(f"{n} indices need {2 * n} bound operands, has {len(self.operands)}")
        for v in self.operands:
            _int_scalar(self, v, "bound")
        for a in self.body.args:
            if a.type != TensorType(DType.INDEX):
                raise self.error(f"index argument must be index, not {a.type}")

    def interpret(self, interp, ins, env):
        n = self.rank
        ranges = [range(int(lo), int(hi)) for lo, hi in zip(ins[:n], ins[n:])]
        body = self.body
        acc = interp.loop_accumulators(self)
        for point in itertools.product(*ranges):
            for a, i in zip(body.args, point):
                env[a] = np.asarray(i, dtype=np.int64)
            interp.accumulate(self, acc, interp.exec_iteration(body, env))
        return acc or None


@register_op
@attrs.frozen(eq=False, kw_only=True)
class ForOp(Op):
    """Sequential loop: operands lower, upper, step, then the initial carried values; the
    region's arguments are the induction variable and the carried values; it ends with a
    tile.yield of the next carried values; the results are the final ones."""

    NAME: ClassVar[str] = "tile.for"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"loop"})

    @property
    def body(self):
        return self.regions[0]

    @property
    def inits(self) -> tuple[Value, ...]:
        return self.operands[3:]

    def verify_(self) -> None:
        if len(self.regions) != 1:
            raise self.error("needs exactly one region")
        if len(self.operands) < 3:
            raise self.error("needs lower, upper and step operands")
        for v in self.operands[:3]:
            _int_scalar(self, v, "bound")
        inits = self.inits
        args = self.body.args
        if len(args) != len(inits) + 1:
            raise self.error(f"region has {len(args)} arguments for {len(inits)} carried values")
        if args[0].type != TensorType(DType.INDEX):
            raise self.error(f"induction variable must be index, not {args[0].type}")
        if len(self.results) != len(inits):
            raise self.error(f"{len(inits)} carried values but {len(self.results)} results")
        ops = self.body.ops
        if not ops or not isinstance(ops[-1], YieldOp):
            raise self.error("body must end with tile.yield")
        yielded = ops[-1].operands
        if len(yielded) != len(inits):
            raise self.error(f"yields {len(yielded)} values for {len(inits)} carried values")
        for i, (init, arg, y, r) in enumerate(zip(inits, args[1:], yielded, self.results)):
            if not (init.type == arg.type == y.type == r.type):
                raise self.error(f"carried value {i} changes type: starts as {init.type}, "
                                 f"yields {y.type}",
                                 "a carried value must keep its dtype and shape; cast it back")

    def interpret(self, interp, ins, env):
        lo, hi, step = (int(x) for x in ins[:3])
        if step <= 0:
            raise InterpretError(f"tile.for: step must be positive, got {step}", self.loc)
        carried = list(ins[3:])
        body = self.body
        i = lo
        while i < hi:
            env[body.args[0]] = np.asarray(i, dtype=np.int64)
            for a, c in zip(body.args[1:], carried):
                env[a] = c
            carried = interp.exec_block(body, env)
            i += step
        return carried


@register_op
@attrs.frozen(eq=False, kw_only=True)
class IfOp(Op):
    """Runs its first region where the scalar bool operand holds, its second otherwise; each
    region ends with a tile.yield of the values the results take (the names a branch assigns
    that live on after the `if`)."""

    NAME: ClassVar[str] = "tile.if"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"branch"})

    def verify_(self) -> None:
        _check_operands(self, 1)
        c = _tt(self, self.operands[0], "condition")
        if not (c.is_scalar and c.dtype is DType.BOOL and c.space is MemSpace.REG):
            raise self.error(f"the condition must be a scalar bool, not {c}",
                             "compare to make one, e.g. if n > 0 { ... }")
        if len(self.regions) != 2:
            raise self.error("needs a then region and an else region")
        for name, region in zip(("then", "else"), self.regions):
            if region.args:
                raise self.error(f"the {name} region takes no arguments")
            ops = region.ops
            if not ops or not isinstance(ops[-1], YieldOp):
                raise self.error(f"the {name} region must end with tile.yield")
            yielded = ops[-1].operands
            if len(yielded) != len(self.results):
                raise self.error(f"the {name} region yields {len(yielded)} value(s) for {len(self.results)} result(s)")
            for i, (y, r) in enumerate(zip(yielded, self.results)):
                if y.type != r.type:
                    raise self.error(f"result {i} is {r.type} but the {name} region yields {y.type}",
                                     "both branches must give a name the same dtype and shape")

    def interpret(self, interp, ins, env):
        return interp.exec_block(self.regions[0 if bool(ins[0]) else 1], env)


@register_op
@attrs.frozen(eq=False, kw_only=True)
class YieldOp(Op):
    NAME: ClassVar[str] = "tile.yield"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"terminator"})

    def verify_(self) -> None:
        _check_results(self, 0)


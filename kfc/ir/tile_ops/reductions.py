"""The tile dialect's reductions and scans: reduce, max_sumexp (online softmax's pair), scan."""

from __future__ import annotations

import enum
import math

import attrs
import numpy as np

from ..core import Op, define_op
from ..dtypes import DType
from ..types import Dim, TensorType, bare_type
from .checks import reg_tile_of


class ReduceKind(enum.Enum):
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    MIN = "min"
    PROD = "prod"


def identity(kind: ReduceKind, dtype: DType):
    """The value that leaves a reduction or scan of `kind` unchanged, in `dtype` (a Python
    number): what an exclusive scan starts from and what a chunk's lanes past a row's end read as."""
    if kind in (ReduceKind.SUM, ReduceKind.MEAN):
        return 0
    if kind is ReduceKind.PROD:
        return 1
    low = kind is ReduceKind.MAX
    if dtype.is_float:
        return -math.inf if low else math.inf
    if dtype.is_bool:
        return not low
    info = np.iinfo(dtype.np)
    return int(info.min if low else info.max)


def reduced_shape(shape, axes, keepdims) -> list[Dim]:
    out = []
    for i, d in enumerate(shape):
        if i in axes:
            if keepdims:
                out.append(1)
        else:
            out.append(d)
    return out


@define_op("tile.reduce", traits={"pure"}, operands=1, results=1)
class ReduceOp(Op):
    """Reduce over `axes` (normalised, ascending). Floats accumulate in at least fp32."""

    kind: ReduceKind = attrs.field(converter=ReduceKind)
    axes: tuple[int, ...] = attrs.field(converter=tuple)
    keepdims: bool = False

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        t = operand_types[0]
        return [t.with_shape(reduced_shape(t.shape, attributes["axes"], attributes.get("keepdims", False)))]

    def verify_(self) -> None:
        a = reg_tile_of(self, self.operands[0], "operand")
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


@define_op("tile.max_sumexp", traits={"pure"}, operands=1, results=2)
class MaxSumExpOp(Op):
    """A row's maximum m and the sum of exp(x - m) over it, together (online-softmax makes it of
    max(x) and sum(exp(x - max(x)))): the code generator reduces the pair (m, s) in one sweep,
    rescaling partial sums as the maximum grows, where the two reductions took two."""

    def verify_(self) -> None:
        a = reg_tile_of(self, self.operands[0], "operand")
        if a.dtype is not DType.F32 or a.rank != 1:
            raise self.error(f"reduces an f32 row, not {a}", "cast the row first: f32(x)")
        for name, r in zip(("maximum", "sum"), self.results):
            t = reg_tile_of(self, r, name)
            if bare_type(t) != TensorType(DType.F32):
                raise self.error(f"its {name} is an f32 scalar, not {t}")

    def interpret(self, interp, ins, env):
        # as max(x), then sum(exp(x - max(x))) compute it: f32 differences, exponentials, sum
        x = ins[0].astype(np.float32, copy=False)
        m = np.max(x) if x.size else np.float32(-np.inf)
        with np.errstate(all="ignore"):
            s = np.sum(np.exp((x - m).astype(np.float32)), dtype=np.float32)
        return [interp.result_array(self, m, 0), interp.result_array(self, s, 1)]


@define_op("tile.scan", traits={"pure"}, operands=1, results=1)
class ScanOp(Op):
    """Prefix reduction along `axis` (cumsum for kind=sum)."""

    kind: ReduceKind = attrs.field(converter=ReduceKind)
    axis: int
    exclusive: bool = False
    reverse: bool = False

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[0]]

    def verify_(self) -> None:
        a = reg_tile_of(self, self.operands[0], "operand")
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
            r = np.cumsum(x, axis=axis, dtype=acc)
        elif kind == "prod":
            r = np.cumprod(x, axis=axis, dtype=acc)
        elif kind == "max":
            r = np.maximum.accumulate(x, axis=axis)
        else:
            r = np.minimum.accumulate(x, axis=axis)
        ident = identity(self.kind, d)  # of the operand's own type (the accumulator's would wrap)
        if self.exclusive:
            pad = np.full_like(np.take(r, [0], axis=axis), ident)
            r = np.concatenate([pad, np.take(r, np.arange(r.shape[axis] - 1), axis=axis)], axis=axis)
        if self.reverse:
            r = np.flip(r, axis)
        return [interp.result_array(self, r)]

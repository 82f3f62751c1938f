"""The tile dialect's shape manipulation: broadcast, expand_dims, reshape, transpose."""

from __future__ import annotations

import attrs
import numpy as np

from ..core import Op, define_op
from ..types import Dim, bare_type
from .checks import reg_tile_of, shape_str


def broadcast_compatible(src: tuple[Dim, ...], dst: tuple[Dim, ...]) -> bool:
    """numpy rules: align right; each source dim equals the target's or is 1."""
    if len(src) > len(dst):
        return False
    for s, d in zip(reversed(src), reversed(dst)):
        if s != d and s != 1:
            return False
    return True


@define_op("tile.broadcast", traits={"pure"}, operands=1, results=1)
class BroadcastOp(Op):
    def verify_(self) -> None:
        a = reg_tile_of(self, self.operands[0], "operand")
        r = reg_tile_of(self, self.result, "result")
        if a.dtype != r.dtype:
            raise self.error(f"broadcast keeps the dtype: {a.dtype} became {r.dtype}")
        if not broadcast_compatible(a.shape, r.shape):
            raise self.error(f"cannot broadcast {shape_str(a.shape)} to {shape_str(r.shape)}")

    def interpret(self, interp, ins, env):
        return [np.broadcast_to(ins[0], interp.shape_of(self.result.ttype))]


@define_op("tile.expand_dims", traits={"pure"}, operands=1, results=1)
class ExpandDimsOp(Op):
    """Insert size-1 dims at `axes` (positions in the result)."""

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
        a = reg_tile_of(self, self.operands[0], "operand")
        rank = a.rank + len(self.axes)
        if len(set(self.axes)) != len(self.axes) or any(not 0 <= x < rank for x in self.axes):
            raise self.error(f"axes {list(self.axes)} are invalid for a rank-{rank} result")
        if bare_type(self.result.type) != bare_type(self.infer_result_types([a], self.attributes())[0]):
            raise self.error(f"result type {self.result.type} does not match the inserted axes")

    def interpret(self, interp, ins, env):
        return [np.expand_dims(ins[0], tuple(self.axes))]


@define_op("tile.reshape", traits={"pure"}, operands=1, results=1)
class ReshapeOp(Op):
    def verify_(self) -> None:
        a = reg_tile_of(self, self.operands[0], "operand")
        r = reg_tile_of(self, self.result, "result")
        if a.dtype != r.dtype:
            raise self.error(f"reshape keeps the dtype: {a.dtype} became {r.dtype}")
        if a.is_static and r.is_static:
            if a.numel() != r.numel():
                raise self.error(f"cannot reshape {a.numel()} elements {shape_str(a.shape)} "
                                 f"into {r.numel()} {shape_str(r.shape)}")
        elif [d for d in a.shape if d != 1] != [d for d in r.shape if d != 1]:
            raise self.error(f"a symbolic reshape may only add or drop size-1 dims: "
                             f"{shape_str(a.shape)} to {shape_str(r.shape)}")

    def interpret(self, interp, ins, env):
        return [np.reshape(ins[0], interp.shape_of(self.result.ttype))]


@define_op("tile.transpose", traits={"pure"}, operands=1, results=1)
class TransposeOp(Op):
    perm: tuple[int, ...] = attrs.field(converter=tuple)

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        t = operand_types[0]
        return [t.with_shape([t.shape[p] for p in attributes["perm"]])]

    def verify_(self) -> None:
        a = reg_tile_of(self, self.operands[0], "operand")
        if sorted(self.perm) != list(range(a.rank)):
            raise self.error(f"perm {list(self.perm)} is not a permutation of {a.rank} axes")
        if bare_type(self.result.type) != bare_type(self.infer_result_types([a], self.attributes())[0]):
            raise self.error(f"result type {self.result.type} does not match the permutation")

    def interpret(self, interp, ins, env):
        return [np.transpose(ins[0], self.perm)]

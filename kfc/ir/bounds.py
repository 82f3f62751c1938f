"""Which bounds tests of a tensor access an index makes true by how the IR computes it, so that a
kernel need not make them (kfc.codegen.tile_emitter.access): a parallel loop's index over 0..D,
or x rem D where D is a factor of that loop's extent, lies in [0, D); a constant, a dim, a
floor division or remainder by a divisor positive wherever it runs, and sums and products of
nonnegative values are nonnegative. KDA's prepare kernel tested its head index (m rem H of
its linear CTA index m over 0..chunks * H) against [0, H) at each of its fourteen accesses."""

from __future__ import annotations

from typing import Callable

from .core import Op, Value
from .tile_ops import BinaryOp, CastOp, ConstOp, DimOp, ParallelOp


class IndexFacts:
    """What is known of the index scalars of one parallel loop's body; `owner` gives the op
    that defines a value (None for a block argument)."""

    def __init__(self, loop: ParallelOp | None, owner: Callable[[Value], Op | None]):
        self.owner = owner
        self.ranges = dict(zip(loop.body.args, zip(loop.lowers, loop.uppers))) if loop is not None else {}

    def nonnegative(self, v: Value) -> bool:
        if v in self.ranges:
            return self.nonnegative(self.ranges[v][0])
        op = self.owner(v)
        if isinstance(op, ConstOp):
            return isinstance(op.value, int) and op.value >= 0
        if isinstance(op, DimOp):
            return True
        if isinstance(op, CastOp):
            return self.widening(op) and self.nonnegative(op.operands[0])
        if isinstance(op, BinaryOp) and op.result.ttype.dtype.is_int:
            a, b = op.operands
            if op.NAME == "tile.rem":  # floor remainder: the divisor's sign
                return self.positive(a, b)
            if op.NAME == "tile.div":
                return self.nonnegative(a) and self.positive(a, b)
            if op.NAME in ("tile.add", "tile.mul") and op.result.ttype.dtype.itemsize == 8:  # never wraps
                return self.nonnegative(a) and self.nonnegative(b)
        return False

    def below(self, v: Value, extent) -> bool:
        """Whether v < extent (a tensor dim: an int, or a symbol with .name and .offset) wherever
        v is computed."""
        if v in self.ranges:
            return self.is_extent(self.ranges[v][1], extent)
        op = self.owner(v)
        if isinstance(op, ConstOp):
            return isinstance(op.value, int) and isinstance(extent, int) and op.value < extent
        if isinstance(op, CastOp):
            return self.widening(op) and self.below(op.operands[0], extent)
        if isinstance(op, BinaryOp) and op.NAME == "tile.rem" and self.is_extent(op.operands[1], extent):
            return self.positive(*op.operands)
        return False

    def positive(self, a: Value, d: Value) -> bool:
        """Whether divisor d of a is positive wherever a / d or a rem d runs: a positive
        constant, or a dim that divides the extent of the loop whose index a is (a zero dim then
        leaves the loop empty; elsewhere the GPU would divide by zero where the interpreter
        reports an error, and the index it made is no index into an empty axis)."""
        op = self.owner(d)
        if isinstance(op, ConstOp):
            return isinstance(op.value, int) and op.value > 0
        return isinstance(op, DimOp) and self.divides_extent(a, d)

    def is_extent(self, v: Value, extent) -> bool:
        op = self.owner(v)
        if isinstance(extent, int):
            return isinstance(op, ConstOp) and op.value == extent and extent > 0
        return isinstance(op, DimOp) and not extent.offset and op.sym == extent.name

    def divides_extent(self, index: Value, d: Value) -> bool:
        """index is a loop index from 0 whose extent is a product with d among its factors."""
        if index not in self.ranges or not self.is_zero(self.ranges[index][0]):
            return False
        return d in self.factors(self.ranges[index][1])

    def factors(self, v: Value) -> list[Value]:
        op = self.owner(v)
        if isinstance(op, BinaryOp) and op.NAME == "tile.mul":
            return self.factors(op.operands[0]) + self.factors(op.operands[1])
        return [v]

    def is_zero(self, v: Value) -> bool:
        op = self.owner(v)
        return isinstance(op, ConstOp) and op.value == 0

    @staticmethod
    def widening(op: CastOp) -> bool:
        a, r = op.operands[0].ttype.dtype, op.result.ttype.dtype
        return a.is_int and r.is_int and r.itemsize >= a.itemsize

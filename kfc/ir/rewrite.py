"""Rebuilding immutable IR: clone a function while mapping values and transforming ops.

Passes never mutate: they describe, op by op, what the new function holds, and `rebuild`
threads the value substitutions through operands, results and nested regions.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional, Sequence

import attrs

from .core import Block, Op, Value
from .func import FuncOp
from .types import MemSpace, TensorType

# An op transform gets the op (operands already remapped, regions already rebuilt) and the
# value map; it returns the ops to emit in its place, having recorded in the map what each
# old result becomes. Returning None keeps the op as it is.
OpTransform = Callable[[Op, "ValueMap"], Optional[Sequence[Op]]]


class ValueMap:
    def __init__(self) -> None:
        self._map: dict[Value, Value] = {}

    def __getitem__(self, v: Value) -> Value:
        seen = 0
        while v in self._map:
            v = self._map[v]
            seen += 1
            if seen > 10000:  # a substitution cycle is a pass bug
                raise RuntimeError("cyclic value substitution")
        return v

    def map(self, old: Value, new: Value) -> None:
        if old is not new:
            self._map[old] = new

    def map_all(self, olds: Iterable[Value], news: Iterable[Value]) -> None:
        for o, n in zip(olds, news):
            self.map(o, n)


def rebuild_block(block: Block, vmap: ValueMap, transform: OpTransform | None = None) -> Block:
    out: list[Op] = []
    for op in block.ops:
        op = remap_op(op, vmap, transform)
        replaced = transform(op, vmap) if transform is not None else None
        if replaced is None:
            out.append(op)
        else:
            out.extend(replaced)
    return Block(tuple(vmap[a] for a in block.args), tuple(out))


def remap_op(op: Op, vmap: ValueMap, transform: OpTransform | None = None) -> Op:
    operands = tuple(vmap[v] for v in op.operands)
    regions = tuple(rebuild_block(r, vmap, transform) for r in op.regions)
    if operands == op.operands and all(a is b for a, b in zip(regions, op.regions)) and not _changed(op, regions):
        return op
    return attrs.evolve(op, operands=operands, regions=regions)


def _changed(op: Op, regions) -> bool:
    return any(r.ops != o.ops or r.args != o.args for r, o in zip(regions, op.regions))


def rebuild(func: FuncOp, transform: OpTransform, vmap: ValueMap | None = None) -> FuncOp:
    vmap = vmap or ValueMap()
    body = rebuild_block(func.body, vmap, transform)
    return attrs.evolve(func, regions=(body,))


def uses(func: FuncOp) -> dict[Value, int]:
    """How many times each value is used as an operand anywhere in the function."""
    counts: dict[Value, int] = {}
    for op in func.walk():
        for v in op.operands:
            counts[v] = counts.get(v, 0) + 1
    return counts


def memory_written(op: Op) -> tuple[Value, ...]:
    """The memory an op with no results (a store, a copy) takes as operands: what it may write."""
    if op.results or op.regions:
        return ()
    return tuple(v for v in op.operands if isinstance(v.type, TensorType) and v.type.space is not MemSpace.REG)


def defining_ops(func: FuncOp) -> dict[Value, Op]:
    defs: dict[Value, Op] = {}
    for op in func.walk():
        for r in op.results:
            defs[r] = op
    return defs

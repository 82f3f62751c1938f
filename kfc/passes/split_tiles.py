"""split-tiles: a parallel loop whose tiles are [A, B] becomes a loop over one more index,
with tiles [B], so it is a loop over rows (linearize then fuses the indices):

    parallel t in 0..T {                         parallel t in 0..T, a in 0..A {
      xt = x[t, :, :]          # [A, B]            xt = x[t, a, :]          # [B]
      r = mean(xt * xt, axis=1, keepdims=true)     r = mean(xt * xt)        # a scalar
      y[t, :, :] = xt * r * w  # w: [B]     ->     y[t, a, :] = xt * r * w
      g_t = g[t, :]            # [A]               g_t = g[t, a]            # a scalar
    }                                            }

Each value takes a role: [A, B], [A, 1], [1, B] (rank 2), along A or along B (rank 1: a
[D] weight broadcast over the rows is along B, a [H] vector expanded at axis 1 along A,
elementwise ops join their operands' roles), or a scalar. Along A a value is one element per
row a; along B it stays a tile. Ops over the A axis of a tile (a reduction over axis 0, a
transpose, a dot) keep the loop as it is, as do loops with sums across their iterations and
loops holding other loops. Semantics do not change: row a of every tile is computed from row a
of its operands.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..ir.core import Block, Value
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.tile_ops import (
    BinaryOp, BroadcastOp, CastOp, CmpOp, ConstOp, DimOp, ExpandDimsOp, IndexDim, LoadOp, ParallelOp, ReduceOp,
    StoreOp, UnaryOp, WhereOp,
)
from ..ir.types import MemSpace, SymDim, TensorType
from .base import Pass, register_pass

ELEMENTWISE = (UnaryOp, BinaryOp, CmpOp, WhereOp, CastOp)
INDEX = TensorType(DType.INDEX)


class NotSplit(Exception):
    """The loop keeps its rank-2 tiles (a reason in words)."""


@attrs.frozen
class SplitReport:
    """What split-tiles did (its stats in the pass context): how many loops it split, and for
    each loop it left, why it keeps its rank-2 tiles."""

    split: int
    kept: tuple[str, ...]


def _reg(v: Value) -> TensorType | None:
    t = v.type
    return t if isinstance(t, TensorType) and t.space is MemSpace.REG else None


class Roles:
    """Each value's role: "AB", "A1", "1B" (rank 2), "A", "B" or "?" (rank 1, by union-find
    over the values that must share one), "S" (a scalar)."""

    def __init__(self, a_dim, b_dim) -> None:
        self.parent: dict[Value, Value] = {}
        self.known: dict[Value, str] = {}
        self.a_dim, self.b_dim = a_dim, b_dim

    def find(self, v: Value) -> Value:
        while self.parent.get(v, v) is not v:
            v = self.parent[v]
        return v

    def join(self, a: Value, b: Value) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is rb:
            return
        ka, kb = self.known.get(ra), self.known.get(rb)
        if ka and kb and ka != kb:
            raise NotSplit("a vector would run along both axes of the tiles")
        self.parent[rb] = ra
        if kb:
            self.known[ra] = kb

    def set(self, v: Value, role: str) -> None:
        r = self.find(v)
        if self.known.get(r, role) != role:
            raise NotSplit("a vector would run along both axes of the tiles")
        self.known[r] = role

    def of(self, v: Value) -> str:
        t = _reg(v)
        if t is None:
            return "tensor"
        if t.rank == 0:
            return "S"
        if t.rank == 2:  # [A, B] first: with one row (A = 1) a [1, B] tile is [A, B]
            shape = tuple(t.shape)
            return "AB" if shape == (self.a_dim, self.b_dim) else "1B" if shape[1] != 1 else "A1"
        return self.known.get(self.find(v), "?")


def assign_roles(body: Block, a_dim, b_dim) -> Roles:
    roles = Roles(a_dim, b_dim)
    for op in body.ops:
        if op.regions:
            raise NotSplit(f"{op.NAME} inside the loop")
        for v in op.results:
            t = _reg(v)
            if t is not None and t.rank > 2:
                raise NotSplit(f"a rank-{t.rank} tile")
            if t is not None and t.rank == 2 and (t.shape[0] not in (a_dim, 1) or t.shape[1] not in (b_dim, 1)):
                raise NotSplit(f"tiles of two shapes ({a_dim} x {b_dim} and {t.shape[0]} x {t.shape[1]})")
        ins = [v for v in op.operands if (t := _reg(v)) is not None and t.rank == 1]
        outs = [v for v in op.results if (t := _reg(v)) is not None and t.rank == 1]
        if isinstance(op, ELEMENTWISE) or isinstance(op, BroadcastOp) and outs:
            group = ins + outs  # elementwise: operands and result run along one axis
            for v in group[1:]:
                roles.join(group[0], v)
        elif isinstance(op, BroadcastOp):  # to rank 2: a rank-1 operand aligns with the last axis
            if ins:
                roles.set(ins[0], "B")
        elif isinstance(op, ExpandDimsOp):
            if ins:
                roles.set(ins[0], "A" if tuple(op.axes) == (1,) else "B")
        elif isinstance(op, ReduceOp):
            src = _reg(op.operands[0])
            if src.rank == 2:
                if tuple(op.axes) != (1,):
                    raise NotSplit("a reduction over the tiles' first axis (across the rows)")
                if outs:
                    roles.set(outs[0], "A")
        elif isinstance(op, (LoadOp, StoreOp, ConstOp, DimOp)):
            pass
        else:
            raise NotSplit(f"{op.NAME} on the tiles")
    return roles


def _axis_dims(t: TensorType, index) -> list[int]:
    """The tensor dims a load or store's tile runs along (those indexed by `:`)."""
    return [d for d, ix in enumerate(index) if ix.kind == "all"] + list(range(len(index), t.rank))


@register_pass
@attrs.frozen
class SplitTiles(Pass):
    NAME: ClassVar[str] = "split-tiles"
    SUMMARY: ClassVar[str] = "a parallel loop over [A, B] tiles becomes a loop over one more index with [B] tiles"

    def run(self, func: FuncOp, ctx) -> FuncOp:
        ops, changed, kept = [], 0, []
        for op in func.body.ops:
            if isinstance(op, ParallelOp) and not op.results and any(
                    (t := _reg(v)) is not None and t.rank == 2 for o in op.body.ops for v in o.results):
                try:
                    new, pre = self.split(op)
                except NotSplit as why:
                    kept.append(f"loop at {op.loc.line if op.loc else '?'} keeps its rank-2 tiles: {why}")
                    ctx.note(self, kept[-1])
                    ops.append(op)
                    continue
                ops.extend(pre)
                ops.append(new)
                changed += 1
            else:
                ops.append(op)
        report = SplitReport(changed, tuple(kept))
        if not changed:
            if kept:
                ctx.note(self, f"{len(kept)} loop(s) keep their rank-2 tiles", stats=report)
            return func
        ctx.note(self, f"{changed} loop(s) over rank-2 tiles now run over rows", stats=report)
        return attrs.evolve(func, regions=(Block(func.body.args, tuple(ops)),))

    def split(self, loop: ParallelOp) -> tuple[ParallelOp, list]:
        shapes = [t.shape for o in loop.body.ops for v in o.results if (t := _reg(v)) is not None and t.rank == 2]
        a_dim = next((s[0] for s in shapes if s[0] != 1), 1)
        b_dim = next((s[1] for s in shapes if s[1] != 1), 1)
        if b_dim == 1:
            raise NotSplit("tiles whose last axis has one element")
        roles = assign_roles(loop.body, a_dim, b_dim)
        loc = loop.loc
        pre: list = []
        if isinstance(a_dim, SymDim):
            if a_dim.offset:
                raise NotSplit(f"the tiles' first axis is {a_dim}")
            bound = DimOp(results=(Value(INDEX),), loc=loc, sym=a_dim.name)
        else:
            bound = ConstOp(results=(Value(INDEX),), loc=loc, value=int(a_dim))
        zero = ConstOp(results=(Value(INDEX),), loc=loc, value=0)
        pre += [bound, zero]
        a = Value(INDEX, "a")
        vmap: dict[Value, Value] = {}

        def new_type(v: Value) -> TensorType:
            t = _reg(v)
            role = roles.of(v)
            if role in ("AB", "1B"):
                return t.with_shape((t.shape[1],))
            return t.with_shape(() if role in ("A1", "A", "S") else t.shape)

        def mapped(v: Value) -> Value:
            return vmap.get(v, v)

        def fresh(v: Value) -> Value:
            nv = Value(new_type(v), v.name) if _reg(v) is not None else v
            vmap[v] = nv
            return nv

        body: list = []
        for op in loop.body.ops:
            operands = tuple(mapped(v) for v in op.operands)
            if isinstance(op, (LoadOp, StoreOp)):
                tile = op.result if isinstance(op, LoadOp) else op.operands[0]
                tensor = op.operands[0] if isinstance(op, LoadOp) else op.operands[1]
                role = roles.of(tile)
                first = 1 if isinstance(op, LoadOp) else 2
                index, idx_ops = list(op.index), list(operands[first:])
                if role in ("AB", "A"):
                    # the tile's first axis is row a of the tensor dim it runs along
                    dims = _axis_dims(tensor.ttype, index)
                    d = dims[0]
                    while len(index) <= d:
                        index.append(IndexDim("all"))
                    index[d] = IndexDim("point")
                    pos = sum(1 for ix in index[:d] if ix.kind in ("point", "slice")) + \
                        sum(1 for ix in index[:d] if ix.limit)
                    idx_ops.insert(pos, a)
                elif role in ("A1", "1B"):
                    raise NotSplit(f"a {role} tile read or written directly")
                if isinstance(op, LoadOp):
                    body.append(attrs.evolve(op, operands=(operands[0], *idx_ops), results=(fresh(op.result),),
                                             index=tuple(index)))
                else:
                    body.append(attrs.evolve(op, operands=(operands[0], operands[1], *idx_ops), index=tuple(index)))
                continue
            if isinstance(op, ReduceOp) and roles.of(op.operands[0]) == "A":
                raise NotSplit("a reduction along the tiles' first axis (across the rows)")
            if isinstance(op, ReduceOp) and _reg(op.operands[0]).rank == 2:
                body.append(ReduceOp(operands=operands, results=(fresh(op.result),), loc=op.loc, kind=op.kind,
                                     axes=(0,), keepdims=False))
                continue
            if isinstance(op, (BroadcastOp, ExpandDimsOp)):
                src, dst = new_type(op.operands[0]), new_type(op.result)
                if src.shape == dst.shape:  # along B already, or a scalar that stays one
                    vmap[op.result] = operands[0]
                    continue
                body.append(BroadcastOp(operands=operands, results=(fresh(op.result),), loc=op.loc))
                continue
            if isinstance(op, ConstOp) and op.results and _reg(op.result).rank == 2:
                raise NotSplit("a rank-2 constant")
            body.append(attrs.evolve(op, operands=operands, results=tuple(fresh(r) for r in op.results)))
        args = loop.body.args
        new = ParallelOp(operands=(*loop.lowers, zero.result, *loop.uppers, bound.result), results=(),
                         regions=(Block((*args, a), tuple(body)),), loc=loc)
        return new, pre

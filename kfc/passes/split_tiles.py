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
row a; along B it stays a tile. Semantics do not change: row a of every tile is computed from
row a of its operands.

A sum, mean, max or min over the tiles' first axis (of floats, without keepdims) makes the rows
a sequential loop inside the iteration instead, carrying one [B] accumulator per reduction (in
f32 for narrower floats); what uses the reductions runs after that loop:

    parallel t in 0..T {                         parallel t in 0..T {
      xt = x[t, :, :]                              acc = 0.0                    # [B]
      z[t, :, :] = xt * 2.0                        for a in 0..A carry (acc) {
      y[t, :] = sum(xt, axis=0) * w     ->           xt = x[t, a, :]; z[t, a, :] = xt * 2.0
    }                                                acc = acc + xt
                                                   }
                                                   y[t, :] = acc * w
                                                 }

A row's work that needs such a reduction's result (centring the rows on their mean) would take
a second pass over the rows, and keeps the loop as it is, as do other ops over the A axis (a
transpose, a dot), loops with sums across their iterations and loops holding other loops.
"""

from __future__ import annotations


import attrs

from ..ir.core import Block, Value
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.tile_ops import (
    BINARY_CLASSES, BinaryOp, BroadcastOp, CastOp, CmpOp, ConstOp, DimOp, ExpandDimsOp, ForOp, IndexDim, LoadOp,
    ParallelOp, ReduceKind, ReduceOp, StoreOp, UnaryOp, WhereOp, YieldOp,
)
from ..ir.types import MemSpace, SymDim, TensorType
from .base import Pass, define_pass

ELEMENTWISE = (UnaryOp, BinaryOp, CmpOp, WhereOp, CastOp)
INDEX = TensorType(DType.INDEX)
# reductions over the tiles' first axis that a loop over the rows carries: how each row joins
# the accumulator, and where the accumulator starts
AXIS0_KINDS = {ReduceKind.SUM: ("add", 0.0), ReduceKind.MEAN: ("add", 0.0), ReduceKind.MAX: ("max", float("-inf")),
               ReduceKind.MIN: ("min", float("inf"))}


class NotSplit(Exception):
    """The loop keeps its rank-2 tiles (a reason in words)."""


@attrs.frozen
class SplitReport:
    """What split-tiles did (its stats in the pass context): how many loops it split, and for
    each loop it left, why it keeps its rank-2 tiles."""

    split: int
    kept: tuple[str, ...]


def register_tile(v: Value) -> TensorType | None:
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
        t = register_tile(v)
        if t is None:
            return "tensor"
        if t.rank == 0:
            return "S"
        if t.rank == 2:  # [A, B] first: with one row (A = 1) a [1, B] tile is [A, B]
            shape = tuple(t.shape)
            return "AB" if shape == (self.a_dim, self.b_dim) else "1B" if shape[1] != 1 else "A1"
        return self.known.get(self.find(v), "?")


def assign_roles(body: Block, a_dim, b_dim, axis0: list | None = None) -> Roles:
    """Every value's role; reductions over the tiles' first axis are refused, or, given a list
    `axis0`, collected into it (their results run along B)."""
    roles = Roles(a_dim, b_dim)
    for op in body.ops:
        if op.regions:
            raise NotSplit(f"{op.NAME} inside the loop")
        for v in op.results:
            t = register_tile(v)
            if t is not None and t.rank > 2:
                raise NotSplit(f"a rank-{t.rank} tile")
            if t is not None and t.rank == 2 and (t.shape[0] not in (a_dim, 1) or t.shape[1] not in (b_dim, 1)):
                raise NotSplit(f"tiles of two shapes ({a_dim} x {b_dim} and {t.shape[0]} x {t.shape[1]})")
        ins = [v for v in op.operands if (t := register_tile(v)) is not None and t.rank == 1]
        outs = [v for v in op.results if (t := register_tile(v)) is not None and t.rank == 1]
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
            src = register_tile(op.operands[0])
            if src.rank == 2:
                if tuple(op.axes) == (0,) and axis0 is not None and not op.keepdims and op.kind in AXIS0_KINDS:
                    axis0.append(op)
                    roles.set(op.result, "B")
                    continue
                if tuple(op.axes) != (1,):
                    raise NotSplit("a reduction over the tiles' first axis (across the rows)")
                if outs:
                    roles.set(outs[0], "A")
        elif isinstance(op, (LoadOp, StoreOp, ConstOp, DimOp)):
            pass
        else:
            raise NotSplit(f"{op.NAME} on the tiles")
    return roles


def rows_of(ops, roles: Roles, a: Value, vmap: dict) -> list:
    """The ops as they run for row a of their [A, B] tiles: [A, B] and [1, B] tiles become [B],
    [A] and [A, 1] ones scalars, a load or store of an [A, B] tile takes row a of the tensor
    dim its first axis runs along. `vmap` maps each old value to its new one (filled in)."""

    def new_type(v: Value) -> TensorType:
        t = register_tile(v)
        role = roles.of(v)
        if role in ("AB", "1B"):
            return t.with_shape((t.shape[1],))
        return t.with_shape(() if role in ("A1", "A", "S") else t.shape)

    def mapped(v: Value) -> Value:
        return vmap.get(v, v)

    def fresh(v: Value) -> Value:
        nv = Value(new_type(v), v.name) if register_tile(v) is not None else v
        vmap[v] = nv
        return nv

    body: list = []
    for op in ops:
        operands = tuple(mapped(v) for v in op.operands)
        if isinstance(op, (LoadOp, StoreOp)):
            tile = op.result if isinstance(op, LoadOp) else op.operands[0]
            tensor = op.operands[0] if isinstance(op, LoadOp) else op.operands[1]
            role = roles.of(tile)
            first = 1 if isinstance(op, LoadOp) else 2
            index, idx_ops = list(op.index), list(operands[first:])
            if role in ("AB", "A"):
                # the tile's first axis is row a of the tensor dim it runs along
                d = _axis_dims(tensor.ttype, index)[0]
                if d < len(index) and index[d].kind == "slice":
                    # a slice masks the rows past its limit or the tensor's end; a row index would not
                    raise NotSplit("the tiles' first axis is a slice (`x[t:t+n, :]`)")
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
        if isinstance(op, ReduceOp) and roles.of(op.operands[0]) == "A1":
            # row a of an [A, 1] tile is one element, and every reduction of one element is it
            row, want = operands[0], new_type(op.result)
            if row.type == want:
                vmap[op.result] = row
            else:
                body.append(CastOp(operands=(row,), results=(fresh(op.result),), loc=op.loc))
            continue
        if isinstance(op, ReduceOp) and register_tile(op.operands[0]).rank == 2:
            result = fresh(op.result)
            if result.ttype.rank:  # [A, 1] kept from tiles of one column: the row's scalar spread over [1]
                scalar = Value(result.ttype.with_shape(()))
                body.append(ReduceOp(operands=operands, results=(scalar,), loc=op.loc, kind=op.kind, axes=(0,)))
                body.append(BroadcastOp(operands=(scalar,), results=(result,), loc=op.loc))
                continue
            body.append(ReduceOp(operands=operands, results=(result,), loc=op.loc, kind=op.kind,
                                 axes=(0,), keepdims=False))
            continue
        if isinstance(op, (BroadcastOp, ExpandDimsOp)):
            src, dst = new_type(op.operands[0]), new_type(op.result)
            if src.shape == dst.shape:  # along B already, or a scalar that stays one
                vmap[op.result] = operands[0]
                continue
            body.append(BroadcastOp(operands=operands, results=(fresh(op.result),), loc=op.loc))
            continue
        if isinstance(op, ConstOp) and op.results and register_tile(op.result).rank == 2:
            raise NotSplit("a rank-2 constant")
        body.append(attrs.evolve(op, operands=operands, results=tuple(fresh(r) for r in op.results)))
    return body


def _axis_dims(t: TensorType, index) -> list[int]:
    """The tensor dims a load or store's tile runs along, in order: those sliced or indexed by `:`."""
    return [d for d, ix in enumerate(index) if ix.kind in ("all", "slice")] + list(range(len(index), t.rank))


@define_pass("split-tiles", "a parallel loop over [A, B] tiles becomes a loop over one more index with [B] tiles")
class SplitTiles(Pass):

    def run(self, func: FuncOp, ctx) -> FuncOp:
        ops, changed, kept = [], 0, []
        for op in func.body.ops:
            if isinstance(op, ParallelOp) and not op.results and any(
                    (t := register_tile(v)) is not None and t.rank == 2 for o in op.body.ops for v in o.results):
                try:
                    try:
                        new, pre = self.split(op)
                    except NotSplit:
                        new, pre = self.loop_over_rows(op)
                        if new is None:
                            raise
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
        a_dim, b_dim = self.axes(loop)
        if b_dim == 1:
            raise NotSplit("tiles whose last axis has one element")
        roles = assign_roles(loop.body, a_dim, b_dim)
        loc = loop.loc
        bound, zero = self.rows_bound(a_dim, loc), ConstOp(results=(Value(INDEX),), loc=loc, value=0)
        pre: list = [bound, zero]
        a = Value(INDEX, "a")
        body = rows_of(loop.body.ops, roles, a, {})
        args = loop.body.args
        new = ParallelOp(operands=(*loop.lowers, zero.result, *loop.uppers, bound.result), results=(),
                         regions=(Block((*args, a), tuple(body)),), loc=loc)
        return new, pre

    @staticmethod
    def axes(loop: ParallelOp):
        """(A, B): the sizes of the loop's rank-2 tiles (1 where every tile has one there)."""
        shapes = [t.shape for o in loop.body.ops for v in o.results if (t := register_tile(v)) is not None and t.rank == 2]
        return next((s[0] for s in shapes if s[0] != 1), 1), next((s[1] for s in shapes if s[1] != 1), 1)

    @staticmethod
    def rows_bound(a_dim, loc):
        """The op giving the number of rows a, before the loop."""
        if isinstance(a_dim, SymDim):
            if a_dim.offset:
                raise NotSplit(f"the tiles' first axis is {a_dim}")
            return DimOp(results=(Value(INDEX),), loc=loc, sym=a_dim.name)
        return ConstOp(results=(Value(INDEX),), loc=loc, value=int(a_dim))

    def loop_over_rows(self, loop: ParallelOp):
        """A loop whose [A, B] tiles are reduced over their first axis (a sum over heads per
        token): each iteration runs a sequential loop over the A rows, carrying one [B]
        accumulator per reduction (in f32 for narrower floats), and what uses the reductions
        runs after it. (None, None) when the loop has no such reduction; NotSplit when a row's
        work needs a reduction's result (that would take a second pass over the rows)."""
        a_dim, b_dim = self.axes(loop)
        axis0: list = []
        roles = assign_roles(loop.body, a_dim, b_dim, axis0)
        if not axis0 or b_dim == 1:
            return None, None
        loc = loop.loc
        bound = self.rows_bound(a_dim, loc)
        zero = ConstOp(results=(Value(INDEX),), loc=loc, value=0)
        one = ConstOp(results=(Value(INDEX),), loc=loc, value=1)
        reduced = {r.result for r in axis0}
        per_row, after_values = set(), set(reduced)
        before, inner, after = [], [], []
        for op in loop.body.ops:
            if op in axis0:
                continue
            uses_rows = any(v in per_row for v in op.operands)
            uses_reduced = any(v in after_values for v in op.operands)
            rank2 = any(roles.of(v) in ("AB", "A1", "1B", "A") for v in op.results)
            if uses_reduced:
                if uses_rows or rank2:
                    raise NotSplit("a row's work uses the reduction over the tiles' first axis")
                after.append(op)
                after_values.update(op.results)
            elif uses_rows or rank2:
                inner.append(op)
                per_row.update(op.results)
            else:
                before.append(op)
        a = Value(INDEX, "a")
        vmap: dict[Value, Value] = {}
        body = rows_of(inner, roles, a, vmap)
        inits, args, nexts = [], [], []
        for r in axis0:
            t = register_tile(r.result)
            if not t.dtype.is_float:
                raise NotSplit(f"a {r.kind.value} of {t.dtype} over the tiles' first axis (floats only)")
            acc_t = t.with_dtype(DType.F32) if t.dtype.itemsize < 4 else t
            name, start = AXIS0_KINDS[r.kind]
            init = Value(acc_t, f"{r.result.name or 'acc'}0")
            inits.append(ConstOp(results=(init,), loc=r.loc, value=start))
            arg = Value(acc_t, r.result.name or "acc")
            args.append(arg)
            row = vmap.get(r.operands[0], r.operands[0])
            if row.type != acc_t:
                cast = CastOp(operands=(row,), results=(Value(acc_t),), loc=r.loc)
                body.append(cast)
                row = cast.result
            step = BINARY_CLASSES[name](operands=(arg, row), results=(Value(acc_t),), loc=r.loc)
            body.append(step)
            nexts.append(step.result)
        results = tuple(Value(v.type, v.name) for v in args)
        for_op = ForOp(operands=(zero.result, bound.result, one.result, *(i.result for i in inits)), results=results,
                       regions=(Block((a, *args), (*body, YieldOp(operands=tuple(nexts), loc=loc))),), loc=loc)
        post: list = []
        for r, total in zip(axis0, results):
            value = total
            if r.kind is ReduceKind.MEAN:
                count = Value(TensorType(DType.F32))
                post.append(CastOp(operands=(bound.result,), results=(count,), loc=r.loc))
                wide = Value(total.type)
                post.append(BroadcastOp(operands=(count,), results=(wide,), loc=r.loc))
                mean = Value(total.type)
                post.append(BINARY_CLASSES["div"](operands=(total, wide), results=(mean,), loc=r.loc))
                value = mean
            if value.type != r.result.type:
                back = Value(r.result.type)
                post.append(CastOp(operands=(value,), results=(back,), loc=r.loc))
                value = back
            vmap[r.result] = value
        after = [attrs.evolve(op, operands=tuple(vmap.get(v, v) for v in op.operands)) for op in after]
        ops = (*before, *inits, for_op, *post, *after)
        new = ParallelOp(operands=loop.operands, results=(), regions=(Block(loop.body.args, ops),), loc=loc)
        return new, [bound, zero, one]

"""flatten-branches: a branch that reduces a row too long for one CTA computes both of its
sides and selects between them, so the row program is straight and its row may take a cluster.

A reduction inside an `if` synchronises the row's threads, so every thread of the row must take
the same side: tile keeps such a row in one CTA, whose registers hold rows of at most
512 x 128 elements at the threads tile chooses (and spill before). Flattened,

    if on[m] != 0 { xr = xr - mean(xr) } else { xr = xr * 1.0 }
      ->
    a = xr - mean(xr);  b = xr * 1.0;  xr = where(on[m] != 0, a, b)

costs the side not taken, which a row that long repays in the CTAs a cluster brings. Only
branches that store nothing flatten (a store must not happen on the side not taken), and whose
loads are in bounds whichever side runs: rows and row elements by the row index (`x[m, :]`,
`on[m]`) and whole vectors (`w[:]`) of tensors that are present, not an index the branch may
guard (`x[idx[m], :]`) nor an optional tensor. Shorter rows keep their branches.
"""

from __future__ import annotations

import attrs

from ..ir.core import Block, Op, Value
from ..ir.dtypes import DType
from ..ir.tile_ops import BroadcastOp, ConstOp, DimOp, ForOp, IfOp, LoadOp, ReduceOp, ScanOp, StoreOp, WhereOp
from ..ir.types import SymDim, TensorType
from .base import Pass, define_pass, option
from .rows import body_ops, find_row_loop, row_length, with_loop_body

# examples/maybe_center.kfc (sm_90a) spills in one CTA at rows of 65536 (3 KB stored, 32
# registers) and fits at 32768 (84 registers); past 65536 tile refuses it.
DEFAULT_MIN_ROW = 65536


def synchronising(op: IfOp) -> bool:
    return any(isinstance(o, (ReduceOp, ScanOp)) for r in op.regions for o in body_ops(r))


@attrs.frozen
class RowBounds:
    """What keeps a load in bounds whichever side of a branch runs: the row loop's index and
    the dim it counts up to from 0 (`parallel m in 0..M`: a tensor's dim M takes m)."""

    index: Value
    dim: str | None

    @classmethod
    def of(cls, loop, func) -> "RowBounds":
        defs = {r: o for o in func.body.ops for r in o.results}
        lo, hi = (defs.get(v) for v in (loop.lowers[0], loop.uppers[0]))
        starts_at_zero = isinstance(lo, ConstOp) and lo.value == 0
        return cls(loop.body.args[0], hi.sym if starts_at_zero and isinstance(hi, DimOp) else None)

    def safe(self, load: LoadOp) -> bool:
        """A load of a present tensor whose every point index is the row, in a dim the rows
        count: `x[m, :]`, `w[:]`, `on[m]` (not `x[idx[m], :]`, which its branch may guard)."""
        t: TensorType = load.operands[0].ttype
        if t.optional or self.dim is None:
            return False
        at = iter(load.operands[1:])
        for ix, d in zip(load.index, t.shape):
            if ix.kind == "all":
                continue
            if ix.kind != "point" or next(at) is not self.index or d != SymDim(self.dim):
                return False
        return True


def flattenable(op: IfOp, rows: RowBounds) -> bool:
    return not any(isinstance(o, (StoreOp, ForOp)) or isinstance(o, LoadOp) and not rows.safe(o) or
                   o.NAME.startswith(("gpu.", "ptx.")) for r in op.regions for o in body_ops(r))


def flatten(ops, rows: RowBounds) -> tuple[list[Op], int]:
    """The ops with every flattenable synchronising branch inlined (inner ones first), and how
    many were."""
    out, count = [], 0
    for op in ops:
        if not (isinstance(op, IfOp) and synchronising(op) and flattenable(op, rows)):
            out.append(op)
            continue
        sides = []
        for region in op.regions:
            inner, n = flatten(region.ops[:-1], rows)
            out.extend(inner)
            count += n
            sides.append(region.ops[-1].operands)
        cond = op.operands[0]
        for r, a, b in zip(op.results, *sides):
            t: TensorType = r.type
            mask = cond
            if t.rank:
                mask = Value(TensorType(DType.BOOL, t.shape))
                out.append(BroadcastOp(operands=(cond,), results=(mask,), loc=op.loc))
            out.append(WhereOp(operands=(mask, a, b), results=(r,), loc=op.loc))
        count += 1
    return out, count


@define_pass("flatten-branches", "a branch that reduces a row too long for one CTA computes both sides and selects")
class FlattenBranches(Pass):
    min_row: int = option(DEFAULT_MIN_ROW, lo=0)  # rows of at least this many elements flatten

    def run(self, func, ctx):
        loop = find_row_loop(func)
        if not any(isinstance(op, IfOp) and synchronising(op) for op in body_ops(loop.body)):
            return func
        n = row_length(loop, func)
        if n < self.min_row:
            return func
        ops, count = flatten(loop.body.ops, RowBounds.of(loop, func))
        if not count:
            ctx.note(self, f"row {n}: its reducing branches write memory or read where the branch may guard; "
                           "left as they are")
            return func
        ctx.note(self, f"row {n}: {count} reducing branch(es) compute both sides and select")
        return with_loop_body(func, loop, Block(loop.body.args, tuple(ops)))

"""rows-of-tensors: a program written on whole tensors whose math goes row by row becomes a
parallel loop over the rows, so the row passes map it onto the GPU:

    dx = bf16(r[:, None] * (g - xh * mean(g * xh, axis=1, keepdims=true)))
    dw = sum(dy * xh, axis=0)
      ->
    parallel m in 0..M {  ... dx[m, :] = bf16(r[m] * (g - xh * mean(g * xh)))
                          dw[:] += dy * xh  }

Every value takes the role split-tiles gives a loop's rank-2 tiles (kfc.passes.split_tiles):
[M, N] tiles become row m ([N]), [M] and [M, 1] values one element of row m, a [N] weight
stays whole. A sum or mean over the first axis (`sum(x, axis=0)`, a column sum or a weight
gradient) becomes a sum across the loop's iterations, in f32, which the code generator adds
in a fixed order (two phases, no float atomics); a mean adds each row's share (x / M). What
uses such a sum runs after the loop and may only cast and store it. The rows stay a run-time
size: `tensor_rows_dim` names the dim, so compile leaves it unspecialised.
"""

from __future__ import annotations


import attrs

from ..ir.core import Block, Op, Value
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.tile_ops import (
    BINARY_CLASSES, BroadcastOp, CastOp, ConstOp, DimOp, DotOp, ParallelOp, ReduceKind, ReduceOp, StoreOp,
    YieldOp,
)
from ..ir.types import SymDim, TensorType
from .base import Pass, PassError, define_pass
from .split_tiles import INDEX, NotSplit, SplitTiles, assign_roles, register_tile, rows_of

# what a sum across the loop's iterations can be: the parallel loop adds, nothing else
ACROSS_ROWS = (ReduceKind.SUM, ReduceKind.MEAN)


def _rank2_tiles(func: FuncOp) -> list[TensorType]:
    return [t for op in func.body.ops for v in op.results if (t := register_tile(v)) is not None and t.rank == 2]


def applies(func: FuncOp) -> bool:
    """A straight-line program on whole tensors with rank-2 tiles and no matrix product (that
    is accelerate-matmul's)."""
    ops = func.body.ops
    return bool(_rank2_tiles(func)) and not any(op.regions or isinstance(op, DotOp) for op in ops)


def tensor_rows_dim(func: FuncOp) -> str | None:
    """The symbol counting the rows of a whole-tensor row program (its tiles' first dim), or
    None when the program is not one or the rows have a fixed size."""
    if not applies(func):
        return None
    firsts = {t.shape[0] for t in _rank2_tiles(func)} - {1}
    if len(firsts) == 1 and isinstance(d := firsts.pop(), SymDim) and not d.offset:
        return d.name
    return None


@define_pass("rows-of-tensors", "a whole-tensor program that computes row by row becomes a parallel loop over rows")
class RowsOfTensors(Pass):

    def run(self, func: FuncOp, ctx) -> FuncOp:
        if not applies(func):
            return func
        try:
            ops = self.rows(func)
        except NotSplit as why:
            raise PassError(f"rows-of-tensors: {func.sym_name} does not compute row by row: {why}", func.loc,
                            "kfc compiles whole-tensor programs whose tiles are [rows, N]: elementwise math, "
                            "reductions along a row (axis=1) and sums over the rows (axis=0)") from None
        ctx.note(self, "the whole-tensor program runs as a parallel loop over its rows")
        return attrs.evolve(func, regions=(Block(func.body.args, tuple(ops)),))

    def rows(self, func: FuncOp) -> list[Op]:
        shapes = [t.shape for t in _rank2_tiles(func)]
        a_dim = next((s[0] for s in shapes if s[0] != 1), 1)
        b_dim = next((s[1] for s in shapes if s[1] != 1), 1)
        axis0: list[ReduceOp] = []
        roles = assign_roles(func.body, a_dim, b_dim, axis0)
        for r in axis0:
            if r.kind not in ACROSS_ROWS:
                raise NotSplit(f"a {r.kind.value} over the rows (axis=0): sums and means across rows are built, "
                               "other reductions across rows are not yet")
        reduced = {r.result for r in axis0}
        inner, after, after_values = [], [], set(reduced)
        for op in func.body.ops:
            if op in axis0:
                continue
            if any(v in after_values for v in op.operands):
                if not isinstance(op, (CastOp, StoreOp)) or any(
                        v not in after_values for v in op.operands if register_tile(v) is not None):
                    raise NotSplit(f"{op.NAME} uses a sum over the rows; such a sum can only be cast and "
                                   "stored (computing with it would take a second pass over the rows)")
                after.append(op)
                after_values.update(op.results)
                continue
            if isinstance(op, StoreOp) and roles.of(op.operands[0]) not in ("AB", "A"):
                out = op.operands[1]
                raise NotSplit(f"{out.name or 'an output'} is stored from a value that does not depend on the "
                               "rows; every output is per row or a sum over the rows")
            inner.append(op)
        loc = func.loc
        bound = SplitTiles.rows_bound(a_dim, loc)
        zero = ConstOp(results=(Value(INDEX),), loc=loc, value=0)
        m = Value(INDEX, "m")
        vmap: dict[Value, Value] = {}
        body = rows_of(inner, roles, m, vmap)
        contributions = [self.contribution(r, vmap, bound, body) for r in axis0]
        results = tuple(Value(c.type, f"{r.result.name or 'col'}_sum") for r, c in zip(axis0, contributions))
        loop = ParallelOp(operands=(zero.result, bound.result), results=results, reduce=("sum",) * len(results),
                          regions=(Block((m,), (*body, *([YieldOp(operands=tuple(contributions), loc=loc)]
                                                        if contributions else []))),), loc=loc)
        post: list[Op] = []
        for r, total in zip(axis0, results):
            value = total
            if value.type != r.result.type:
                back = Value(r.result.type)
                post.append(CastOp(operands=(value,), results=(back,), loc=r.loc))
                value = back
            vmap[r.result] = value
        after = [attrs.evolve(op, operands=tuple(vmap.get(v, v) for v in op.operands)) for op in after]
        return [bound, zero, loop, *post, *after]

    @staticmethod
    def contribution(r: ReduceOp, vmap: dict, bound: Op, body: list) -> Value:
        """Row m's share of the sum over rows `r`, in f32 (appended to `body`): the row, or
        for a mean the row over the number of rows."""
        t = register_tile(r.result)
        if not t.dtype.is_float:
            raise NotSplit(f"a {r.kind.value} of {t.dtype} over the rows (floats only)")
        row = vmap.get(r.operands[0], r.operands[0])
        f32 = row.type.with_dtype(DType.F32)
        if row.type != f32:
            cast = CastOp(operands=(row,), results=(Value(f32),), loc=r.loc)
            body.append(cast)
            row = cast.result
        if r.kind is ReduceKind.MEAN:
            rows = bound.result
            if isinstance(bound, DimOp):  # a run-time count: read it inside the loop
                dim = DimOp(results=(Value(INDEX),), loc=r.loc, sym=bound.sym)
                body.append(dim)
                rows = dim.result
            count = Value(TensorType(DType.F32))
            body.append(CastOp(operands=(rows,), results=(count,), loc=r.loc))
            wide = count
            if f32.rank:
                wide = Value(f32)
                body.append(BroadcastOp(operands=(count,), results=(wide,), loc=r.loc))
            share = Value(f32)
            body.append(BINARY_CLASSES["div"](operands=(row, wide), results=(share,), loc=r.loc))
            row = share
        return row

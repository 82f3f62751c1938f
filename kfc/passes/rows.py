"""Recognising a row program: the shape of IR the row passes (tile, lower-reductions,
lower-ptx) and the row code generator accept.

A row program's function body holds scalar setup ops and one 1-D `tile.parallel` (or, after
`tile`, one `gpu.launch`) over rows. Inside, values are scalars or tiles of one row length N;
loads and stores address a row of a tensor (`x[m, :]`), a whole 1-D tensor (`w[:]`), or a
scalar; reductions run over the row.
"""

from __future__ import annotations

import attrs

from ..diagnostics import Span
from ..ir.core import Block, Op
from ..ir.func import FuncOp
from ..ir.gpu_ops import LaunchOp
from ..ir.tile_ops import (
    BinaryOp, BroadcastOp, CastOp, CmpOp, ConstOp, DimOp, ForOp, IfOp, IotaOp, LoadOp, MaxSumExpOp, ParallelOp, ReduceOp,
    ScanOp, StoreOp, UnaryOp, WhereOp, YieldOp,
)
from ..ir.types import TensorType
from .base import PassError

ROW_OPS = (ConstOp, DimOp, IotaOp, UnaryOp, BinaryOp, CmpOp, WhereOp, CastOp, BroadcastOp, ReduceOp, MaxSumExpOp, ScanOp,
           LoadOp, StoreOp, YieldOp)


def find_row_loop(func: FuncOp, kind=ParallelOp) -> Op:
    loops = [op for op in func.body.ops if isinstance(op, (ParallelOp, LaunchOp))]
    nested = [op for op in func.walk() if isinstance(op, (ParallelOp, LaunchOp)) and op not in loops]
    if len(loops) != 1 or nested:
        raise PassError(f"{func.sym_name} is not a row program: it needs exactly one parallel loop over rows "
                        f"at the top level (found {len(loops)}{' and nested ones' if nested else ''})", func.loc,
                        "the row passes handle ops like rmsnorm, layernorm and softmax")
    loop = loops[0]
    if not isinstance(loop, kind):
        raise PassError(f"expected a {kind.NAME} over rows, found {loop.NAME}", loop.loc,
                        "run tile once, before lower-reductions and lower-ptx")
    if isinstance(loop, ParallelOp) and loop.rank != 1:
        raise PassError(f"the parallel loop runs over {loop.rank} indices; a row program has one (the row)",
                        loop.loc, "fuse the indices into one row index, or use another pipeline")
    return loop


def with_loop_body(func: FuncOp, loop: Op, body: Block) -> FuncOp:
    """The function with the row loop's body replaced (its other top-level ops kept)."""
    new = attrs.evolve(loop, regions=(body,))
    return attrs.evolve(func, regions=(attrs.evolve(func.body, ops=tuple(new if o is loop else o
                                                                           for o in func.body.ops)),))


def body_ops(block) -> list[Op]:
    """A row loop's ops, those of the sequential loops and branches in it included (in program
    order)."""
    out = []
    for op in block.ops:
        out.append(op)
        if isinstance(op, (ForOp, IfOp)):
            for region in op.regions:
                out.extend(body_ops(region))
    return out


def narrowest_load(body) -> int:
    """The element size of the narrowest row tile a row loop's body loads (0 where it loads
    none): what a thread's share of the row is counted in (tile.choose)."""
    return min((op.operands[0].ttype.dtype.itemsize for op in body_ops(body)
                if isinstance(op, LoadOp) and op.result.ttype.rank >= 1), default=0)


def only_summed(loop: Op) -> bool:
    """A row loop whose rows are only added into its sums across rows (a column sum): it
    stores nothing and reduces nothing per row, so each row is read once, into the adds."""
    return bool(loop.results) and not any(isinstance(op, (StoreOp, ReduceOp, ScanOp)) for op in body_ops(loop.body))


def row_length(loop: Op, func: FuncOp) -> int:
    """The one row length of every rank-1 tile in the loop body; checks the body's ops. A
    sequential `for` in the row loop (a row read in chunks, with carried values) and the
    branches of an `if` hold the same ops; their tiles have the one length too."""
    lengths: dict[int, Span | None] = {}
    for op in body_ops(loop.body):
        if isinstance(op, ForOp):
            continue
        if isinstance(op, IfOp):
            continue
        if op.regions:
            raise PassError(f"{op.NAME} inside the row loop: row programs hold straight-line code and for loops",
                            op.loc, "the row passes do not handle other nested regions yet")
        if not isinstance(op, ROW_OPS) and not op.NAME.startswith(("gpu.", "ptx.")):
            raise PassError(f"{op.NAME} is not supported in a row program", op.loc)
        if isinstance(op, ReduceOp) and op.keepdims:
            raise PassError("a reduction with keepdims=true keeps the reduced axis; a row program reduces a row "
                            "to a scalar", op.loc, "drop keepdims: the scalar broadcasts over the row as it is")
        for v in op.results:
            t = v.type
            if not isinstance(t, TensorType) or t.layout is not None and t.layout.kind == "lanes":
                continue
            if t.rank > 1:
                raise PassError(f"{op.NAME} makes a rank-{t.rank} tile {t}; a row program's tiles are rows",
                                op.loc, "the row passes handle tiles of rank 0 and 1")
            if t.rank == 1:
                n = t.shape[0]
                if not isinstance(n, int):
                    raise PassError(f"the row length {n} is symbolic; the row passes need it fixed", op.loc,
                                    f"specialise it, e.g. kfc compile --shape {n}=4096")
                lengths.setdefault(n, op.loc)
        if isinstance(op, ReduceOp) and op.operands[0].ttype.rank != 1:
            raise PassError("row programs reduce a whole row to a scalar", op.loc)
    if len(lengths) > 1:
        a, b = sorted(lengths)[:2]
        raise PassError(f"tiles of two row lengths ({a} and {b}) in one row program", lengths[b])
    if not lengths:
        raise PassError("the row loop holds no row tile", loop.loc)
    return next(iter(lengths))

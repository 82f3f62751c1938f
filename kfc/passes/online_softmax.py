"""Online softmax: a row's maximum and the sum of exp(x - max) over it become one reduction.

    %mx = tile.reduce %a {kind = "max"}                %mx, %s = tile.max_sumexp %a
    %b  = tile.broadcast %mx                   ->      %b  = tile.broadcast %mx
    %e  = tile.exp (tile.sub %a, %b)                   %e  = tile.exp (tile.sub %a, %b)
    %s  = tile.reduce %e {kind = "sum"}

The pair (m, s) combines associatively — (m1, s1) ⊕ (m2, s2) = (M, s1·e^(m1−M) + s2·e^(m2−M))
with M = max(m1, m2) — so the code generator reduces it in one sweep over the row and one
crossing of the CTA and the cluster, where the two reductions took two of each (and a staged
row one more read of shared memory). The interpreter computes tile.max_sumexp exactly as the
two reductions did, so the rewrite changes no result there; the generated code rounds the
rescaled partial sums differently, within the op's tolerance.

The pass rewrites the straight-line body of each parallel loop, where both reductions and the
exponential sit in that one block; put it before stage-rows, which then reads a staged row in
one stretch fewer. It is not in the default pipeline: measured on the H200 (bf16 softmax, eager
do_bench, QuACK's shapes; bench/results/softmax-online-20261202T022216Z.json against the default's
softmax-20261202T015232Z.json, two runs of the same session), it gained 4-6% at rows of 8192 and
16384 and lost 5-6% at rows of 65536 to 262144 and 9% at 4096, where the one chain of (max, sum)
updates through a thread's chunks leaves less to overlap than two independent sweeps.
"""

from __future__ import annotations


import attrs

from ..ir.core import Block
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.tile_ops import BINARY_CLASSES, UNARY_CLASSES, BroadcastOp, MaxSumExpOp, ParallelOp, ReduceKind, ReduceOp
from ..ir.types import MemSpace, TensorType
from .base import Pass, define_pass


def _row_reduce(op, kind: ReduceKind) -> bool:
    if not isinstance(op, ReduceOp) or op.kind is not kind or op.keepdims or tuple(op.axes) != (0,):
        return False
    t = op.operands[0].type
    return isinstance(t, TensorType) and t.rank == 1 and t.dtype is DType.F32 and t.space is MemSpace.REG


def _pairs(block: Block) -> dict[int, ReduceOp]:
    """The sums of exp(a - broadcast(max(a))) in the block, keyed by the id of their max."""
    defs = {r: op for op in block.ops for r in op.results}
    found: dict[int, ReduceOp] = {}
    for op in block.ops:
        if not _row_reduce(op, ReduceKind.SUM):
            continue
        exp = defs.get(op.operands[0])
        if not isinstance(exp, UNARY_CLASSES["exp"]):
            continue
        sub = defs.get(exp.operands[0])
        if not isinstance(sub, BINARY_CLASSES["sub"]):
            continue
        a, b = sub.operands
        bcast = defs.get(b)
        if not isinstance(bcast, BroadcastOp):
            continue
        mx = defs.get(bcast.operands[0])
        if mx is not None and _row_reduce(mx, ReduceKind.MAX) and mx.operands[0] is a and id(mx) not in found:
            found[id(mx)] = op
    return found


def fuse_max_sumexp(block: Block) -> tuple[Block, int]:
    """The block with each such max and sum made one tile.max_sumexp where the max was (its
    results are the two reductions' own values, so no use changes), and how many."""
    pairs = _pairs(block)
    if not pairs:
        return block, 0
    sums = {id(s) for s in pairs.values()}
    out = []
    for op in block.ops:
        if id(op) in sums:
            continue
        if id(op) in pairs:
            op = MaxSumExpOp(operands=op.operands, results=(op.result, pairs[id(op)].result), loc=op.loc)
        out.append(op)
    return Block(block.args, tuple(out)), len(pairs)


@define_pass("online-softmax", "a row's max and sum of exp(x - max) as one reduction of (max, sum) pairs")
class OnlineSoftmax(Pass):

    def run(self, func: FuncOp, ctx) -> FuncOp:
        total, ops = 0, []
        for op in func.body.ops:  # the body of each top-level parallel loop
            if isinstance(op, ParallelOp):
                body, n = fuse_max_sumexp(op.body)
                if n:
                    op, total = attrs.evolve(op, regions=(body,)), total + n
            ops.append(op)
        ctx.note(self, f"{total} max and sum of exponentials fused")
        return attrs.evolve(func, regions=(Block(func.body.args, tuple(ops)),)) if total else func

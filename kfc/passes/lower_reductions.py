"""lower-reductions: a reduction over a `#row` tile becomes a tree of all-reduce steps —
each thread over its own elements, a shuffle butterfly inside each warp, shared memory across
the warps of a row, distributed shared memory across the CTAs of a cluster — ending in a
scalar every thread holds. A mean becomes a sum times 1/N. A row's (max, sum of exp(x - max))
pair (tile.max_sumexp) takes the same steps carrying both values."""

from __future__ import annotations


import attrs

from ..ir.core import Value
from ..ir.dtypes import DType
from ..ir.gpu_ops import (
    ClusterMaxSumExpOp, ClusterReduceOp, CtaMaxSumExpOp, CtaReduceOp, LaunchOp, ThreadMaxSumExpOp, ThreadReduceOp,
    UniformOp, WarpMaxSumExpOp, WarpReduceOp, lanes_layout,
)
from ..ir.rewrite import ValueMap, rebuild_block
from ..ir.tile_ops import BINARY_CLASSES, ConstOp, MaxSumExpOp, ReduceKind, ReduceOp
from ..ir.types import TensorType
from .base import Pass, define_pass
from .rows import find_row_loop, with_loop_body
from ..ir.rewrite import defining_ops, uses


# A row of t threads in each of c CTAs reduces in these steps, a value or a (max, sum) pair alike.
REDUCE_STEPS = {"thread": ThreadReduceOp, "warp": WarpReduceOp, "cta": CtaReduceOp, "cluster": ClusterReduceOp}
PAIR_STEPS = {"thread": ThreadMaxSumExpOp, "warp": WarpMaxSumExpOp, "cta": CtaMaxSumExpOp,
              "cluster": ClusterMaxSumExpOp}


def steps(t: int, c: int) -> list[tuple[str, dict]]:
    """Each thread over its elements; a warp's shuffles once a row has 2 threads; shared memory
    across its warps past 32; distributed shared memory across a cluster."""
    return [("thread", {})] + ([("warp", {"width": min(32, t)})] if t > 1 else []) + \
        ([("cta", {})] if t > 32 else []) + ([("cluster", {})] if c > 1 else [])


@define_pass("lower-reductions", "row reductions to thread, warp-shuffle, shared-memory and cluster steps")
class LowerReductions(Pass):

    def required_features(self) -> frozenset[str]:
        return frozenset()

    def run(self, func, ctx):
        launch = find_row_loop(func, LaunchOp)
        count = 0

        def pair_steps(op) -> list:
            """tile.max_sumexp: the pair through the same steps, then each value as a scalar."""
            t, c = (op.operands[0].ttype.layout.get(k) for k in ("threads", "cluster"))
            lanes = TensorType(op.operands[0].ttype.dtype, (t * c,), layout=lanes_layout(t, c))
            out = []
            pair = (op.operands[0],)
            for level, kw in steps(t, c):
                new = PAIR_STEPS[level](operands=pair, results=(Value(lanes), Value(lanes)), loc=op.loc, **kw)
                out.append(new)
                pair = new.results
            for v, r in zip(pair, op.results):  # the scalars keep the op's own result values
                out.append(UniformOp(operands=(v,), results=(r,), loc=op.loc))
            return out

        def transform(op, vmap: ValueMap):
            nonlocal count
            if isinstance(op, MaxSumExpOp) and op.operands[0].ttype.layout is not None \
                    and op.operands[0].ttype.layout.kind == "row":
                count += 1
                return pair_steps(op)
            if not isinstance(op, ReduceOp):
                return None
            src = op.operands[0].ttype
            layout = src.layout
            if layout is None or layout.kind != "row":
                return None
            t, c, n = layout.get("threads"), layout.get("cluster"), src.shape[0]
            kind = ReduceKind.SUM if op.kind is ReduceKind.MEAN else op.kind
            lanes = TensorType(src.dtype, (t * c,), layout=lanes_layout(t, c))
            out = []

            def make(cls, operand, result_type, **kw):
                new = cls(operands=(operand,), results=(type(operand)(result_type),), loc=op.loc, **kw)
                out.append(new)
                return new.result

            v = op.operands[0]
            for level, kw in steps(t, c):
                v = make(REDUCE_STEPS[level], v, lanes, kind=kind, **kw)
            scalar = TensorType(src.dtype)
            v = make(UniformOp, v, scalar)
            if op.kind is ReduceKind.MEAN:
                inv = ConstOp(operands=(), results=(type(v)(scalar),), loc=op.loc, value=1.0 / n)
                mul = BINARY_CLASSES["mul"](operands=(v, inv.result), results=(type(v)(scalar, op.result.name),),
                                            loc=op.loc)
                out += [inv, mul]
                v = mul.result
            vmap.map(op.result, v)
            count += 1
            return out

        body = rebuild_block(launch.body, ValueMap(), transform)
        ctx.note(self, f"{count} reduction(s) lowered")
        return with_loop_body(func, launch, body)


@define_pass("fuse-reductions", "fold a product into the per-thread sum that consumes it (fma)")
class FuseReductions(Pass):
    """fuse-reductions: the elementwise product feeding a per-thread sum is folded into it
    (acc = fma(a, b, acc)), so the product is never materialised."""


    def run(self, func, ctx):
        launch = find_row_loop(func, LaunchOp)
        defs = defining_ops(func)
        counts = uses(func)
        fused = 0

        def transform(op, vmap: ValueMap):
            nonlocal fused
            if not isinstance(op, ThreadReduceOp) or op.kind is not ReduceKind.SUM or op.map != "":
                return None
            prod = defs.get(op.operands[0])
            if prod is None or prod.NAME != "tile.mul" or counts.get(op.operands[0], 0) != 1:
                return None
            if op.operands[0].ttype.dtype is not DType.F32:
                return None
            fused += 1
            return [attrs.evolve(op, operands=tuple(vmap[v] for v in prod.operands), map="mul")]

        body = rebuild_block(launch.body, ValueMap(), transform)
        ctx.note(self, f"{fused} product(s) fused into reductions")
        return with_loop_body(func, launch, body)

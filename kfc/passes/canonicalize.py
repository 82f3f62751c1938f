"""canonicalize: local simplifications that every later pass may assume were done.

Patterns: identity casts and broadcasts disappear; a widening round trip (bf16 → f32 → bf16)
disappears; scalar constants fold through pure elementwise ops (with the interpreter's exact
semantics, so folding can never disagree with the oracle); a broadcast of a constant becomes a
constant tile; x * 1 and x + 0 on integers, x * 1.0 on floats, disappear; where(c, a, b) with c
constant is a or b (a choice made by a size parameter, `where(D == 2, ...)`, leaves no dead branch).
"""

from __future__ import annotations


import numpy as np

from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.interpreter import Interpreter
from ..ir.tile_ops import BINARY_CLASSES, BinaryOp, BroadcastOp, CastOp, CmpOp, ConstOp, UnaryOp, WhereOp
from .base import Pass, define_pass, option
from .rewriter import PatternRewriter, RewritePattern, RewriteStats, apply_patterns_greedily

# casts that lose nothing: going A -> B -> A returns exactly A's values
_WIDENS = {
    (DType.BF16, DType.F32), (DType.F16, DType.F32), (DType.BF16, DType.F64), (DType.F16, DType.F64),
    (DType.F32, DType.F64), (DType.E4M3, DType.F32), (DType.E5M2, DType.F32), (DType.E4M3, DType.BF16),
    (DType.E5M2, DType.F16), (DType.I8, DType.I32), (DType.I8, DType.I64), (DType.I32, DType.I64),
    (DType.I8, DType.INDEX), (DType.I32, DType.INDEX),
}


class IdentityCast(RewritePattern):
    ROOT = CastOp
    BENEFIT = 3

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        if op.operands[0].type != op.result.type:
            return rw.fail("the cast changes the type")
        return rw.replace([op.operands[0]])


class IdentityBroadcast(RewritePattern):
    ROOT = BroadcastOp
    BENEFIT = 3

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        if op.operands[0].type != op.result.type:
            return rw.fail("the broadcast changes the shape")
        return rw.replace([op.operands[0]])


class WideningRoundTrip(RewritePattern):
    ROOT = CastOp
    BENEFIT = 2

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        inner = rw.defining_op(op.operands[0])
        if not isinstance(inner, CastOp):
            return rw.fail("the operand is not a cast")
        src = inner.operands[0]
        mid = inner.result.ttype.dtype
        if src.type != op.result.type or (src.ttype.dtype, mid) not in _WIDENS:
            return rw.fail("not a widening round trip")
        return rw.replace([src])


def _const_value(rw: PatternRewriter, v):
    d = rw.defining_op(v)
    return d if isinstance(d, ConstOp) else None


class FoldConstants(RewritePattern):
    """Evaluate pure elementwise ops on constant operands with the interpreter."""

    ROOT = (UnaryOp, BinaryOp, CmpOp, CastOp, WhereOp)
    BENEFIT = 2

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        consts = [_const_value(rw, v) for v in op.operands]
        if any(c is None for c in consts):
            return rw.fail("an operand is not constant")
        t = op.result.ttype
        if not t.is_static:
            return rw.fail("symbolic shape")
        interp = Interpreter(None, {})  # constants need no dims
        env = {v: np.full(v.ttype.shape, c.value, dtype=v.ttype.dtype.np) for v, c in zip(op.operands, consts)}
        try:
            (value,) = interp.exec_op(op, env)
        except Exception as e:  # noqa: BLE001 - a fault (1 // 0) is left for run time to report
            return rw.fail(f"folding raised {type(e).__name__}")
        flat = np.asarray(value).reshape(-1)
        if flat.size and not (flat == flat[0]).all():
            return rw.fail("the folded tile is not uniform")
        scalar = flat[0].item() if flat.size else 0
        if t.dtype.is_float:
            scalar = float(scalar)
        elif t.dtype.is_int:
            scalar = int(scalar)
        else:
            scalar = bool(scalar)
        new = rw.create(ConstOp, [], [t], value=scalar)
        return rw.replace([new.result])


class BroadcastConstant(RewritePattern):
    ROOT = BroadcastOp
    BENEFIT = 1

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        c = _const_value(rw, op.operands[0])
        if c is None:
            return rw.fail("the operand is not constant")
        new = rw.create(ConstOp, [], [op.result.type], value=c.value)
        return rw.replace([new.result])


class ConstantCondition(RewritePattern):
    """where(c, a, b) with c a constant tile is a (c true) or b: the branch not taken, a product or
    a reduction say, is then dead code for dce rather than work every thread does."""

    ROOT = WhereOp
    BENEFIT = 2

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        c = _const_value(rw, op.operands[0])
        if c is None:
            return rw.fail("the condition is not constant")
        return rw.replace([op.operands[1] if c.value else op.operands[2]])


class NeutralOperand(RewritePattern):
    """x * 1 and x + 0 (integers), x * 1.0 (floats) are x."""

    ROOT = (BINARY_CLASSES["mul"], BINARY_CLASSES["add"])
    BENEFIT = 1

    def match_and_rewrite(self, op, rw: PatternRewriter) -> bool:
        is_mul = op.NAME == "tile.mul"
        for keep, other in ((0, 1), (1, 0)):
            c = _const_value(rw, op.operands[other])
            if c is None:
                continue
            dtype = op.result.ttype.dtype
            if is_mul and c.value == 1:
                return rw.replace([op.operands[keep]])
            if not is_mul and c.value == 0 and dtype.is_int:  # x + 0.0 is not x when x is -0.0
                return rw.replace([op.operands[keep]])
        return rw.fail("no neutral constant operand")


PATTERNS = (IdentityCast(), IdentityBroadcast(), WideningRoundTrip(), FoldConstants(), BroadcastConstant(),
            ConstantCondition(), NeutralOperand())


@define_pass("canonicalize", "fold constants, drop identity casts/broadcasts and neutral operands")
class Canonicalize(Pass):
    max_iterations: int = option(16, lo=1, hi=1000)

    def run(self, func: FuncOp, ctx) -> FuncOp:
        stats = RewriteStats()
        out = apply_patterns_greedily(func, PATTERNS, self.max_iterations, stats)
        ctx.note(self, f"{sum(stats.applied.values())} rewrites in {stats.iterations} sweep(s)"
                 + ("" if stats.converged else " (iteration cap reached)"), stats=stats)
        return out

"""approx-math: a tile program's f32 exponentials and reciprocal square roots on the SFU.

    %e = tile.exp %x           ->   %m = tile.mul %x, log2(e);  %e = ptx.ex2_approx %m
    %r = tile.rsqrt %x         ->   %r = ptx.rsqrt_approx %x
    %s = tile.sigmoid %x       ->   %m = tile.mul %x, -log2(e); %d = tile.add 1, ptx.ex2_approx %m;
                                    %s = ptx.rcp_approx %d

expf compiles to about eight instructions (range reduction around one ex2.approx), ex2.approx to
one and the product before it to one; an IEEE division to about ten and a branch to its slow
path, rcp.approx.ftz to one. KDA's prepare kernel, bound by instruction issue (its SASS about 2.5
instructions a byte it moves), takes some forty-eight exponentials and twelve sigmoids a thread
(the reciprocals took 3% off it on an H100).

Error: ex2.approx.ftz.f32 is within about 2^-22 of 2^m relatively (the PTX ISA's bound), and
m = x log2(e), rounded once (log2 e itself to f32), moves the result by about ln 2 |m| 2^-24
more: about 6e-6 relatively at exponents of 80, the largest KDA's bounded decays reach. A
sigmoid's rcp.approx adds at most 1 ulp (its denominator is at least 1: nothing to flush). Results
below f32's normal range flush to zero (ftz). The pass applies where every floating-point output
is checked with a tolerance of at least APPROX_MIN_TOLERANCE (1e-5, as lower-ptx's approx), and
never to a value an exact output (an integer, bool or fp8 code) depends on
(lower_ptx.approximable); as there, a comparison or mask reading an approximated value for a
float output may flip where the value lies within that error of its threshold. It notes each
value it approximates, so `kfc compile` reports them. The interpreter computes the same ops (2^m,
1/sqrt(x), 1/x) in f32, so the final IR still says what the GPU computes, to those bounds.

Options: approx = auto (by the tolerance, as above) | on | off.
"""

from __future__ import annotations

import math

from ..ir.core import Value
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.ptx_ops import RcpApproxOp, RsqrtApproxOp
from ..ir.rewrite import rebuild
from ..ir.tile_ops import BINARY_CLASSES, UNARY_CLASSES, ParallelOp
from .base import Pass, define_pass, option
from .lower_ptx import approximable, exp2_of_scaled, scalar_like

LOG2E = math.log2(math.e)


@define_pass("approx-math", "f32 exp, rsqrt and sigmoid of a tile program on ex2.approx, rsqrt.approx and rcp.approx")
class ApproxMath(Pass):
    approx: str = option("auto", choices=("auto", "on", "off"))

    def run(self, func: FuncOp, ctx) -> FuncOp:
        if not any(isinstance(op, ParallelOp) for op in func.body.ops):
            return func
        may = approximable(func, ctx, self.approx)
        exp, rsqrt, sigmoid = UNARY_CLASSES["exp"], UNARY_CLASSES["rsqrt"], UNARY_CLASSES["sigmoid"]
        counts = {"exp": 0, "rsqrt": 0, "sigmoid": 0}

        def transform(op, vmap):
            if not isinstance(op, (exp, rsqrt, sigmoid)) or op.result.ttype.dtype is not DType.F32 \
                    or not may(op.result):
                return None
            x, loc = op.operands[0], op.loc
            name = op.NAME.split(".")[1]
            counts[name] += 1
            how = {"rsqrt": "rsqrt.approx", "exp": "ex2.approx", "sigmoid": "ex2.approx and rcp.approx"}[name]
            ctx.approximated(self, f"{how} for {name}", loc)
            if isinstance(op, rsqrt):
                return [RsqrtApproxOp(operands=(x,), results=op.results, loc=loc)]
            if isinstance(op, exp):
                return exp2_of_scaled(x, LOG2E, op.result, loc)
            e = Value(x.type)
            ops = exp2_of_scaled(x, -LOG2E, e, loc)
            one_ops, one = scalar_like(1.0, x, loc)
            d = BINARY_CLASSES["add"](operands=(one, e), results=(Value(x.type),), loc=loc)
            return ops + one_ops + [d, RcpApproxOp(operands=(d.result,), results=op.results, loc=loc)]

        out = rebuild(func, transform)
        ctx.note(self, ", ".join(f"{n} {name}" for name, n in counts.items()) + " approximated"
                 if any(counts.values()) else "nothing approximated")
        return out

"""linearize: a parallel loop over several indices becomes one loop over their product, each
index recomputed from the one (row-major: the last index varies fastest).

    parallel t in 0..T, h in 0..H { ... q[t, h, :] ... }
      ->
    parallel m in 0..T*H { t = m // H; h = m % H; ... q[t, h, :] ... }

so an op written over (token, head) is a row program with T·H rows. Only loops whose lower
bounds are all 0 are linearised (others are left as they are). Semantics do not change: the
iterations are independent, so their order does not matter.
"""

from __future__ import annotations


import attrs

from ..ir.core import Block, Value
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.rewrite import ValueMap, rebuild_block
from ..ir.tile_ops import BINARY_CLASSES, ConstOp, ParallelOp
from ..ir.types import TensorType
from .base import Pass, define_pass

INDEX = TensorType(DType.INDEX)


def _is_zero(v: Value, defs: dict) -> bool:
    d = defs.get(v)
    return isinstance(d, ConstOp) and d.value == 0


def _binary(name: str, a: Value, b: Value, loc, out: list) -> Value:
    op = BINARY_CLASSES[name](operands=(a, b), results=(Value(INDEX),), loc=loc)
    out.append(op)
    return op.result


@define_pass("linearize", "fuse a parallel loop's indices into one (row-major), so it runs over one index")
class Linearize(Pass):

    def run(self, func: FuncOp, ctx) -> FuncOp:
        defs = {r: op for op in func.body.ops for r in op.results}
        ops, changed = [], 0
        for op in func.body.ops:
            if not isinstance(op, ParallelOp) or op.rank == 1 or not all(_is_zero(v, defs) for v in op.lowers):
                ops.append(op)
                continue
            loc = op.loc
            total = op.uppers[0]
            for hi in op.uppers[1:]:
                total = _binary("mul", total, hi, loc, ops)
            zero = ConstOp(results=(Value(INDEX),), loc=loc, value=0)
            ops.append(zero)
            m = Value(INDEX, "m")
            body: list = []
            vmap = ValueMap()
            rest = m
            for k in range(op.rank - 1, 0, -1):  # the last index varies fastest
                hi = op.uppers[k]
                vmap.map(op.body.args[k], _binary("rem", rest, hi, loc, body))
                rest = _binary("div", rest, hi, loc, body)
            vmap.map(op.body.args[0], rest)
            body.extend(rebuild_block(op.body, vmap).ops)
            ops.append(ParallelOp(operands=(zero.result, total), results=op.results, reduce=op.reduce,
                                  regions=(Block((m,), tuple(body)),), loc=loc))
            changed += 1
        if not changed:
            return func
        ctx.note(self, f"{changed} loop(s) over several indices now run over one")
        return attrs.evolve(func, regions=(Block(func.body.args, tuple(ops)),))

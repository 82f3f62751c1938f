"""dce: remove ops whose results nobody uses and that have no effect: pure ops, loads, and
loops with no store inside. Repeats until nothing more can go."""

from __future__ import annotations


import attrs

from ..ir.core import Block, Op
from ..ir.func import FuncOp
from ..ir.rewrite import uses
from .base import Pass, define_pass


def _has_effect(op: Op) -> bool:
    if op.has_trait("writes_memory"):
        return True
    if op.has_trait("terminator"):
        return False  # it only ends its block
    if op.has_trait("pure") or op.has_trait("reads_memory") or op.has_trait("loop") or op.has_trait("branch"):
        return any(_has_effect(inner) for r in op.regions for inner in r.ops)
    return True  # an op that declares nothing is assumed to have an effect


@define_pass("dce", "remove unused pure ops, loads and effect-free loops")
class DCE(Pass):

    def run(self, func: FuncOp, ctx) -> FuncOp:
        removed = 0
        while True:
            counts = uses(func)
            dropped = 0

            def block(b: Block) -> Block:
                nonlocal dropped
                out = []
                for op in b.ops:
                    if (not op.has_trait("terminator") and not _has_effect(op)
                            and all(counts.get(r, 0) == 0 for r in op.results)):
                        dropped += 1
                        continue
                    if op.regions:
                        op = attrs.evolve(op, regions=tuple(block(r) for r in op.regions))
                    out.append(op)
                return Block(b.args, tuple(out))

            func = attrs.evolve(func, regions=(block(func.body),))
            removed += dropped
            if not dropped:
                break
        ctx.note(self, f"{removed} dead op(s) removed")
        return func

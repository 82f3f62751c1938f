"""hoist-loads: each load of a tile from a tensor the op never writes moves up its block, to just
after the ops that define its operands (in a loop body, the first ops of the iteration).

    %U = tile.sub %u, (tile.dot %w, %S)          %qg = tile.load %qg_in[%t:%t+C limit %eos, ...]
    %qg = tile.load %qg_in[...]           ->     %U = tile.sub %u, (tile.dot %w, %S)
    %o = tile.dot %qg, %S                         %o = tile.dot %qg, %S

Nothing the op writes can change what such a load reads, so it reads the same values wherever it
stands; the interpreter computes the same results before and after. (That an output is not an
input's memory is the kernels' contract already: their pointers are `__restrict__`.) For the tile emitter
(kfc.codegen.tile_emitter) the loads of an iteration then stand together before the work that
reads them, so it stores them into shared memory in one phase (one wait for memory and one
barrier, not one of each per tile). Loads keep their order among themselves; other ops do not move.
"""

from __future__ import annotations

import attrs

from ..ir.core import Block, Op, Value
from ..ir.func import FuncOp
from ..ir.tile_ops import LoadOp
from ..ir.types import MemSpace, TensorType
from .base import Pass, define_pass


def written_tensors(func: FuncOp) -> set[Value]:
    """The tensors some op of the function may write: every tensor operand of an op that writes
    memory (a store's destination, and conservatively whatever else such an op names)."""
    return {v for op in func.walk() if op.has_trait("writes_memory") for v in op.operands
            if isinstance(v.ttype, TensorType) and v.ttype.space is not MemSpace.REG}


@define_pass("hoist-loads", "move loads of tensors the op never writes up to where their operands are defined")
class HoistLoads(Pass):
    def run(self, func: FuncOp, ctx) -> FuncOp:
        written = written_tensors(func)
        moved = 0

        def block(b: Block) -> Block:
            nonlocal moved
            out: list[Op] = []
            defined_at: dict[Value, int] = {}  # a value this block defines -> where its op stands in `out`
            for op in b.ops:
                if op.regions:
                    op = attrs.evolve(op, regions=tuple(block(r) for r in op.regions))
                at = len(out)
                if isinstance(op, LoadOp) and not op.regions and op.operands[0] not in written:
                    # just after the last op defining an operand, behind the loads already moved there
                    at = max((defined_at[v] + 1 for v in op.operands if v in defined_at), default=0)
                    while at < len(out) and isinstance(out[at], LoadOp) and out[at] is not op:
                        at += 1
                    moved += at < len(out)
                out.insert(at, op)
                defined_at = {r: i for i, o in enumerate(out) for r in o.results}
            return Block(b.args, tuple(out))

        func = attrs.evolve(func, regions=(block(func.body),))
        ctx.note(self, f"{moved} load(s) moved up")
        return func

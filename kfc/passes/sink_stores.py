"""sink-stores: each store of a tile moves down its block, past the work that does not touch the
memory it writes, to just before the next store (or the block's end), so that a block's stores
stand together.

    w[...] = cast(dot(Ainv, x))                   %wc = tile.dot %Ainv, %x
    u[...] = cast(dot(Ainv, y))          ->       %uc = tile.dot %Ainv, %y
                                                  tile.store %wc -> %w[...]
                                                  tile.store %uc -> %u[...]

A store's value is an SSA value, the same wherever the store stands, and no op it passes reads
or writes the tensor it writes (a load of it, an op with regions, a terminator: it stops before
those), so the interpreter computes the same results before and after. For the tile emitter
(kfc.codegen.tile_emitter) stores side by side are written in one phase, and the products they
store are all pending at once, so products reading the same operand may share a phase
(sharing_b, sharing_a): what KDA's prepare kernel had to be written in that order for by hand.
Stores keep their order among themselves.
"""

from __future__ import annotations

import attrs

from ..ir.core import Block, Op
from ..ir.func import FuncOp
from ..ir.tile_ops import StoreOp
from ..ir.types import MemSpace, TensorType
from .base import Pass, define_pass


def touched_memory(op: Op) -> set:
    """The tensors (not register tiles) an op names: what it may read or write."""
    return {v for v in op.operands if isinstance(v.ttype, TensorType) and v.ttype.space is not MemSpace.REG}


def barrier_to(store: StoreOp, op: Op) -> bool:
    """Whether a store may not move past op: another store (stores keep their order and stand
    together), an op with regions or a terminator, or one naming the tensor the store writes."""
    return (isinstance(op, StoreOp) or bool(op.regions) or op.has_trait("terminator")
            or store.operands[1] in touched_memory(op))


@define_pass("sink-stores", "move each store of a tile down to the next store, past work not touching its tensor")
class SinkStores(Pass):
    def run(self, func: FuncOp, ctx) -> FuncOp:
        moved = 0

        def block(b: Block) -> Block:
            nonlocal moved
            ops = [attrs.evolve(op, regions=tuple(block(r) for r in op.regions)) if op.regions else op
                   for op in b.ops]
            # from the last op up: a store sinks past its followers until one bars it
            for i in range(len(ops) - 1, -1, -1):
                if not isinstance(ops[i], StoreOp):
                    continue
                j = i
                while j + 1 < len(ops) and not barrier_to(ops[i], ops[j + 1]):
                    j += 1
                if j > i:
                    ops.insert(j, ops.pop(i))
                    moved += 1
            return Block(b.args, tuple(ops))

        func = attrs.evolve(func, regions=(block(func.body),))
        ctx.note(self, f"{moved} store(s) moved down")
        return func

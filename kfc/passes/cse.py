"""cse: a pure op equal to one already computed in scope (same op, operands, attributes and
result types) is replaced by the earlier result. Scopes follow regions: an op inside a loop may
reuse a value from outside it, never the other way round. A load from an input no op writes is
pure too: kernels take their tensors as `__restrict__`, so nothing else writes it during the
launch, and a row the program names twice (`cumsum(x[m, :])` and `sum(x[m, :])`) is read from
memory once. Only tile.load: once loads are refined into instructions (lower-ptx), a second load
of a row is stage-rows's deliberate re-read of a row too long to keep in registers."""

from __future__ import annotations


import attrs

from ..ir.core import Block, Op
from ..ir.func import FuncOp
from ..ir.rewrite import ValueMap, memory_written
from ..ir.tile_ops import LoadOp
from .base import Pass, define_pass


def _exact(v):
    """Attribute values compared by identity of bits: 0.0 and -0.0 differ, NaN equals NaN."""
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, tuple):
        return tuple(_exact(x) for x in v)
    return v


def _key(op: Op):
    try:
        attrs_key = tuple(sorted((k, _exact(v)) for k, v in op.attributes().items()))
        hash(attrs_key)
    except TypeError:
        return None
    return (op.NAME, tuple(id(v) for v in op.operands), attrs_key, tuple(r.type for r in op.results))


@define_pass("cse", "reuse identical pure computations")
class CSE(Pass):

    def run(self, func: FuncOp, ctx) -> FuncOp:
        vmap = ValueMap()
        removed = 0
        read_only = set(func.inputs) - written(func)

        def pure(op: Op) -> bool:
            return op.has_trait("pure") or (LoadOp.unrefined(op) and op.operands[0] in read_only)

        def block(b: Block, scopes: list[dict]) -> Block:
            nonlocal removed
            table: dict = {}
            scopes = scopes + [table]
            out = []
            for op in b.ops:
                op = attrs.evolve(op, operands=tuple(vmap[v] for v in op.operands),
                                  regions=tuple(block(r, scopes) for r in op.regions)) if (op.operands or op.regions) else op
                if pure(op) and not op.regions and op.results:
                    key = _key(op)
                    if key is not None:
                        prior = next((s[key] for s in reversed(scopes) if key in s), None)
                        if prior is not None:
                            vmap.map_all(op.results, prior.results)
                            removed += 1
                            continue
                        table[key] = op
                out.append(op)
            return Block(b.args, tuple(out))

        new = attrs.evolve(func, regions=(block(func.body, []),))
        ctx.note(self, f"{removed} duplicate op(s) removed")
        return new


def written(func: FuncOp) -> set:
    """The memory any op of `func` may write."""
    return {v for op in func.walk() for v in memory_written(op)}

"""Bind shape symbols to sizes: every type becomes static and `tile.dim` becomes a constant."""

from __future__ import annotations

import attrs

from . import constexpr
from .core import Block, Op, Value
from .func import FuncOp
from .tile_ops import ConstOp, DimOp
from .types import TensorType


def specialize(func: FuncOp, dims: dict[str, int], partial: bool = False) -> FuncOp:
    """Bind `dims`; with `partial`, symbols not in `dims` stay symbolic (run-time sizes)."""
    dims = {k: v for k, v in dims.items() if k in func.symbols}
    missing = [s for s in func.symbols if s not in dims]
    if missing and not partial:
        from ..diagnostics import KfcError

        raise KfcError(f"cannot specialise {func.sym_name}: no size for {', '.join(missing)}")
    vmap: dict[Value, Value] = {}

    def val(v: Value) -> Value:
        if v not in vmap:
            t = v.type.bind(dims) if isinstance(v.type, TensorType) else v.type
            vmap[v] = Value(t, v.name)
        return vmap[v]

    def block(b: Block) -> Block:
        return Block(tuple(val(a) for a in b.args), tuple(op_(o) for o in b.ops))

    def op_(o: Op) -> Op:
        if isinstance(o, DimOp) and o.sym in dims:
            return ConstOp(operands=(), results=(val(o.result),), loc=o.loc, value=int(dims[o.sym]))
        return attrs.evolve(o, operands=tuple(val(v) for v in o.operands),
                            results=tuple(val(r) for r in o.results),
                            regions=tuple(block(r) for r in o.regions))

    # defaults written over dims become numbers once the dims are known
    def resolve(v):
        if isinstance(v, str) and constexpr.symbols_of(v) <= set(dims):
            try:
                return constexpr.evaluate(v, dims)
            except constexpr.ConstExprError as e:
                from ..diagnostics import KfcError

                raise KfcError(f"a default of {func.sym_name} at {dims}: {e}", func.loc) from None
        return v

    defaults = tuple((k, resolve(v)) for k, v in func.defaults)
    return attrs.evolve(func, regions=(block(func.body),), defaults=defaults)

"""Bind shape symbols to sizes: every type becomes static and `tile.dim` becomes a constant.

Binding proves the sizes first: every dim of every argument must come out at least 1, and a
tensor's bytes must fit the 64-bit signed offsets kernels index with.
"""

from __future__ import annotations

import attrs

from ..diagnostics import KfcError
from . import constexpr
from .core import Block, Op, Value
from .func import FuncOp
from .tile_ops import ConstOp, DimOp
from .types import SymDim, TensorType

INDEX_LIMIT = 2**63 - 1  # the largest byte offset a kernel's 64-bit signed index arithmetic reaches


def check_dims(func: FuncOp, dims: dict[str, int], where: str = "") -> None:
    """Raise a KfcError at the argument's type when a bound dim is below 1 or a tensor's bytes
    overflow what kernels index with. `where` says where the sizes came from (e.g. "--shape")."""
    given = ", ".join(f"{k}={v}" for k, v in dims.items() if k in func.symbols)
    source = f" ({where}: {given})" if where else f" ({given})"
    for v in func.args:
        t = v.type
        if not isinstance(t, TensorType):
            continue
        nbytes = t.dtype.itemsize
        for i, d in enumerate(t.shape):
            if isinstance(d, SymDim):
                if d.name not in dims:
                    continue
                n = dims[d.name] + d.offset
            else:
                n = d
            if n < 1:
                need = f"{d.name} >= {1 - d.offset}" if isinstance(d, SymDim) else "a size of at least 1"
                raise KfcError(f"dim {i} of {v.name} ({d}) is {n}{source}; every dim must be at least 1",
                               v.loc or func.loc, f"choose sizes with {need}")
            nbytes *= n
        if nbytes > INDEX_LIMIT:
            raise KfcError(f"{v.name} ({t}) would hold {nbytes} bytes{source}, more than the 64-bit offsets "
                           f"kernels index with reach (2**63 - 1)", v.loc or func.loc, "choose smaller sizes")


def specialize(func: FuncOp, dims: dict[str, int], partial: bool = False, where: str = "") -> FuncOp:
    """Bind `dims`; with `partial`, symbols not in `dims` stay symbolic (run-time sizes)."""
    dims = {k: v for k, v in dims.items() if k in func.symbols}
    missing = [s for s in func.symbols if s not in dims]
    if missing and not partial:
        raise KfcError(f"cannot specialise {func.sym_name}: no size for {', '.join(missing)}")
    check_dims(func, dims, where)
    vmap: dict[Value, Value] = {}

    def val(v: Value) -> Value:
        if v not in vmap:
            t = v.type.bind(dims) if isinstance(v.type, TensorType) else v.type
            vmap[v] = Value(t, v.name, v.loc)
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
                raise KfcError(f"a default of {func.sym_name} at {dims}: {e}", func.loc) from None
        return v

    defaults = tuple((k, resolve(v)) for k, v in func.defaults)
    return attrs.evolve(func, regions=(block(func.body),), defaults=defaults)

"""Binding a call's argument shapes to a function's signature: shape symbols get sizes."""

from __future__ import annotations

from ..diagnostics import KfcError
from .func import FuncOp
from .types import MemSpace, SymDim


def bind_dims(func: FuncOp, shapes: dict[str, tuple[int, ...] | None], dims: dict[str, int] | None = None) -> dict[str, int]:
    """Sizes of the shape symbols implied by the given tensor shapes (None: an absent optional
    tensor). Raises KfcError naming the tensor and dim on any disagreement."""
    dims = dict(dims or {})
    origin = {k: "the given dims" for k in dims}
    for v in func.args:
        t = v.ttype
        if t.space is MemSpace.REG or v.name not in shapes:
            continue
        shape = shapes[v.name]
        if shape is None:
            if not t.optional:
                raise KfcError(f"missing tensor {v.name!r} ({t})")
            continue
        if len(shape) != t.rank:
            raise KfcError(f"{v.name!r} has {len(shape)} dims, the signature says {t}",
                           hint=f"pass a {t.rank}-D tensor")
        for i, (d, n) in enumerate(zip(t.shape, shape)):
            if isinstance(d, int):
                if d != n:
                    raise KfcError(f"{v.name!r} dim {i} is {n}, the signature fixes it at {d}")
                continue
            value = n - d.offset
            if d.name in dims and dims[d.name] != value:
                raise KfcError(f"shape symbol {d.name} is {dims[d.name]} from {origin[d.name]}, "
                               f"but {value} from {v.name!r} dim {i} (size {n})",
                               hint="the tensors' shapes must agree as the signature says")
            dims.setdefault(d.name, value)
            origin.setdefault(d.name, f"{v.name!r} dim {i}")
    return dims


def output_shape(t, dims: dict[str, int]) -> tuple[int, ...]:
    out = []
    for d in t.shape:
        if isinstance(d, SymDim):
            if d.name not in dims:
                raise KfcError(f"cannot size an output: symbol {d.name} is not bound by any input")
            n = dims[d.name] + d.offset
            if n < 0:
                raise KfcError(f"cannot size an output: its dim {d} would be {n} at {d.name}={dims[d.name]}",
                               hint=f"pass inputs with {d.name} >= {-d.offset}")
            out.append(n)
        else:
            out.append(d)
    return tuple(out)

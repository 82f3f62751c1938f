"""kfc kernels as torch custom ops: `kfc::<op>` with a fake (for torch.compile and meta
tensors), callable as torch.ops.kfc.<op>.

    rmsnorm = kfc.load("kernels/rmsnorm.kfc")
    op = kfc.ops.register(rmsnorm)        # torch.ops.kfc.rmsnorm(x, w, eps)

One op per .kfc op, not per instance: the op takes any of the dtypes its type parameters
allow, and the kernel picks its instance by the inputs' dtypes, as a direct call does. The
fake computes the outputs' shapes from the signature (symbolic sizes stay symbolic) and their
dtypes from the instance. Gradients are not registered here (kfc.nn registers the norms' and
softmax's); an op without them raises if autograd reaches it.
"""

from __future__ import annotations

import threading

from .diagnostics import KfcError
from .ir.signature import bind_dims, output_shape
from .ir.types import MemSpace

_LOCK = threading.Lock()
_REGISTERED: dict[str, tuple[str, object]] = {}  # op name -> (its .kfc text, the op)
_LIBRARIES: list = []  # torch.library.Library objects must outlive their ops


def schema(kernel) -> str:
    """The torch schema of a kfc op: tensors as Tensor (Tensor? when optional), scalars as float
    or int (with their defaults), outputs as a Tensor or a tuple of them."""
    parts = []
    for v in kernel.func.inputs:
        t = v.ttype
        if t.space is MemSpace.REG:
            kind = "float" if t.dtype.is_float else "int"
            default = kernel.func.default_of(v.name)
            if isinstance(default, (int, float)) and not isinstance(default, bool):
                parts.append(f"{kind} {v.name}={float(default) if kind == 'float' else int(default)!r}")
            else:
                parts.append(f"{kind} {v.name}")
        else:
            parts.append(f"Tensor{'?' if t.optional else ''} {v.name}")
    n_out = len(kernel.func.outputs)
    ret = "Tensor" if n_out == 1 else "(" + ", ".join(["Tensor"] * n_out) + ")"
    return f"({', '.join(parts)}) -> {ret}"


def register(kernel, name: str | None = None):
    """Register `kernel` (a kfc.KfcKernel) as torch.ops.kfc.<name> (default: the op's name).
    Registering the same op again returns the same torch op; another op under a taken name
    is an error."""
    import torch  # lazy: torch (~3 s); kfc package reads schema() without it

    name = name or kernel.spec.name
    with _LOCK:
        if name in _REGISTERED:
            text, op = _REGISTERED[name]
            if text != kernel.spec.text:
                raise KfcError(f"torch op kfc::{name} is already registered for another op",
                               hint="register this one under another name: kfc.ops.register(kernel, name=...)")
            return op
        lib = torch.library.Library("kfc", "FRAGMENT")
        lib.define(name + schema(kernel))
        lib.impl(name, lambda *args: kernel(*args), "CUDA")
        torch.library.register_fake(f"kfc::{name}", _fake(kernel), lib=lib)
        _LIBRARIES.append(lib)
        op = getattr(torch.ops.kfc, name)
        _REGISTERED[name] = (kernel.spec.text, op)
        return op


def _fake(kernel):
    import torch  # lazy: torch (~3 s); kfc package reads schema() without it

    def fake(*args):
        bound = kernel.bind(args, {})
        inst = kernel.instance_for(bound)
        shapes = {v.name: (None if bound.get(v.name) is None else tuple(bound[v.name].shape))
                  for v in inst.func.inputs if v.ttype.space is not MemSpace.REG}
        dims = bind_dims(inst.func, shapes)
        device = next(t.device for t in bound.values() if isinstance(t, torch.Tensor))
        outs = tuple(torch.empty(output_shape(v.ttype, dims), dtype=v.ttype.dtype.torch, device=device)
                     for v in inst.func.outputs)
        return outs[0] if len(outs) == 1 else outs
    return fake

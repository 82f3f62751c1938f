"""An op instance as a gate problem: inputs drawn on the device as its check block says (fresh
random values of several seeds and ranges, never zeros), NaN-poisoned outputs, the reference,
tolerances per output dtype, and the bytes a call must move."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..check.runner import require_reference, run_reference, scalar_default
from ..check.sandbox import Limits, shared_sandbox
from ..model.spec import CheckSpec, OpSpec
from ..ir.dtypes import dtype_of_torch
from ..ir.types import MemSpace, bind_dim
from .gate import Case, Problem
from ..check.generators import GENERATORS
from ..ir.signature import bind_dims

# generators whose values are a distribution's spread: scaled by the gate's value ranges
SCALED = {"normal", "uniform"}


def _draw(name: str, args: tuple, shape: tuple[int, ...], dtype, dims: dict[str, int], gen, scale: float, device):
    import torch  # lazy: torch (~3 s); the tune parent imports this module and never loads torch

    args = tuple(dims[a] if isinstance(a, str) else a for a in args)
    if name == "normal":
        mean, std = (list(args) + [0.0, 1.0][len(args):])[:2]
        x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std * scale + mean * scale
    elif name == "uniform":
        lo, hi = (list(args) + [0.0, 1.0][len(args):])[:2]
        x = (torch.rand(shape, generator=gen, device=device) * (hi - lo) + lo) * scale
    elif name in ("logsigmoid", "logsigmoid_resets"):
        mean, std, p, value = (list(args) + [0.0, 1.0, 0.02, -1e5][len(args):])[:4]
        x = torch.nn.functional.logsigmoid(torch.randn(shape, generator=gen, device=device) * std + mean)
        if name == "logsigmoid_resets":  # a fraction p of reset gates (kfc.check.generators)
            x = torch.where(torch.rand(shape, generator=gen, device=device) < p, value, x)
    elif name == "sigmoid":
        mean, std = (list(args) + [0.0, 1.0][len(args):])[:2]
        x = torch.sigmoid(torch.randn(shape, generator=gen, device=device) * std + mean)
    elif name == "unit":
        x = torch.randn(shape, generator=gen, device=device)
        x = x / x.norm(dim=-1, keepdim=True)
    elif name == "randint":
        lo, hi = (list(args) + [0, 100][len(args):])[:2]
        return torch.randint(int(lo), int(hi), shape, generator=gen, device=device, dtype=dtype)
    elif name == "offsets":  # small: drawn on the host as kfc check draws it

        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen, device=device).item())
        cu = GENERATORS["offsets"].fn(np.random.default_rng(seed), shape, *args)
        return torch.as_tensor(np.asarray(cu), device=device).to(dtype)
    elif name == "bool":
        return torch.rand(shape, generator=gen, device=device) < 0.5
    else:
        raise ValueError(f"no device generator for {name}")
    return x.to(dtype)


def op_problem(spec: OpSpec, device: str = "cuda", limits: Limits | None = None) -> Problem:
    """The gate's view of `spec` with inputs drawn on `device`. The reference runs in its own
    child process (kfc.check.sandbox), reading GPU inputs in place through CUDA IPC."""
    import torch  # lazy: torch (~3 s); the tune parent imports this module and never loads torch

    func = spec.func
    check = spec.check or CheckSpec()
    require_reference(spec)
    on_gpu = torch.device(device).type == "cuda"
    # exact outputs (integers, bools, fp8) take their bits from the check block's authority:
    # torch on the CPU unless it says "device" (torch's GPU kernels may round otherwise)
    host_reference = on_gpu and check.exact_reference == "cpu" and any(
        v.ttype.dtype.is_exact for v in func.outputs)
    sandbox = shared_sandbox(limits, "cuda" if on_gpu and not host_reference else "cpu")
    tensors = [v for v in func.inputs if v.ttype.space is not MemSpace.REG]

    def shape_of(v, dims):
        return tuple(int(bind_dim(d, dims)) for d in v.ttype.shape)

    def make_inputs(dims: dict[str, int], seed: int, scale: float) -> tuple:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
        out = []
        for v in func.inputs:
            t = v.ttype
            if t.space is MemSpace.REG:
                default = func.default_of(v.name)
                out.append(scalar_default(spec, v.name, dims) if default is not None else 1.0)
                continue
            g = check.inputs.get(v.name)
            if g is not None:
                name, args = g.name, g.args
            else:
                name, args = ("normal", ()) if t.dtype.is_float else ("bool", ()) if t.dtype.is_bool else ("randint", (0, 100))
            out.append(_draw(name, args, shape_of(v, dims), t.dtype.torch, dims, gen,
                             scale if name in SCALED else 1.0, device))
        return tuple(out)

    def poisoned(v, dims):
        t = v.ttype
        if t.dtype.is_float and t.dtype.itemsize == 1:  # torch cannot fill fp8: all ones is its NaN
            return torch.full(shape_of(v, dims), 0xFF, dtype=torch.uint8, device=device).view(t.dtype.torch)
        return torch.full(shape_of(v, dims), float("nan") if t.dtype.is_float else 0, dtype=t.dtype.torch,
                          device=device)

    def make_outputs(dims: dict[str, int]) -> tuple:
        return tuple(poisoned(v, dims) for v in func.outputs)

    def reference(*inputs) -> tuple:
        args = dict(zip(func.input_names, inputs))
        dims = _dims_of(func, args)
        if host_reference:
            args = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        out = run_reference(spec, args, dims, sandbox=sandbox)
        return tuple(torch.as_tensor(o).float().to(device) if host_reference else torch.as_tensor(o).float()
                     for o in out)

    def tolerance(out) -> float:
        d = dtype_of_torch(out.dtype)
        return check.tolerance_for(d.value if d is not None else "f32")

    def bytes_moved(dims: dict[str, int]) -> int:
        total = 0
        for v in list(tensors) + list(func.outputs):
            total += math.prod(shape_of(v, dims)) * v.ttype.dtype.itemsize
        return total

    return Problem(make_inputs, make_outputs, reference, tolerance, bytes_moved)


def _dims_of(func, args: dict[str, Any]) -> dict[str, int]:
    shapes = {k: (None if v is None else tuple(v.shape)) for k, v in args.items() if v is None or hasattr(v, "shape")}
    return bind_dims(func, shapes)


def gate_cases(spec: OpSpec, dims: dict[str, int], row_dims: list[str]) -> list[Case]:
    """The tuned shape, then unseen ones: one row and seven rows (the row count is a run-time
    argument, so the same binary must handle them)."""
    cases = [Case(dict(dims), "tuned shape")]
    for row in row_dims:
        for m in (1, 7):
            if dims.get(row) != m:
                cases.append(Case({**dims, row: m}, f"unseen shape {row}={m}"))
    return cases

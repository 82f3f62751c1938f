"""Functional forms of kfc's norms and softmax, with torch.nn.functional's arguments.

    y = kfc.nn.functional.rms_norm(x, (4096,), weight, eps=1e-6)
    y, residual_out = kfc.nn.functional.rms_norm(x, (4096,), weight, residual=residual)
    y = kfc.nn.functional.layer_norm(x, (4096,), weight, bias)
    y = kfc.nn.functional.softmax(x, dim=-1)

x may have any leading dims and be bf16, f16 or f32; the output has x's dtype and shape. Under
autograd or torch.compile the call goes through the custom ops of kfc.nn.ops (one graph node,
kfc's backward kernels); called eagerly without gradients it calls the kernel directly, which
costs a few microseconds of host time less.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch
from torch import Tensor

from ..diagnostics import KfcError
from . import ops

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _rows(x: Tensor, normalized_shape: Sequence[int], what: str) -> tuple[Tensor, int]:
    shape = tuple(normalized_shape) if not isinstance(normalized_shape, int) else (normalized_shape,)
    if x.dtype not in DTYPES:
        raise KfcError(f"{what}: x is {x.dtype}; kfc's kernels take bfloat16, float16 or float32",
                       hint="convert it with .to(torch.bfloat16) (or float16, float32)")
    if tuple(x.shape[x.dim() - len(shape):]) != shape or x.dim() < len(shape):
        raise KfcError(f"{what}: x has shape {tuple(x.shape)}, which does not end in normalized_shape {shape}")
    n = math.prod(shape)
    return x.reshape(-1, n), n


def _flat(param: Optional[Tensor], n: int, what: str) -> Optional[Tensor]:
    if param is None:
        return None
    if param.numel() != n:
        raise KfcError(f"{what} has {param.numel()} elements; normalized_shape has {n}")
    return param.reshape(n)


def _eager(*tensors: Optional[Tensor]) -> bool:
    """Whether a call may skip the custom op: not traced, and no gradient wanted."""
    if torch.compiler.is_compiling():
        return False
    return not torch.is_grad_enabled() or not any(t is not None and t.requires_grad for t in tensors)


def rms_norm(x: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor] = None,
             eps: Optional[float] = None, residual: Optional[Tensor] = None):
    """torch.nn.functional.rms_norm; with `residual`, (y, residual_out) where residual_out =
    x + residual and y = rms_norm(residual_out) (QuACK's fused residual)."""
    rows, n = _rows(x, normalized_shape, "rms_norm")
    w = _flat(weight, n, "rms_norm: weight")
    eps = torch.finfo(x.dtype).eps if eps is None else float(eps)
    if residual is not None:
        if residual.shape != x.shape:
            raise KfcError(f"rms_norm: residual has shape {tuple(residual.shape)}, x has {tuple(x.shape)}")
        res = residual.reshape(-1, n)
        op = ops.rms_norm_residual_rows if _eager(x, w, residual) else ops.rms_norm_residual
        y, out = op(rows, res, w, eps)
        return y.view(x.shape), out.view(x.shape).to(residual.dtype)
    y = (ops.rms_norm_rows if _eager(x, w) else ops.rms_norm)(rows, w, eps)
    return y.view(x.shape)


def layer_norm(x: Tensor, normalized_shape: Sequence[int], weight: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, eps: float = 1e-5) -> Tensor:
    """torch.nn.functional.layer_norm."""
    rows, n = _rows(x, normalized_shape, "layer_norm")
    w, b = _flat(weight, n, "layer_norm: weight"), _flat(bias, n, "layer_norm: bias")
    y = (ops.layer_norm_rows if _eager(x, w, b) else ops.layer_norm)(rows, w, b, float(eps))
    return y.view(x.shape)


def softmax(x: Tensor, dim: int = -1, dtype: Optional[torch.dtype] = None) -> Tensor:
    """torch.nn.functional.softmax (a dim other than the last is moved there and back)."""
    if dtype is not None:
        x = x.to(dtype)
    if x.dim() == 0:
        raise KfcError("softmax: x is a scalar; it needs at least one dim")
    dim = dim % x.dim()
    moved = x.movedim(dim, -1) if dim != x.dim() - 1 else x
    rows, _ = _rows(moved, (moved.shape[-1],), "softmax")
    y = (ops.softmax_rows if _eager(x) else ops.softmax_lastdim)(rows)
    y = y.view(moved.shape)
    return y.movedim(-1, dim) if dim != x.dim() - 1 else y

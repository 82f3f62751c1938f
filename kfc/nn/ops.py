"""The norms and softmax as torch custom ops over kfc's shipped kernels, with fakes and
gradients, so torch.compile(fullgraph=True) sees each as one opaque node and autograd runs
kfc's backward kernels.

    torch.ops.kfc.rms_norm(x, weight, eps) -> y
    torch.ops.kfc.rms_norm_residual(x, residual, weight, eps) -> (y, residual_out)
    torch.ops.kfc.layer_norm(x, weight, bias, eps) -> y
    torch.ops.kfc.softmax_lastdim(x) -> y

Every op takes rows: x is [M, N] (kfc.nn.functional flattens leading dims), in bf16, f16 or
f32; weights and biases are [N] in any float dtype (the kernels read fp32; another dtype is
converted first) or None. Each backward pass is a kfc kernel (kernels/*_bwd_dx.kfc,
softmax_bwd.kfc); the weight and bias gradients, sums over rows, are summed by those kernels too
(partials per CTA added by a second kernel in a fixed order, so repeats give the same bits).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor

from ..library import kernel


def ready(t: Tensor) -> Tensor:
    """Contiguous and 16-byte aligned, as kfc's kernels take tensors (a copy only when not)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


@functools.lru_cache(maxsize=64)
def _constant(value: float, n: int, device: torch.device) -> Tensor:
    return torch.full((n,), value, dtype=torch.float32, device=device)


def _f32(param: Optional[Tensor], n: int, device: torch.device, missing: float) -> Tensor:
    if param is None:
        return _constant(missing, n, device)
    return ready(param if param.dtype == torch.float32 else param.float())


# --- rms_norm ----------------------------------------------------------------------------------

def rms_norm_rows(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    """The kernel call under kfc::rms_norm (kfc.nn.functional calls it directly when no
    gradient is wanted and nothing is traced)."""
    return kernel("rmsnorm")(ready(x), _f32(weight, x.shape[-1], x.device, 1.0), eps)


@torch.library.custom_op("kfc::rms_norm", mutates_args=(), device_types="cuda")
def rms_norm(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    return rms_norm_rows(x, weight, eps)


@rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("kfc::rms_norm_backward", mutates_args=(), device_types="cuda")
def rms_norm_backward(x: Tensor, weight: Optional[Tensor], dy: Tensor, dres: Optional[Tensor],
                      eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, rstd, dw): the backward pass (plus dres, a fused residual's gradient); dw in f32,
    summed across the rows by the kernel (kernels/rmsnorm_bwd_dx.kfc)."""
    w = _f32(weight, x.shape[-1], x.device, 1.0)
    dres = None if dres is None else ready(dres.to(x.dtype))
    return kernel("rmsnorm_bwd_dx")(ready(x), w, ready(dy.to(x.dtype)), dres, eps)


@rms_norm_backward.register_fake
def _(x, weight, dy, dres, eps):
    return (torch.empty_like(x, memory_format=torch.contiguous_format), x.new_empty(x.shape[0], dtype=torch.float32),
            x.new_empty(x.shape[-1], dtype=torch.float32))


def _rms_weight_grad(dw: Tensor, weight: Optional[Tensor], wanted: bool) -> Optional[Tensor]:
    return dw.to(weight.dtype) if weight is not None and wanted else None


def _rms_setup(ctx, inputs, output):
    x, weight, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps


def _rms_backward(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, _, dw = rms_norm_backward(x, weight, dy, None, ctx.eps)
    return dx, _rms_weight_grad(dw, weight, ctx.needs_input_grad[1]), None


rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)


# --- rms_norm with a fused residual ------------------------------------------------------------

def rms_norm_residual_rows(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float) -> tuple[Tensor, Tensor]:
    """(y, residual_out): h = x + residual, residual_out = h, y = rms_norm(h) * weight."""
    return kernel("rmsnorm_residual")(ready(x), ready(residual.to(x.dtype)),
                                      _f32(weight, x.shape[-1], x.device, 1.0), eps)


@torch.library.custom_op("kfc::rms_norm_residual", mutates_args=(), device_types="cuda")
def rms_norm_residual(x: Tensor, residual: Tensor, weight: Optional[Tensor], eps: float) -> tuple[Tensor, Tensor]:
    return rms_norm_residual_rows(x, residual, weight, eps)


@rms_norm_residual.register_fake
def _(x, residual, weight, eps):
    return (torch.empty_like(x, memory_format=torch.contiguous_format),
            torch.empty_like(x, memory_format=torch.contiguous_format))


def _rms_residual_setup(ctx, inputs, output):
    _, residual, weight, eps = inputs
    ctx.save_for_backward(output[1], weight)
    ctx.eps = eps
    ctx.residual_dtype = residual.dtype


def _rms_residual_backward(ctx, dy, dres_out):
    h, weight = ctx.saved_tensors
    dh, _, dw = rms_norm_backward(h, weight, dy, dres_out, ctx.eps)
    return dh, dh.to(ctx.residual_dtype), _rms_weight_grad(dw, weight, ctx.needs_input_grad[2]), None


rms_norm_residual.register_autograd(_rms_residual_backward, setup_context=_rms_residual_setup)


# --- layer_norm --------------------------------------------------------------------------------

def layer_norm_rows(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    n = x.shape[-1]
    return kernel("layernorm")(ready(x), _f32(weight, n, x.device, 1.0), _f32(bias, n, x.device, 0.0), eps)


@torch.library.custom_op("kfc::layer_norm", mutates_args=(), device_types="cuda")
def layer_norm(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor], eps: float) -> Tensor:
    return layer_norm_rows(x, weight, bias, eps)


@layer_norm.register_fake
def _(x, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("kfc::layer_norm_backward", mutates_args=(), device_types="cuda")
def layer_norm_backward(x: Tensor, weight: Optional[Tensor], dy: Tensor,
                        eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, mean, rstd, dw, db): the backward pass; dw and db in f32, summed across the rows by
    the kernel (kernels/layernorm_bwd_dx.kfc)."""
    return kernel("layernorm_bwd_dx")(ready(x), _f32(weight, x.shape[-1], x.device, 1.0),
                                      ready(dy.to(x.dtype)), eps)


@layer_norm_backward.register_fake
def _(x, weight, dy, eps):
    rows = x.new_empty(x.shape[0], dtype=torch.float32)
    cols = x.new_empty(x.shape[-1], dtype=torch.float32)
    return torch.empty_like(x, memory_format=torch.contiguous_format), rows, rows.clone(), cols, cols.clone()


def _ln_setup(ctx, inputs, output):
    x, weight, bias, eps = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps
    ctx.bias_dtype = None if bias is None else bias.dtype


def _ln_backward(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, _, _, dw, db = layer_norm_backward(x, weight, dy, ctx.eps)
    dw = dw.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
    db = db.to(ctx.bias_dtype) if ctx.bias_dtype is not None and ctx.needs_input_grad[2] else None
    return dx, dw, db, None


layer_norm.register_autograd(_ln_backward, setup_context=_ln_setup)


# --- softmax -----------------------------------------------------------------------------------

def softmax_rows(x: Tensor) -> Tensor:
    return kernel("softmax")(ready(x))


@torch.library.custom_op("kfc::softmax_lastdim", mutates_args=(), device_types="cuda")
def softmax_lastdim(x: Tensor) -> Tensor:
    return softmax_rows(x)


@softmax_lastdim.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("kfc::softmax_backward", mutates_args=(), device_types="cuda")
def softmax_backward(y: Tensor, dy: Tensor) -> Tensor:
    return kernel("softmax_bwd")(ready(y), ready(dy.to(y.dtype)))


@softmax_backward.register_fake
def _(y, dy):
    return torch.empty_like(y, memory_format=torch.contiguous_format)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return softmax_backward(y, dy)


softmax_lastdim.register_autograd(_softmax_backward, setup_context=_softmax_setup)

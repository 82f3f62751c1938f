"""References for the norms' and softmax's backward kernels, in float64. The norms' go through
autograd of torch's own forward, so they share no formula with the kernels they check."""

from __future__ import annotations

import torch

__all__ = ["rmsnorm_bwd_dx", "rmsnorm_bwd", "layernorm_bwd_dx", "layernorm_bwd", "softmax_bwd"]


def _grads(forward, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, *more: torch.Tensor):
    """The gradients of forward(x, w, *more) at dy with respect to x, w and each of `more`."""
    with torch.enable_grad():
        leaves = [t.detach().double().requires_grad_(True) for t in (x, w, *more)]
        return torch.autograd.grad(forward(*leaves), leaves, dy.double())


def rmsnorm_bwd_dx(x, w, dy, dres, eps):
    """dx and dw of y = rmsnorm(x) * w (plus dres, the gradient arriving at a fused residual's
    output) and the rows' 1/rms."""
    dx, dw = _grads(lambda t, wd: torch.nn.functional.rms_norm(t, (t.shape[-1],), wd, eps), x, w, dy)
    if dres is not None:
        dx = dx + dres.double()
    rstd = torch.rsqrt(x.double().pow(2).mean(-1) + eps)
    return dx.to(x.dtype), rstd.float(), dw.float()


def rmsnorm_bwd(x, w, dout, rstd):
    """dx and dw of y = x · rstd · w given the forward's saved 1/rms (QuACK's interface). With
    rstd an input the gradient is its closed form, dx = rstd·(g − x̂·mean(g·x̂)) with x̂ = x·rstd
    and g = dout·w (autograd would differentiate the rstd recomputed from x, which a random
    rstd is not); dw = Σ_rows dout·x̂. The GPU tests also check it against autograd of torch's
    rms_norm with the rstd of the forward."""
    xd, dyd, rd = x.double(), dout.double(), rstd.double()[:, None]
    xh = xd * rd
    g = dyd * w.double()
    dx = rd * (g - xh * (g * xh).mean(-1, keepdim=True))
    dw = (dyd * xh).sum(0)
    return dx.to(x.dtype), dw.float()


def layernorm_bwd_dx(x, w, dy, eps):
    """dx, dw and db of y = layer_norm(x) * w + b, and the rows' mean and 1/std."""
    b = torch.zeros_like(w)
    dx, dw, db = _grads(lambda t, wd, bd: torch.nn.functional.layer_norm(t, (t.shape[-1],), wd, bd, eps), x, w, dy, b)
    xd = x.double()
    mean = xd.mean(-1)
    rstd = torch.rsqrt(xd.var(-1, unbiased=False) + eps)
    return dx.to(x.dtype), mean.float(), rstd.float(), dw.float(), db.float()


def layernorm_bwd(x, w, dout, mean, rstd):
    """dx, dw and db of y = (x − mean) · rstd · w + b given the forward's saved mean and 1/std,
    by torch's own native_layer_norm_backward in float64 (it takes the saved statistics as they
    are, as the kernel does, rather than recomputing them from x)."""
    xd = x.double()
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(
        dout.double(), xd, [x.shape[-1]], mean.double()[:, None], rstd.double()[:, None], w.double(),
        torch.zeros_like(w, dtype=torch.float64), [True, True, True])
    return dx.to(x.dtype), dw.float(), db.float()


def softmax_bwd(y, dy):
    """dx of y = softmax(x) along the last dim, from y and dy: the softmax's Jacobian
    diag(y) - y yᵀ applied to dy, in float64. (Through autograd at the logits log(y) it would
    renormalise y, which in bf16 sums to 1 only within rounding.)"""
    yd, dyd = y.double(), dy.double()
    return (yd * dyd - yd * (yd * dyd).sum(-1, keepdim=True)).to(y.dtype)

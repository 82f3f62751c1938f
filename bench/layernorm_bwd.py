"""layernorm backward (dx, dw and db from x, w, dout and the forward's mean and rstd): kfc
against torch's own backward kernel (aten native_layer_norm_backward, what F.layer_norm's
autograd runs) and torch.compile of the closed form, in one run on one GPU.

    python -m bench.layernorm_bwd [--shapes 32768x4096,...] [--tile OPTS] [--no-peers] [--out PATH]

bf16 x, dout and dx, fp32 w, mean, rstd, dw and db (torch's kernel takes w in x's dtype: it is
cast in the call, and its dw and db come out in bf16). Bandwidth counts x, dout and dx once
each, plus w, dw and db and the two row statistics. mean and rstd are x's own, so every
contender computes the same gradients. Timing as in bench.harness.
"""

from __future__ import annotations

import sys

from . import harness
from .backward import BackwardBench, main as run_bench
from .rmsnorm_bwd import SHAPES

EPS = 1e-5


def make_inputs(m: int, n: int, gen):
    import torch

    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, device="cuda", dtype=torch.float32, generator=gen)
    dout = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    xf = x.float()
    mean = xf.mean(-1)
    rstd = torch.rsqrt(xf.var(-1, unbiased=False) + EPS)
    return (x, w, dout, mean, rstd)


def reference(x, w, dout, mean, rstd):
    """The gradients in fp32, through autograd of torch's layer_norm (mean and rstd are x's own)."""
    import torch

    with torch.enable_grad():
        xf = x.float().requires_grad_(True)
        wf = w.clone().requires_grad_(True)
        bf = torch.zeros_like(w).requires_grad_(True)
        y = torch.nn.functional.layer_norm(xf, (x.shape[-1],), wf, bf, EPS)
        dx, dw, db = torch.autograd.grad(y, (xf, wf, bf), dout.float())
    return dx.to(x.dtype), dw, db


def bytes_per_call(args) -> int:
    x, w, dout, mean, rstd = args
    return 3 * x.numel() * x.element_size() + 3 * w.numel() * w.element_size() + 2 * mean.numel() * 4


def torch_contender():
    import torch

    def run(x, w, dout, mean, rstd):
        wt = w.to(x.dtype)
        return torch.ops.aten.native_layer_norm_backward(dout, x, [x.shape[-1]], mean[:, None], rstd[:, None], wt,
                                                         torch.zeros_like(wt), [True, True, True])
    return run


def torch_compile_contender():
    import torch

    def bwd(x, w, dout, mean, rstd):
        xh = (x.float() - mean[:, None]) * rstd[:, None]
        dy = dout.float()
        g = dy * w
        dx = rstd[:, None] * (g - g.mean(-1, keepdim=True) - xh * (g * xh).mean(-1, keepdim=True))
        return dx.to(x.dtype), (dy * xh).sum(0), dy.sum(0)
    return torch.compile(bwd, dynamic=False)


BENCH = BackwardBench(
    op="layernorm_bwd", shapes=SHAPES, make_inputs=make_inputs, reference=reference, bytes_per_call=bytes_per_call,
    peers=[harness.Contender("torch", torch_contender), harness.Contender("torch.compile", torch_compile_contender)],
    baseline="torch.compile", dtype="bf16 x, dout, dx; fp32 w, mean, rstd, dw, db",
    metric="TB/s = (x + dout + dx + w + dw + db + mean + rstd bytes) / time")


def main(argv=None) -> int:
    return run_bench(BENCH, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())

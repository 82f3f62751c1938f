"""rmsnorm backward (dx and dw from x, w, dout, rstd): kfc against QuACK's rmsnorm_bwd and
torch.compile, in one run on one GPU.

    python -m bench.rmsnorm_bwd [--shapes 32768x4096,...] [--tile OPTS] [--no-peers] [--out PATH]

bf16 x, dout and dx, fp32 w, rstd and dw. Bandwidth counts x, dout and dx once each, plus w and
dw. rstd comes from the forward (x's own 1/rms), so every contender computes the same gradient.
Timing as in bench.harness: eager do_bench (the headline) and CUDA-graph replays.
"""

from __future__ import annotations

import sys

from . import harness
from .backward import BackwardBench, main as run_bench

EPS = 1e-6
# the acceptance shapes: QuACK's long-row shapes, from 4096 to 262144 elements a row
SHAPES = [(32768, 4096), (32768, 16384), (32768, 65536), (16384, 131072), (8192, 262144)]


def make_inputs(m: int, n: int, gen):
    import torch

    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(n, device="cuda", dtype=torch.float32, generator=gen)
    dout = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + EPS)
    return (x, w, dout, rstd)


def reference(x, w, dout, rstd):
    """The gradient in fp32, through autograd of torch's rms_norm (rstd is x's own)."""
    import torch

    with torch.enable_grad():
        xf = x.float().requires_grad_(True)
        wf = w.clone().requires_grad_(True)
        y = torch.nn.functional.rms_norm(xf, (x.shape[-1],), wf, EPS)
        dx, dw = torch.autograd.grad(y, (xf, wf), dout.float())
    return dx.to(x.dtype), dw


def bytes_per_call(args) -> int:
    x, w, dout, rstd = args
    return 3 * x.numel() * x.element_size() + 2 * w.numel() * w.element_size() + rstd.numel() * 4


def quack_contender():
    from quack.rmsnorm import rmsnorm_bwd

    def run(x, w, dout, rstd):
        dx, dw, _, _ = rmsnorm_bwd(x, w, dout, rstd)
        return dx, dw
    return run


def torch_compile_contender():
    import torch

    def bwd(x, w, dout, rstd):
        xh = x.float() * rstd[:, None]
        g = dout.float() * w
        dx = rstd[:, None] * (g - xh * (g * xh).mean(-1, keepdim=True))
        return dx.to(x.dtype), (dout.float() * xh).sum(0)
    return torch.compile(bwd, dynamic=False)


BENCH = BackwardBench(
    op="rmsnorm_bwd", shapes=SHAPES, make_inputs=make_inputs, reference=reference, bytes_per_call=bytes_per_call,
    peers=[harness.Contender("quack", quack_contender), harness.Contender("torch.compile", torch_compile_contender)],
    baseline="quack", dtype="bf16 x, dout, dx; fp32 w, rstd, dw",
    metric="TB/s = (x + dout + dx + w + dw + rstd bytes) / time", peer_packages=["quack-kernels", "nvidia-cutlass-dsl"])


def main(argv=None) -> int:
    return run_bench(BENCH, argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())

"""Planted cheating candidates for the gate's tests: each breaks one rule and must be caught.

All compute RMSNorm over rows of x (any device) into the output tensor they are given."""

import torch


def rmsnorm(x, w, eps=1e-6):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w


def honest(x, w, out):
    out.copy_(rmsnorm(x, w).to(out.dtype))
    return out


def partial_writer(x, w, out):
    """Writes only the first half of the rows."""
    half = max(1, x.shape[0] // 2)
    out[:half].copy_(rmsnorm(x[:half], w).to(out.dtype))
    return out


class Cacher:
    """Computes once, then returns the first result for any input."""

    def __init__(self):
        self.cache = {}

    def __call__(self, x, w, out):
        key = tuple(x.shape)
        if key not in self.cache:
            self.cache[key] = rmsnorm(x, w).to(out.dtype)
        out.copy_(self.cache[key])
        return out


def shape_specialist(tuned_rows):
    """Right at the tuned number of rows; at any other it drops the last row's normalisation."""

    def fn(x, w, out):
        y = rmsnorm(x, w)
        if x.shape[0] != tuned_rows:
            y[-1] = x[-1].float() * w
        out.copy_(y.to(out.dtype))
        return out

    return fn


class UninitialisedReader:
    """Adds a scratch buffer it never initialises; each call leaves its own junk behind in the
    allocator's block, so the next call reads something else."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x, w, out):
        scratch = torch.empty(out.shape, dtype=torch.float32, device=out.device)
        y = rmsnorm(x, w) + scratch * 1e-30 + (scratch != scratch).float() * 0  # reads it
        self.calls += 1
        scratch.fill_(float(self.calls))  # junk for the next caller of this block
        out.copy_((rmsnorm(x, w) + scratch * 1e-7).to(out.dtype))
        del y
        return out


def input_modifier(x, w, out):
    out.copy_(rmsnorm(x, w).to(out.dtype))
    x.mul_(-1)  # scribbles on its input
    return out


def wrong_return(x, w, out):
    return rmsnorm(x, w).to(out.dtype)  # a new tensor, the given output untouched


def side_stream(x, w, out):
    """Launches its work on another stream and returns at once: a timer on the caller's
    stream sees nothing."""
    s = side_stream.stream = getattr(side_stream, "stream", None) or torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(20):  # enough work to be seen on a wall clock
            y = rmsnorm(x, w)
        out.copy_(y.to(out.dtype))
    return out


class LazyOnceWarm:
    """Honest for its first `honest_calls` calls (enough to pass every correctness check), then
    does nothing: the timed graph is captured empty, the outputs keep the right values from the
    warm-up calls, and the time is below what moving the bytes can take."""

    def __init__(self, honest_calls):
        self.honest_calls = honest_calls
        self.calls = 0

    def __call__(self, x, w, out):
        self.calls += 1
        if self.calls <= self.honest_calls:
            out.copy_(rmsnorm(x, w).to(out.dtype))
        return out

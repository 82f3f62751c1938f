"""Host time per eager call: kfc's rmsnorm against QuACK, F.rms_norm, Liger and a plain Triton
kernel, in one run on one GPU.

Each contender is checked against the fp32 reference first, warmed up, then called back to
back on a tiny tensor (1 x 256 bf16, so the GPU is never the bottleneck); the figure is the
wall-clock time of a burst of calls divided by its length, before the device sync that ends
it (bursts stay below the launch queue's depth, so a call never waits for the GPU). Median of
several bursts. Also times kfc's call by keyword (`k(x=x, w=w)`), mixed (`k(x, w=w, eps=...)`),
with `out=` given (no allocation), and through its ctypes launcher (what a machine without a C
compiler gets).

    python -m bench.launch_overhead [--calls 400] [--bursts 15] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EPS = 1e-6


def reference(x, w):
    xf = x.float()
    return (xf * (xf.pow(2).mean(-1, keepdim=True) + EPS).rsqrt() * w).to(x.dtype)


def kfc_rmsnorm():
    import kfc

    k = kfc.load(ROOT / "kernels" / "rmsnorm.kfc", kb=False)
    return lambda x, w: k(x, w)


def kfc_rmsnorm_by_keyword():
    import kfc

    k = kfc.load(ROOT / "kernels" / "rmsnorm.kfc", kb=False)
    return lambda x, w: k(x=x, w=w)


def kfc_rmsnorm_mixed():
    """Positional x, keyword w and eps: a defaulted scalar given by name."""
    import kfc

    k = kfc.load(ROOT / "kernels" / "rmsnorm.kfc", kb=False)
    return lambda x, w: k(x, w=w, eps=EPS)


def kfc_rmsnorm_ctypes():
    """kfc's launch through ctypes, where the compiled launcher cannot be built (kfc.runtime.fastcall)."""
    import kfc

    k = kfc.load(ROOT / "kernels" / "rmsnorm.kfc", kb=False)
    k._native = None
    return lambda x, w: k(x, w)


def kfc_rmsnorm_out():
    import torch

    import kfc

    k = kfc.load(ROOT / "kernels" / "rmsnorm.kfc", kb=False)
    buf = {}

    def run(x, w):
        y = buf.get(x.shape)
        if y is None:
            y = buf[x.shape] = torch.empty_like(x)
        return k(x, w, out=y)
    return run


def torch_rms_norm():
    import torch.nn.functional as F

    weights = {}  # the weight in the input's dtype, converted once (not on every call)

    def run(x, w):
        key = (w.data_ptr(), x.dtype)
        if key not in weights:
            weights[key] = w.to(x.dtype)
        return F.rms_norm(x, (x.shape[-1],), weights[key], EPS)
    return run


def quack():
    from quack.rmsnorm import rmsnorm_fwd

    return lambda x, w: rmsnorm_fwd(x, w, eps=EPS)[0]


def liger():
    from liger_kernel.ops.rms_norm import rms_norm_forward

    return lambda x, w: rms_norm_forward(x, w, EPS, 0.0, "gemma", None)[0]


def triton_rmsnorm():
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row * n + cols, (x * r * w).to(y_ptr.dtype.element_ty), mask=mask)

    def run(x, w):
        m, n = x.shape
        y = torch.empty_like(x)
        kernel[(m,)](x, w, y, n, EPS, BLOCK=triton.next_power_of_2(n))
        return y
    return run


CONTENDERS = {"kfc": kfc_rmsnorm, "kfc (keywords)": kfc_rmsnorm_by_keyword, "kfc (mixed)": kfc_rmsnorm_mixed,
              "kfc (out=)": kfc_rmsnorm_out, "kfc (ctypes)": kfc_rmsnorm_ctypes, "quack": quack, "F.rms_norm": torch_rms_norm,
              "liger": liger, "triton": triton_rmsnorm}


def host_us_per_call(fn, args, calls: int, bursts: int) -> tuple[float, list[float]]:
    import torch

    for _ in range(3 * calls):  # warm-up: compilation, caches, the fast path
        fn(*args)
    torch.cuda.synchronize()
    per_call = []
    for _ in range(bursts):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn(*args)
        per_call.append((time.perf_counter() - t0) * 1e6 / calls)
        torch.cuda.synchronize()
    return statistics.median(per_call), per_call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400, help="calls per burst (below the launch queue's depth)")
    ap.add_argument("--bursts", type=int, default=15)
    ap.add_argument("--shape", default="1x256", help="MxN of the tiny tensor")
    ap.add_argument("--out", help="also write the result JSON here")
    args = ap.parse_args(argv)
    import torch

    from bench import harness, provenance

    m, n = (int(v) for v in args.shape.split("x"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(n, device="cuda", generator=gen)
    ref = reference(x, w).float()
    rows = {}
    for name, make in CONTENDERS.items():
        fn = harness.safe(make)
        if isinstance(fn, str):
            rows[name] = {"ok": False, "note": fn}
            continue
        try:
            got = fn(x, w)
            torch.cuda.synchronize()
            problem = harness.wrong(got.float(), ref, 1e-2)
        except Exception as e:  # noqa: BLE001 - a contender that fails is reported, not timed
            rows[name] = {"ok": False, "note": f"{type(e).__name__}: {e}"[:200]}
            continue
        if problem:
            rows[name] = {"ok": False, "note": f"wrong: {problem}"}
            continue
        med, all_us = host_us_per_call(fn, (x, w), args.calls, args.bursts)
        rows[name] = {"ok": True, "host_us_per_call": med, "bursts_us": all_us}
    print(f"\nhost time per eager call, rmsnorm {m}x{n} bf16 ({args.bursts} bursts of {args.calls} calls, median)")
    for name, r in rows.items():
        shown = f"{r['host_us_per_call']:8.2f} us" if r["ok"] else f"   {r['note']}"
        print(f"  {name:14} {shown}")
    payload = {"shape": [m, n], "calls": args.calls, "bursts": args.bursts, "results": rows,
               "provenance": harness.provenance(["quack-kernels", "liger-kernel", "nvidia-cutlass-dsl"])}
    path = provenance.save("launch_overhead", payload, also=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

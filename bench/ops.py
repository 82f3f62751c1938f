"""Ops of many kinds as a framework author writes them, each against torch.compile of the same
eager formula, in one run on one GPU: elementwise with broadcasting, a gated activation, norms
and a norm's gradient, a residual norm with two outputs, softmax and its gradient, reductions, a
router, a loss, quantisation, a scan and an arg-reduction over it.

    python -m bench.ops [--ops rmsnorm,router,...] [--shapes 32768x4096,...] [--dtype bf16] [--out FILE]

kfc runs its default pipeline and is called by keyword (`k(x=x, w=w)`), as functions of many
inputs are called. Before timing, every contender's outputs are compared with the eager
formula's in f32 by kfc's tolerance rule; exact outputs (indices, fp8 and int8 codes) with the
formula run on the CPU, kfc's authority for exact outputs, element for element: at least 99.99%
must agree (99% for a first crossing of a running sum: two f32 running sums grazing the threshold
may cross it a step apart; torch.compile's fp8 codes, dividing through a reciprocal, differ in a
few hundredths of a percent, which is reported, not failed);
a wrong kfc result is not timed and the run exits non-zero. Bandwidth = bytes the op must move
/ time (each input read once, each output written once); `copy` is the device copying as many
bytes (read + write). Eager: triton.testing.do_bench median, L2 flushed before each call
(the headline); graph: do_bench_cudagraph median.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Callable

import attrs

from . import harness, quant
from .provenance import save

ROOT = Path(__file__).resolve().parent.parent
# short, medium and long rows: 2^26 elements, and 2^27 at the copy-bandwidth shape of #34
SHAPES = [(65536, 1024), (32768, 4096), (2048, 32768), (256, 262144)]


@attrs.frozen
class BenchOp:
    name: str
    path: str                            # the .kfc, from the repository root
    inputs: Callable[[int, int, Any], dict]  # (M, N, torch dtype) -> keyword inputs
    formula: Callable[..., Any]          # the eager torch formula over the same keywords
    exact: tuple[int, ...] = ()          # outputs compared element by element (indices, codes)
    max_n: int = 1 << 30                 # rows longer than this are not run (a router's experts)
    agree: float = 0.9999                # the share of an exact output's elements that must agree


def _ops() -> list[BenchOp]:
    import torch
    import torch.nn.functional as F

    def randn(m, n, dtype, scale=1.0):
        return (torch.randn(m, n, device="cuda") * scale).to(dtype)

    def vec(n, offset=0.0):
        return torch.randn(n, device="cuda") + offset

    def rms(x, w, eps=1e-6):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)

    def rms_residual(x, residual, w):
        h = x.float() + residual.float()
        return rms(h, w).to(x.dtype), h.to(x.dtype)

    def rms_bwd_dx(x, w, dy):
        xf, g = x.float(), dy.float() * w
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        xh = xf * r
        return ((r * (g - xh * (g * xh).mean(-1, keepdim=True))).to(x.dtype), r.squeeze(-1),
                (dy.float() * xh).sum(0))

    def softmax_bwd(y, dy):
        yf, g = y.float(), dy.float()
        return (yf * (g - (g * yf).sum(-1, keepdim=True))).to(y.dtype)

    def first_crossing(x, t):
        run = torch.cumsum(x, -1)
        n = x.shape[-1]
        at = torch.where(run > t, torch.arange(n, device=x.device, dtype=torch.float32), float(n)).amin(-1)
        return at.int(), x.sum(-1)

    def router(logits):
        p = torch.softmax(logits.float(), -1)
        return p.argmax(-1).int(), p.amax(-1)

    return [
        BenchOp("scale_shift", "examples/scale_shift.kfc",
                lambda m, n, d: {"x": randn(m, n, d), "scale": vec(n, 1.0), "shift": vec(n)},
                lambda x, scale, shift: (x.float() * scale + shift).to(x.dtype)),
        BenchOp("swiglu", "examples/swiglu.kfc", lambda m, n, d: {"a": randn(m, n, d), "b": randn(m, n, d)},
                lambda a, b: (F.silu(a.float()) * b.float()).to(a.dtype)),
        BenchOp("rmsnorm", "kernels/rmsnorm.kfc", lambda m, n, d: {"x": randn(m, n, d), "w": vec(n)}, rms),
        BenchOp("layernorm", "kernels/layernorm.kfc",
                lambda m, n, d: {"x": randn(m, n, d), "w": vec(n), "b": vec(n)},
                lambda x, w, b: F.layer_norm(x.float(), (x.shape[-1],), w, b, 1e-5).to(x.dtype)),
        BenchOp("rmsnorm_residual", "kernels/rmsnorm_residual.kfc",
                lambda m, n, d: {"x": randn(m, n, d), "residual": randn(m, n, d), "w": vec(n)}, rms_residual),
        BenchOp("rmsnorm_bwd_dx", "kernels/rmsnorm_bwd_dx.kfc",
                lambda m, n, d: {"x": randn(m, n, d), "w": vec(n), "dy": randn(m, n, d)}, rms_bwd_dx),
        BenchOp("softmax", "kernels/softmax.kfc", lambda m, n, d: {"x": randn(m, n, d, 3.0)},
                lambda x: torch.softmax(x.float(), -1).to(x.dtype)),
        BenchOp("softmax_bwd", "kernels/softmax_bwd.kfc",
                lambda m, n, d: {"y": torch.softmax(randn(m, n, torch.float32, 2.0), -1).to(d), "dy": randn(m, n, d)},
                softmax_bwd),
        BenchOp("row_stats", "examples/row_stats.kfc", lambda m, n, d: {"x": randn(m, n, d)},
                lambda x: (x.float().mean(-1), x.float().abs().amax(-1))),
        BenchOp("router", "examples/router.kfc", lambda m, n, d: {"logits": randn(m, n, d)}, router,
                exact=(0,), max_n=32768),  # experts are few: the longest rows are vocabularies
        BenchOp("cross_entropy", "examples/cross_entropy.kfc",
                lambda m, n, d: {"logits": randn(m, n, d),
                                 "target": torch.randint(0, n, (m,), device="cuda", dtype=torch.int32)},
                lambda logits, target: F.cross_entropy(logits.float(), target.long(), reduction="none")),
        BenchOp("fp8_quant", "examples/fp8_quant.kfc", lambda m, n, d: {"x": randn(m, n, d)},
                quant.formula("fp8_quant"), exact=(0,)),
        BenchOp("int8_quant", "examples/int8_quant.kfc", lambda m, n, d: {"x": randn(m, n, d)},
                quant.formula("int8_quant"), exact=(0,)),
        BenchOp("cumsum", "examples/cumsum.kfc", lambda m, n, d: {"x": randn(m, n, torch.float32)},
                lambda x: torch.cumsum(x, -1)),
        BenchOp("first_crossing", "examples/first_crossing.kfc",
                lambda m, n, d: {"x": randn(m, n, torch.float32) + 0.001, "t": float(n) ** 0.5}, first_crossing,
                exact=(0,), agree=0.99),  # a running sum grazing t may cross it a step apart
    ]


def select(names: list[str] | None) -> list[BenchOp]:
    """The ops named (all where None), in the benchmark's order; ValueError for a name it lacks."""
    ops = _ops()
    if names is None:
        return ops
    unknown = sorted(set(names) - {o.name for o in ops})
    if unknown:
        raise ValueError(f"unknown op(s) {', '.join(unknown)}; the ops are {', '.join(o.name for o in ops)}")
    return [o for o in ops if o.name in names]


@attrs.frozen
class Case:
    """One op at one shape: its keyword inputs (seeded by the shape), the eager formula's outputs,
    the formula's exact outputs on the CPU (kfc's authority for them), and the bytes it moves."""

    op: BenchOp
    m: int
    n: int
    inputs: dict
    want: Any
    want_exact: Any
    moved: int

    def wrong(self, got) -> str:
        """What differs between `got` and the formula ("" when they agree)."""
        return mismatch(self.op, got, self.want, self.want_exact)


def prepare(op: BenchOp, m: int, n: int, dtype) -> Case | None:
    """The case of `op` at M x N (None where the op does not run at rows that long)."""
    import torch

    if n > op.max_n:
        return None
    torch.manual_seed(m * 7919 + n)
    inputs = op.inputs(m, n, dtype)
    want = op.formula(**inputs)
    want_exact = op.formula(**{k: v.cpu() if hasattr(v, "cpu") else v for k, v in inputs.items()}) \
        if op.exact else want
    return Case(op, m, n, inputs, want, want_exact, nbytes(inputs.values()) + nbytes(as_tuple(want)))


def as_tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "numel"))


def mismatch(op: BenchOp, got, want, want_exact) -> str:
    """What differs between an output set and the formula's ("" when they agree); exact outputs
    against the formula run on the CPU (`want_exact`), kfc's authority for exact outputs."""
    problems = []
    for i, (g, w, we) in enumerate(zip(as_tuple(got), as_tuple(want), as_tuple(want_exact))):
        if tuple(g.shape) != tuple(w.shape):
            problems.append(f"output {i}: shape {tuple(g.shape)}, expected {tuple(w.shape)}")
        elif i in op.exact:
            g = g.cpu()
            same = (g.reshape(-1).view(torch_uint(g)) == we.reshape(-1).view(torch_uint(we))).float().mean()
            if float(same) < op.agree:
                problems.append(f"output {i}: {100 * (1 - float(same)):.3f}% of elements differ")
        else:
            tol = {1: 1e-1, 2: 1e-2}.get(g.element_size(), 1e-4)  # a 2^26-term sum rounds in f32 too
            p = harness.wrong(g, w, tol)
            if p:
                problems.append(f"output {i}: {p}")
    return "; ".join(problems)


def torch_uint(t):
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.ops", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", help="a comma-separated subset (default: all)")
    ap.add_argument("--shapes", help="MxN,... (default: " + ",".join(f"{m}x{n}" for m, n in SHAPES) + ")")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"), help="T of the typed ops")
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    args = ap.parse_args(argv)
    import torch

    import kfc

    try:
        ops = select(args.ops.split(",") if args.ops else None)
    except ValueError as e:
        ap.error(str(e))
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    rows, failures = [], []
    kernels = {op.name: kfc.load(ROOT / op.path, kb=False) for op in ops}
    harness.prebuild([(kernels[op.name].instance_named({"T": args.dtype}),
                       [{"M": m, "N": n} for m, n in shapes if n <= op.max_n]) for op in ops])
    for op in ops:
        kernel = kernels[op.name]
        compiled = torch.compile(op.formula)
        for m, n in shapes:
            case = prepare(op, m, n, dtype)
            if case is None:
                continue
            inputs, moved = case.inputs, case.moved
            src = torch.empty(moved // 4, device="cuda", dtype=torch.float32)
            dst = torch.empty_like(src)
            fns = {"kfc": lambda: kernel(**inputs), "torch_compile": lambda: compiled(**inputs),
                   "copy": lambda: dst.copy_(src)}
            row: dict = {"op": op.name, "M": m, "N": n, "bytes": moved}
            for who, fn in fns.items():
                r: dict = {}
                try:
                    if who != "copy":
                        problem = case.wrong(fn())
                        if problem:
                            r["mismatch"] = problem
                            if who == "kfc":
                                raise AssertionError(f"wrong: {problem}")
                    r.update(harness.eager_and_graph(fn, moved if who != "copy" else 2 * nbytes([src])))
                    r["ok"] = True
                except Exception as e:  # noqa: BLE001 - reported, and the run exits non-zero
                    r.update(harness.failed(e))
                    failures.append(f"{op.name} {who} {m}x{n}: {r['error']}")
                row[who] = r
            for mode in ("eager", "graph"):
                if row["kfc"].get("ok") and row["torch_compile"].get("ok"):
                    row[f"{mode}_speedup"] = row["torch_compile"][f"{mode}_us"] / row["kfc"][f"{mode}_us"]
                if row["kfc"].get("ok") and row["copy"].get("ok"):
                    row[f"{mode}_of_copy"] = row["kfc"][f"{mode}_gbs"] / row["copy"][f"{mode}_gbs"]
            print(f"{op.name} {m}x{n}: " + ", ".join(
                f"{w} {row[w]['eager_us']:.1f} µs" if row[w].get("ok") else f"{w} failed" for w in fns),
                file=sys.stderr, flush=True)
            rows.append(row)
            del case, inputs, src, dst
            torch.cuda.empty_cache()
        torch._dynamo.reset()  # each op's compiled graphs go with it
    prov = harness.provenance([])
    speedups = {mode: harness.geomean([r[f"{mode}_speedup"] for r in rows if f"{mode}_speedup" in r])
                for mode in ("eager", "graph")}
    payload = {"ops": [o.name for o in ops], "dtype": args.dtype, "call": "kfc by keyword, default pipeline",
               "metric": "speedup = torch.compile time / kfc time; of_copy = kfc GB/s / copy GB/s",
               "timing": "eager: triton.testing.do_bench median, L2 flushed; graph: do_bench_cudagraph median",
               "geomean_speedup": speedups, "env": prov, "shapes": rows, "failures": failures}
    path = save("ops", payload, also=args.out)
    print(f"saved {path}")
    print(f"\nops ({args.dtype}) on {prov.get('gpu', '?')}, kfc by keyword: eager µs kfc / torch.compile, x = speedup, "
          f"copy = kfc's share of copy bandwidth; then CUDA graphs")
    print(f"{'op':>16} {'M x N':>14} {'kfc':>8} {'compile':>8} {'x':>6} {'copy':>5}   {'kfc':>8} {'compile':>8} {'x':>6}")
    for row in rows:
        def us(who, mode):
            return f"{row[who][f'{mode}_us']:8.1f}" if row[who].get("ok") else f"{'fail':>8}"

        def q(key, w=6, f=".2f"):
            return f"{row[key]:{w}{f}}" if key in row and math.isfinite(row[key]) else f"{'-':>{w}}"
        print(f"{row['op']:>16} {row['M']:>6}x{row['N']:<7} {us('kfc', 'eager')} {us('torch_compile', 'eager')} "
              f"{q('eager_speedup')} {q('eager_of_copy', 5)}   {us('kfc', 'graph')} {us('torch_compile', 'graph')} "
              f"{q('graph_speedup')}")
    print(f"geometric mean speedup over torch.compile: eager {speedups['eager']:.3f}, graph {speedups['graph']:.3f}")
    for f in failures:
        print(f"FAILED {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

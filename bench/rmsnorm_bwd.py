"""rmsnorm backward (dx and dw from x, w, dout, rstd): kfc against QuACK's rmsnorm_bwd and
torch.compile, in one run on one GPU.

    python -m bench.rmsnorm_bwd [--shapes 32768x4096,...] [--out PATH]

bf16 x, dout and dx, fp32 w, rstd and dw. Bandwidth counts x, dout and dx once each, plus w and
dw. rstd comes from the forward (x's own 1/rms), so every contender computes the same gradient.
Timing as in bench.harness: eager do_bench (the headline) and CUDA-graph replays.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs

from . import harness
from .provenance import save
from .rows import TILE_PIPELINE
from .shapes import parse_shapes

ROOT = Path(__file__).resolve().parent.parent
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


def kfc_contender(pipeline: str | None = None):
    def make():
        import kfc

        k = kfc.load(ROOT / "kernels" / "rmsnorm_bwd.kfc", pipeline=pipeline)
        return lambda x, w, dout, rstd: k(x, w, dout, rstd)
    return make


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


CONTENDERS = [harness.Contender("kfc", kfc_contender()), harness.Contender("quack", quack_contender),
              harness.Contender("torch.compile", torch_compile_contender)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.rmsnorm_bwd", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="MxN,... (default: the five acceptance shapes)")
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    ap.add_argument("--note", default="", help="a note stored with the result (e.g. the source tree)")
    ap.add_argument("--tile", action="append", default=[], metavar="OPTS",
                    help="also time kfc with tile{OPTS} in its default pipeline, e.g. cluster=8,threads=256 "
                         "(repeatable; reported beside the default, not as the headline)")
    ap.add_argument("--no-peers", action="store_true", help="time kfc and nothing else")
    args = ap.parse_args(argv)
    import torch

    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    gen = torch.Generator(device="cuda")
    contenders = (CONTENDERS[:1] if args.no_peers else CONTENDERS) + \
        [harness.Contender(f"kfc[{t}]", kfc_contender(TILE_PIPELINE % t)) for t in args.tile]
    fns = {c.name: harness.safe(c.make) for c in contenders}
    rows: dict = {}
    for m, n in shapes:
        gen.manual_seed(n)
        first = make_inputs(m, n, gen)
        per_call = bytes_per_call(first)
        sets = [first] + [make_inputs(m, n, gen) for _ in range(harness.rotation(per_call) - 1)]
        rows[(m, n)] = {}
        for c in contenders:
            fn = fns[c.name]
            rows[(m, n)][c.name] = harness.measure(c, fn, sets, reference, 1e-2, per_call) if callable(fn) else \
                harness.Measurement(c.name, False, error=fn)
            print(f"rmsnorm_bwd {m}x{n} {c.name}: {rows[(m, n)][c.name]}", file=sys.stderr, flush=True)
        del sets, first
        torch.cuda.empty_cache()
    per_shape, eager, graph = [], [], []
    for shape in shapes:
        r = rows[shape]
        entry = {"M": shape[0], "N": shape[1], **{k: attrs.asdict(v) for k, v in r.items()}}
        if r["kfc"].ok and "quack" in r and r["quack"].ok:
            entry["eager_ratio_vs_quack"] = r["kfc"].eager_tbps / r["quack"].eager_tbps
            entry["graph_ratio_vs_quack"] = r["kfc"].tbps / r["quack"].tbps
            eager.append(entry["eager_ratio_vs_quack"])
            graph.append(entry["graph_ratio_vs_quack"])
        per_shape.append(entry)
    prov = harness.provenance(["quack-kernels", "nvidia-cutlass-dsl"])
    payload = {"op": "rmsnorm_bwd", "dtype": "bf16 x, dout, dx; fp32 w, rstd, dw",
               "metric": "TB/s = (x + dout + dx + w + dw + rstd bytes) / time",
               "timing": "eager: triton.testing.do_bench median, L2 flushed before each call (the headline); "
                         "graph: CUDA graph of rotating input sets beyond L2, median of 10 replays",
               "env": prov, "note": args.note, "shapes": per_shape,
               "geomean_eager_ratio_vs_quack": harness.geomean(eager) if eager else None,
               "geomean_graph_ratio_vs_quack": harness.geomean(graph) if graph else None}
    path = save("rmsnorm_bwd", payload, also=args.out)
    names = [c.name for c in contenders]
    harness.print_table(f"rmsnorm_bwd: TB/s on {prov.get('gpu', '?')}", shapes, names, rows)
    print("\nkfc / quack, eager (graph): " + ", ".join(
        f"{s['M']}x{s['N']}:{s['eager_ratio_vs_quack']:.3f} ({s['graph_ratio_vs_quack']:.3f})"
        for s in per_shape if "eager_ratio_vs_quack" in s))
    if eager:
        print(f"geomean kfc / quack: eager {harness.geomean(eager):.3f}, graph {harness.geomean(graph):.3f}")
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""kfc's column sum (kernels/colsum.kfc, a whole-tensor program) against the GPU's copy
bandwidth and torch's column sum, in one run on one GPU.

    python -m bench.colsum [--shapes 32768x16384,...] [--dtype bf16] [--pipeline P] [--out FILE]

y = sum(f32(x), axis=0) for x [M, N]. The copy is torch's device-to-device copy of x into
a tensor of its size (it reads and writes M N elements). Bandwidth = bytes moved / time: the
copy moves 2 M N elements; the column sums read M N and write N f32 (their partials add
kfc_groups x N f32 twice, not counted). Outputs are checked against float64 first; a wrong one
is not timed and the run exits non-zero. Eager timing: triton.testing.do_bench median, L2
flushed before each call; graph: do_bench_cudagraph median.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import harness
from .provenance import save

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(32768, 16384), (8192, 8192), (4096, 65536)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.colsum", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="MxN,... (default: " + ",".join(f"{m}x{n}" for m, n in SHAPES) + ")")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"))
    ap.add_argument("--pipeline", help="kfc pass pipeline (passed to kfc.load; default: kfc's own)")
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    args = ap.parse_args(argv)
    import torch

    import kfc

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    k = kfc.load(ROOT / "kernels" / "colsum.kfc", pipeline=args.pipeline, kb=False)
    rows, failures = [], []
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda").to(dtype)
        dst = torch.empty_like(x)
        ref = x.double().sum(0)
        item = x.element_size()
        fns = {"kfc": (lambda: k(x), m * n * item + 4 * n),
               "torch_sum": (lambda: x.sum(0, dtype=torch.float32), m * n * item + 4 * n),
               "copy": (lambda: dst.copy_(x), 2 * m * n * item)}
        row: dict = {"M": m, "N": n}
        for name, (fn, nbytes) in fns.items():
            r: dict = {}
            try:
                if name != "copy":
                    out = fn()
                    out = out[0] if isinstance(out, tuple) else out
                    err = float((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
                    r["max_err_rel"] = err
                    if not err < 1e-4:
                        raise AssertionError(f"wrong: max |err| / max |ref| = {err:.3g}")
                r.update(harness.eager_and_graph(fn, nbytes))
                r["ok"] = True
            except Exception as e:  # noqa: BLE001 - reported, and the run exits non-zero
                r.update(harness.failed(e))
                failures.append(f"{name} {m}x{n}: {r['error']}")
            row[name] = r
            print(f"colsum {m}x{n} {name}: {r}", file=sys.stderr, flush=True)
        for peer in ("copy", "torch_sum"):
            if row["kfc"].get("ok") and row[peer].get("ok"):
                for mode in ("eager", "graph"):
                    row[f"{mode}_ratio_kfc_over_{peer}"] = row["kfc"][f"{mode}_gbs"] / row[peer][f"{mode}_gbs"]
        rows.append(row)
        del x, dst
        torch.cuda.empty_cache()
    prov = harness.provenance([])
    payload = {"op": "colsum", "pipeline": args.pipeline, "dtype": f"{args.dtype} x, f32 sums", "metric": "GB/s = bytes moved / time",
               "timing": "eager: triton.testing.do_bench median, L2 flushed; graph: do_bench_cudagraph median",
               "env": prov, "shapes": rows, "failures": failures}
    path = save("colsum", payload, also=args.out)
    print(f"saved {path}")
    print(f"\ncolsum ({args.dtype}) on {prov.get('gpu', '?')}: GB/s eager | graph; ratio = kfc / peer")
    print(f"{'M x N':>14} {'kfc':>7} {'copy':>7} {'torch':>7} {'/copy':>6} {'/torch':>6}   {'kfc':>7} {'copy':>7} "
          f"{'/copy':>6}")
    for row in rows:
        def g(name, mode):
            return f"{row[name][f'{mode}_gbs']:7.0f}" if row[name].get("ok") else f"{'fail':>7}"

        def q(key):
            return f"{row[key]:6.3f}" if key in row else f"{'-':>6}"
        print(f"{row['M']:>7}x{row['N']:<6} {g('kfc', 'eager')} {g('copy', 'eager')} {g('torch_sum', 'eager')} "
              f"{q('eager_ratio_kfc_over_copy')} {q('eager_ratio_kfc_over_torch_sum')}   {g('kfc', 'graph')} "
              f"{g('copy', 'graph')} {q('graph_ratio_kfc_over_copy')}")
    for f in failures:
        print(f"FAILED {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""kfc's running sum along rows (examples/cumsum.kfc) against torch.cumsum and torch.compile of
it, in one run on one GPU, from rows a CTA scans whole to rows read in chunks (chunk-rows).

    python -m bench.scans [--shapes 2048x32768,...] [--chunks 2048,4096,8192,16384] [--out FILE]

Every kfc contender's output is first compared with torch's (f64 running sums: the error
relative to the running sum of magnitudes at most 1e-5); a wrong one is not timed and the run
exits non-zero. Contenders: kfc's default pipeline; chunk-rows at each of --chunks; at rows the
default scans whole, chunk-rows forced on (min_row=0), which says where chunks start to pay.
Bandwidth = bytes moved / time (x read once, y written once). Eager: triton.testing.do_bench
median, L2 flushed before each call; graph: do_bench_cudagraph median.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import harness
from .provenance import save

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(16384, 4096), (4096, 16384), (2048, 32768), (512, 131072), (256, 262144), (255, 262147)]
CHUNKS = (2048, 4096, 8192, 16384)


def pipelines(chunks) -> dict[str, str | None]:
    from kfc.passes import ROW_PIPELINE

    out: dict[str, str | None] = {"kfc": None}
    for c in chunks:
        out[f"kfc_chunk{c}"] = ROW_PIPELINE.replace("chunk-rows", f"chunk-rows{{chunk={c},min_row=0}}")
    return out


def error(y, x) -> float:
    import torch

    want = torch.cumsum(x.double(), -1)
    scale = torch.cumsum(x.double().abs(), -1)
    return float(((y.double() - want).abs() / (scale + 1e-30)).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scans", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="MxN,... (default: " + ",".join(f"{m}x{n}" for m, n in SHAPES) + ")")
    ap.add_argument("--chunks", default=",".join(map(str, CHUNKS)), help="chunk sizes to time chunk-rows at")
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    args = ap.parse_args(argv)
    import torch

    import kfc

    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    chunks = [int(c) for c in args.chunks.split(",") if c]
    kernels = {who: kfc.load(ROOT / "examples" / "cumsum.kfc", pipeline=p, kb=False)
               for who, p in pipelines(chunks).items()}
    compiled = torch.compile(lambda x: torch.cumsum(x, -1))
    rows, failures = [], []
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda")
        nbytes = 2 * m * n * 4
        fns = {who: (lambda k=k: k(x)) for who, k in kernels.items()
               if who == "kfc" or n > int(who.removeprefix("kfc_chunk"))}  # chunk-rows applies past one chunk
        fns |= {"torch": lambda: torch.cumsum(x, -1), "torch_compile": lambda: compiled(x)}
        row: dict = {"M": m, "N": n}
        for who, fn in fns.items():
            r: dict = {}
            try:
                r["error"] = error(fn(), x)
                if r["error"] > 1e-5:
                    raise AssertionError(f"wrong: error {r['error']:.2e} relative to the running sum of magnitudes")
                r.update(harness.eager_and_graph(fn, nbytes))
                r["ok"] = True
            except Exception as e:  # noqa: BLE001 - reported, and the run exits non-zero
                r.update(harness.failed(e))
                failures.append(f"{who} {m}x{n}: {r['error']}")
            row[who] = r
            print(f"{m}x{n} {who}: {r}", file=sys.stderr, flush=True)
        for mode in ("eager", "graph"):
            for peer in ("torch", "torch_compile"):
                if row["kfc"].get("ok") and row[peer].get("ok"):
                    row[f"{mode}_speedup_over_{peer}"] = row[peer][f"{mode}_us"] / row["kfc"][f"{mode}_us"]
        rows.append(row)
        del x
        torch.cuda.empty_cache()
    prov = harness.provenance([])
    payload = {"op": "examples/cumsum.kfc (f32)", "pipelines": pipelines(chunks),
               "metric": "GB/s = bytes moved / time; speedup = peer time / kfc (default pipeline) time",
               "timing": "eager: triton.testing.do_bench median, L2 flushed; graph: do_bench_cudagraph median",
               "env": prov, "shapes": rows, "failures": failures}
    path = save("scans", payload, also=args.out)
    print(f"saved {path}")
    names = [w for w in ("kfc", *(f"kfc_chunk{c}" for c in chunks), "torch", "torch_compile")]
    print(f"\nrow cumsum (f32) on {prov.get('gpu', '?')}: eager µs (graph µs); x = torch time / kfc time")
    print(f"{'M x N':>14} " + " ".join(f"{w:>17}" for w in names) + f" {'x torch':>8} {'x compile':>9}")
    for row in rows:
        def us(who):
            r = row.get(who)
            if r is None:
                return f"{'-':>17}"
            return f"{r['eager_us']:8.1f} ({r['graph_us']:6.1f})" if r.get("ok") else f"{'fail':>17}"

        def q(key, w):
            return f"{row[key]:{w}.2f}" if key in row else f"{'-':>{w}}"
        print(f"{row['M']:>6}x{row['N']:<7} " + " ".join(us(w) for w in names) +
              f" {q('eager_speedup_over_torch', 8)} {q('eager_speedup_over_torch_compile', 9)}")
    for f in failures:
        print(f"FAILED {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""kfc's per-row fp8 and int8 quantisation (examples/fp8_quant.kfc, examples/int8_quant.kfc)
against torch.compile of the same eager formula and the GPU's copy bandwidth, in one run on one
GPU.

    python -m bench.quant [--shapes 16384x4096,...] [--dtype bf16] [--out FILE]

Before timing, kfc's codes and scales are compared byte for byte with torch's CPU result (kfc's
authority for exact outputs); a kfc result that differs is not timed and the run exits
non-zero. torch.compile's are compared too and reported (its scale divides by a Python number
through a reciprocal on the GPU, so a few of its codes may differ; that is not a failure).
kfc is called positionally, its fast path (a keyword call still takes the slow one: the issue
"Fast however it is called"). Bandwidth = bytes moved / time: x read once, the codes and scales written once. Eager timing:
triton.testing.do_bench median, L2 flushed before each call; graph: do_bench_cudagraph median.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import harness
from .provenance import save

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(16384, 4096), (32768, 4096), (8192, 8192), (4096, 16384), (2048, 65536)]
OPS = {"fp8_quant": 448.0, "int8_quant": 127.0}


def formula(name: str):
    import torch

    top = OPS[name]

    def fp8(x):
        s = x.float().abs().amax(-1).clamp(min=1e-12) / top
        return (x.float() / s[:, None]).to(torch.float8_e4m3fn), s

    def int8(x):
        s = x.float().abs().amax(-1).clamp(min=1e-12) / top
        return (x.float() / s[:, None]).round().clamp(-127, 127).to(torch.int8), s

    return fp8 if name == "fp8_quant" else int8


def differing(got, want) -> int:
    """Codes and scales that differ from torch's CPU result, bit for bit."""
    import torch

    q, s = got
    wq, ws = want
    return int((q.cpu().view(torch.uint8) != wq.view(torch.uint8)).sum()) + \
        int((s.cpu().view(torch.int32) != ws.view(torch.int32)).sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.quant", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="MxN,... (default: " + ",".join(f"{m}x{n}" for m, n in SHAPES) + ")")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"))
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    args = ap.parse_args(argv)
    import torch

    import kfc

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES
    rows, failures = [], []
    for name in OPS:
        k = kfc.load(ROOT / "examples" / f"{name}.kfc", kb=False)
        compiled = torch.compile(formula(name))
        for m, n in shapes:
            x = torch.randn(m, n, device="cuda").to(dtype)
            dst = torch.empty_like(x)
            want = formula(name)(x.cpu())
            nbytes = m * n * (x.element_size() + 1) + 4 * m
            fns = {"kfc": lambda: k(x), "torch_compile": lambda: compiled(x),
                   "copy": lambda: dst.copy_(x)}
            row: dict = {"op": name, "M": m, "N": n}
            for who, fn in fns.items():
                r: dict = {}
                try:
                    if who != "copy":
                        r["differing_from_torch_cpu"] = differing(fn(), want)
                        if who == "kfc" and r["differing_from_torch_cpu"]:
                            raise AssertionError(f"wrong: {r['differing_from_torch_cpu']} codes or scales differ "
                                                 "from torch's CPU result")
                    r.update(harness.eager_and_graph(fn, 2 * m * n * x.element_size() if who == "copy" else nbytes))
                    r["ok"] = True
                except Exception as e:  # noqa: BLE001 - reported, and the run exits non-zero
                    r.update(harness.failed(e))
                    failures.append(f"{name} {who} {m}x{n}: {r['error']}")
                row[who] = r
                print(f"{name} {m}x{n} {who}: {r}", file=sys.stderr, flush=True)
            for mode in ("eager", "graph"):
                if row["kfc"].get("ok") and row["torch_compile"].get("ok"):
                    row[f"{mode}_speedup_over_torch_compile"] = row["torch_compile"][f"{mode}_us"] / row["kfc"][f"{mode}_us"]
                if row["kfc"].get("ok") and row["copy"].get("ok"):
                    row[f"{mode}_fraction_of_copy_bandwidth"] = row["kfc"][f"{mode}_gbs"] / row["copy"][f"{mode}_gbs"]
            rows.append(row)
            del x, dst
            torch.cuda.empty_cache()
    prov = harness.provenance([])
    payload = {"ops": list(OPS), "dtype": f"{args.dtype} x; e4m3 or i8 codes, f32 scales",
               "metric": "GB/s = bytes moved / time; speedup = torch.compile time / kfc time",
               "timing": "eager: triton.testing.do_bench median, L2 flushed; graph: do_bench_cudagraph median",
               "env": prov, "shapes": rows, "failures": failures}
    path = save("quant", payload, also=args.out)
    print(f"saved {path}")
    print(f"\nper-row quantisation ({args.dtype}) on {prov.get('gpu', '?')}: eager | graph µs; "
          "x = torch.compile time / kfc time; copy = kfc GB/s / copy GB/s; diff = torch.compile codes unlike torch CPU")
    print(f"{'op':>10} {'M x N':>13} {'kfc':>8} {'compile':>8} {'x':>6} {'copy':>5} {'diff':>6}   {'kfc':>8} "
          f"{'compile':>8} {'x':>6}")
    for row in rows:
        def us(who, mode):
            return f"{row[who][f'{mode}_us']:8.1f}" if row[who].get("ok") else f"{'fail':>8}"

        def q(key, w=6, f=".3f"):
            return f"{row[key]:{w}{f}}" if key in row else f"{'-':>{w}}"
        print(f"{row['op']:>10} {row['M']:>6}x{row['N']:<6} {us('kfc', 'eager')} {us('torch_compile', 'eager')} "
              f"{q('eager_speedup_over_torch_compile')} {q('eager_fraction_of_copy_bandwidth', 5, '.2f')} "
              f"{row['torch_compile'].get('differing_from_torch_cpu', '-'):>6}   {us('kfc', 'graph')} "
              f"{us('torch_compile', 'graph')} {q('graph_speedup_over_torch_compile')}")
    for f in failures:
        print(f"FAILED {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

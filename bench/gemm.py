"""kfc's GEMM (kernels/gemm.kfc: TMA + wgmma) against cuBLAS (torch.matmul), in one run on one GPU.

    python -m bench.gemm [--shapes 4096x4096x4096,...] [--pipeline P [--pipeline P2 ...]]
                         [--epilogue bias-gelu] [--kb KB] [--out FILE]

bf16 a [M, K], b [K, N] from a normal distribution, bf16 c, fp32 accumulation. Each shape
compiles its own kfc kernel (every dim is fixed per compile); all of them are built first, at
once, so the GPU does not idle through each nvcc run of the timed loop. Both contenders' outputs are
checked against a.float() @ b.float() first (max |err| / max |ref| < 1e-2; a wrong contender is
not timed and the run exits non-zero); then timed eagerly (triton.testing.do_bench, median, L2
flushed before each call) and by CUDA graph replay (triton.testing.do_bench_cudagraph, median).
TFLOP/s = 2 M N K / time. Each --pipeline is a kfc contender of its own ("kfc" alone for the
default pipeline, else "kfc[PIPELINE]"), all timed in the same run as cuBLAS. With --epilogue,
kfc runs kernels/gemm_<epilogue>.kfc (bias along the columns, the epilogue fused), checked
against its own reference, and the ratio is to cuBLAS's GEMM alone; torch's GEMM followed by the
epilogue is timed beside them. With --kb, kfc[tuned] is kfc with the pipeline `kfc tune` found
fastest at each shape (the knowledge base's best; the default where it records none), its
pipeline kept in the JSON.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from . import harness
from .provenance import save

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 1024, 8192), (16, 8192, 8192)]  # (M, N, K)
TOL = 1e-2


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'4096x4096x4096,16x8192x8192' -> [(4096, 4096, 4096), (16, 8192, 8192)] (M x N x K)."""
    out = []
    for s in text.split(","):
        m, n, k = (int(v) for v in s.strip().split("x"))
        out.append((m, n, k))
    return out


def error(out, ref) -> float:
    """max |out - ref| / max |ref|; inf where out has a non-finite value."""
    o = out.float()
    if not bool(o.isfinite().all()):
        return math.inf
    return float((o - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


TUNED = "tuned"  # the --kb contender: per shape, the fastest pipeline the knowledge base records


def kfc_name(pipeline: str | None) -> str:
    return "kfc" if pipeline is None else f"kfc[{pipeline}]"


def tuned_pipelines(kb_path: str, kernel, shapes, target: str = "sm_90a") -> dict:
    """(M, N, K) -> the fastest timed pipeline the knowledge base at kb_path records for the
    kernel on target at that shape (what `kfc tune` found), or None where it records none."""
    from kfc.frontend import load_kfc
    from kfc.kb.fingerprint import op_fingerprint
    from kfc.kb.store import KnowledgeBase

    spec = load_kfc(kernel)
    kb = KnowledgeBase(kb_path)
    try:
        best = {(m, n, k): kb.best_by_fingerprint(op_fingerprint(spec.func), target, {"M": m, "N": n, "K": k})
                for m, n, k in shapes}
    finally:
        kb.close()
    return {shape: t.proposal.pipeline if t is not None else None for shape, t in best.items()}


def kernel_path(epilogue: str | None):
    return ROOT / "kernels" / ("gemm.kfc" if epilogue is None else f"gemm_{epilogue.replace('-', '_')}.kfc")


def kfc_fn(pipeline: str | None, epilogue: str | None):
    """kfc's kernel (with the epilogue fused) as fn(a, b, bias)."""
    import kfc

    k = kfc.load(kernel_path(epilogue), pipeline=pipeline, kb=False)

    def fn(a, b, bias):
        return k(a, b) if epilogue is None else k(a, b, bias)
    fn.kernel = k  # for prebuild
    return fn



def contenders(pipelines: list[str | None], epilogue: str | None = None) -> dict:
    """name -> (fn(a, b, bias), what it computes: "gemm" or the epilogue's name). With an
    epilogue, kfc runs the .kfc with it fused; cuBLAS runs the GEMM alone (the bar the fused
    kernel is held to) and torch the GEMM and the epilogue as two kernels."""
    import torch

    fns = {}
    for p in pipelines:
        fns[kfc_name(p)] = (kfc_fn(p, epilogue), epilogue or "gemm")
    fns["cublas"] = (lambda a, b, bias: torch.matmul(a, b), "gemm")
    if epilogue is not None:
        fns["torch"] = (lambda a, b, bias: EPILOGUES[epilogue](torch.matmul(a, b).float() + bias).to(a.dtype),
                        epilogue)
    return fns


def _gelu_tanh(x):
    import torch

    return torch.nn.functional.gelu(x, approximate="tanh")


EPILOGUES = {"bias-gelu": _gelu_tanh}


def run(shapes, pipelines: list[str | None], seed: int = 0, epilogue: str | None = None,
        tuned: dict | None = None) -> tuple[list[dict], list[str]]:
    """Every contender at every shape; with `tuned` ((M, N, K) -> pipeline or None), also kfc
    with the pipeline tuned for each shape ("kfc[tuned]"; the default where none is recorded)."""
    import torch
    from triton.testing import do_bench_cudagraph

    torch.backends.cuda.matmul.allow_tf32 = False  # an fp32 reference, not a tf32 one
    every = contenders(pipelines, epilogue)
    at = {(m, n, k): {"M": m, "N": n, "K": k} for m, n, k in shapes}
    tuned_fns = {s: kfc_fn(tuned[s], epilogue) for s in shapes} if tuned is not None else {}
    harness.prebuild([(fn.kernel, list(at.values())) for fn, _ in every.values() if hasattr(fn, "kernel")]
                     + [(fn.kernel, [at[s]]) for s, fn in tuned_fns.items()])
    gen = torch.Generator(device="cuda")
    rows, failures = [], []
    for m, n, k in shapes:
        fns = dict(every)
        if tuned is not None:
            fns = {kfc_name(TUNED): (tuned_fns[m, n, k], epilogue or "gemm"), **every}
        gen.manual_seed(seed + m * 31 + n * 7 + k)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        bias = torch.randn(n, device="cuda", dtype=torch.float32, generator=gen)
        product = a.float() @ b.float()
        refs = {"gemm": product, **({epilogue: EPILOGUES[epilogue](product + bias)} if epilogue else {})}
        flops = 2 * m * n * k
        row = {"M": m, "N": n, "K": k}
        for name, (fn, computes) in fns.items():
            r: dict = {"computes": computes}
            if name == kfc_name(TUNED):
                r["pipeline"] = tuned[m, n, k] or "default (the knowledge base records none at this shape)"
            try:
                r["max_err_rel"] = err = error(fn(a, b, bias), refs[computes])
                torch.cuda.synchronize()
                if not err < TOL:
                    raise AssertionError(f"wrong: max |err| / max |ref| = {err:.3g} (tolerance {TOL})")
                r["eager_us"] = harness.time_eager(fn, (a, b, bias))
                r["graph_us"] = do_bench_cudagraph(lambda: fn(a, b, bias), rep=100, return_mode="median") * 1e3
                r["eager_tflops"] = flops / (r["eager_us"] * 1e-6) / 1e12
                r["graph_tflops"] = flops / (r["graph_us"] * 1e-6) / 1e12
                r["ok"] = True
            except Exception as e:  # noqa: BLE001 - reported, and the run exits non-zero
                r.update(harness.failed(e))
                failures.append(f"{name} {m}x{n}x{k}: {r['error']}")
                print(f"FAILED {failures[-1]}", file=sys.stderr, flush=True)
            row[name] = r
            print(f"gemm {m}x{n}x{k} {name}: {r}", file=sys.stderr, flush=True)
        for p in ([TUNED] if tuned is not None else []) + pipelines:
            name = kfc_name(p)
            if row[name].get("ok") and row["cublas"].get("ok"):
                tag = "kfc" if name == "kfc" else name
                row[f"eager_ratio_{tag}_over_cublas"] = row[name]["eager_tflops"] / row["cublas"]["eager_tflops"]
                row[f"graph_ratio_{tag}_over_cublas"] = row[name]["graph_tflops"] / row["cublas"]["graph_tflops"]
        rows.append(row)
        del a, b, bias, product, refs
        torch.cuda.empty_cache()
    return rows, failures


def print_table(title: str, rows: list[dict], pipelines: list[str | None]) -> None:
    def cell(r: dict, key: str) -> str:
        return f"{r[key]:9.1f}" if r.get("ok") else f"{'fail':>9}"

    def ratio(row: dict, key: str) -> str:
        return f"{row[key]:7.3f}" if key in row else f"{'-':>7}"

    print(f"\n{title}")
    for p in pipelines:
        name = kfc_name(p)
        print(f"\n{name}")
        print(f"{'M x N x K':>20} {'kfc eager':>9} {'cuBLAS':>9} {'ratio':>7}   "
              f"{'kfc graph':>9} {'cuBLAS':>9} {'ratio':>7}")
        for row in rows:
            kf, cb = row[name], row["cublas"]
            print(f"{row['M']:>6}x{row['N']:>6}x{row['K']:<6} {cell(kf, 'eager_tflops')} "
                  f"{cell(cb, 'eager_tflops')} {ratio(row, f'eager_ratio_{name}_over_cublas')}   "
                  f"{cell(kf, 'graph_tflops')} {cell(cb, 'graph_tflops')} {ratio(row, f'graph_ratio_{name}_over_cublas')}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gemm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="MxNxK,... (default: " + ",".join("x".join(map(str, s)) for s in SHAPES) + ")")
    ap.add_argument("--pipeline", action="append",
                    help="a kfc pass pipeline (passed to kfc.load), or 'default' for kfc's own (the default); repeat "
                         "it to time several kfc contenders in the same run")
    ap.add_argument("--epilogue", choices=sorted(EPILOGUES),
                    help="time kernels/gemm_<epilogue>.kfc (the epilogue fused) against cuBLAS's GEMM alone and "
                         "torch's GEMM then epilogue")
    ap.add_argument("--kb", metavar="PATH",
                    help="also time kfc with the fastest pipeline this knowledge base records for each shape "
                         "(kfc tune kernels/gemm.kfc --shape M=..,N=..,K=.. --kb PATH), as kfc[tuned]")
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    pipelines = [None if p == "default" else p for p in args.pipeline or ["default"]]
    tuned = tuned_pipelines(args.kb, kernel_path(args.epilogue), shapes) if args.kb else None
    if tuned is not None:
        for (m, n, k), p in tuned.items():
            print(f"tuned {m}x{n}x{k}: {p or 'nothing recorded: the default pipeline'}", flush=True)
    rows, failures = run(shapes, pipelines, epilogue=args.epilogue, tuned=tuned)
    prov = harness.provenance([])
    first = kfc_name(pipelines[0])
    eager = [r[f"eager_ratio_{first}_over_cublas"] for r in rows if f"eager_ratio_{first}_over_cublas" in r]
    graph = [r[f"graph_ratio_{first}_over_cublas"] for r in rows if f"graph_ratio_{first}_over_cublas" in r]
    payload = {"op": "gemm" if args.epilogue is None else f"gemm_{args.epilogue}",
               "dtype": "bf16 a, b and c; fp32 accumulation",
               "pipeline": pipelines[0] if len(pipelines) == 1 else pipelines,
               "metric": "TFLOP/s = 2 M N K / time",
               "check": f"max |out - a.float() @ b.float()| / max |ref| < {TOL}, before timing",
               "timing": "eager: triton.testing.do_bench median, L2 flushed before each call; "
                         "graph: triton.testing.do_bench_cudagraph median",
               "env": prov, "shapes": rows, "failures": failures,
               "geomean_eager_ratio_kfc_over_cublas": harness.geomean(eager) if eager else None,
               "geomean_graph_ratio_kfc_over_cublas": harness.geomean(graph) if graph else None}
    path = save("gemm", payload, also=args.out)
    print(f"saved {path}")
    print_table(f"gemm: TFLOP/s on {prov.get('gpu', '?')} (bf16), eager | CUDA graph; ratio = kfc / cuBLAS", rows,
                pipelines + ([TUNED] if tuned is not None else []))
    if eager:
        print(f"geomean {first} / cuBLAS: eager {harness.geomean(eager):.3f}, graph {harness.geomean(graph):.3f}")
    for f in failures:
        print(f"FAILED {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

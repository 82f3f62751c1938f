"""Row ops (rmsnorm, layernorm, softmax) against torch.compile, Liger and QuACK on QuACK's shapes.

    python -m bench.rmsnorm [--sweep | --stage-sweep] [--shapes 32768x4096,...] [--prebuild sm_90a]

bf16 x, fp32 weights; bandwidth = bytes of inputs read + outputs written, per call. kfc runs
its default pipeline; --sweep also times a grid of tile options around the default (the best
of those is reported separately, it is not the headline number). --stage-sweep adds rows
staged through shared memory to that grid: register rows (`reg`) and rows staged from any
size (`stg`) at the default tiles, and staged rows under threads x cluster choices; per shape it
prints the six fastest variants and the reg and stg figures (eager, TB/s). It is what
STAGED_BYTES_PER_CTA and STAGED_ELEMS_PER_THREAD in kfc.passes.tile and DEFAULT_MIN_BYTES in
kfc.passes.stage_rows were chosen from; without --shapes it runs on STAGE_SWEEP_SHAPES, N up to
262144 (`python -m bench.rmsnorm --stage-sweep --no-peers`). Every variant's output is checked
against the reference like any contender's. --prebuild compiles every kfc kernel the run will
need into the JIT cache without a GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import harness
from .provenance import save
from .shapes import QUACK_SHAPES, parse_shapes

ROOT = Path(__file__).resolve().parent.parent
EPS = {"rmsnorm": 1e-6, "layernorm": 1e-5}


# --- the ops: inputs, reference, torch formula ------------------------------------------------

def make_inputs(op: str, m: int, n: int, gen):
    import torch

    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, generator=gen)
    if op == "softmax":
        return (x * 3,)
    w = torch.randn(n, device="cuda", dtype=torch.float32, generator=gen)
    if op == "rmsnorm":
        return (x, w)
    b = torch.randn(n, device="cuda", dtype=torch.float32, generator=gen)
    return (x + 1, w, b)


def reference(op: str):
    import torch

    def rms(x, w):
        xf = x.float()
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS["rmsnorm"]) * w

    def ln(x, w, b):
        return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), w, b, EPS["layernorm"])

    def sm(x):
        return torch.softmax(x.float(), dim=-1)

    return {"rmsnorm": rms, "layernorm": ln, "softmax": sm}[op]


def bytes_per_call(args, out_dtype_size: int = 2) -> int:
    x = args[0]
    return 2 * x.numel() * x.element_size() + sum(a.numel() * a.element_size() for a in args[1:])


# --- contenders ---------------------------------------------------------------------------------

def kfc_contender(op: str, pipeline: str | None = None):
    def make():
        import kfc

        k = kfc.load(ROOT / "kernels" / f"{op}.kfc", pipeline=pipeline, kb=False)
        return lambda *a: k(*a)
    return make


def torch_compile(op: str):
    def make():
        import torch

        import torch._dynamo

        # one specialised graph per shape, as a user compiling for a fixed shape gets
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, 1024)
        ref = reference(op)
        return torch.compile(lambda *a: ref(*a).to(a[0].dtype), dynamic=False)
    return make


def liger(op: str):
    def make():
        if op == "rmsnorm":
            from liger_kernel.ops.rms_norm import rms_norm_forward

            return lambda x, w: rms_norm_forward(x, w, EPS["rmsnorm"], 0.0, "gemma", None)[0]
        if op == "layernorm":
            from liger_kernel.ops.layer_norm import layer_norm_forward

            return lambda x, w, b: layer_norm_forward(x, w, b, EPS["layernorm"])[0]
        from liger_kernel.ops.softmax import _softmax_forward

        return lambda x: _softmax_forward(x)[0]
    return make


def quack(op: str, tuned: bool = False):
    def make():
        import torch

        if op == "rmsnorm":
            from quack.rmsnorm import rmsnorm_fwd, rmsnorm_fwd_tuned

            if tuned:
                def run(x, w):
                    out = torch.empty_like(x)
                    rmsnorm_fwd_tuned(x, w, out, eps=EPS["rmsnorm"])
                    return out
                return run
            return lambda x, w: rmsnorm_fwd(x, w, eps=EPS["rmsnorm"])[0]
        if op == "layernorm":
            from quack.rmsnorm import layernorm_fwd

            return lambda x, w, b: layernorm_fwd(x, w, b, eps=EPS["layernorm"])
        from quack.softmax import softmax_fwd

        return softmax_fwd
    return make


def peers(op: str) -> list[harness.Contender]:
    out = [harness.Contender("torch.compile", torch_compile(op)), harness.Contender("liger", liger(op)),
           harness.Contender("quack", quack(op))]
    if op == "rmsnorm" and QUACK_TUNED:
        out.append(harness.Contender("quack_tuned", quack(op, tuned=True)))
    return out


# QuACK's autotuned forward compiles hundreds of configurations per shape: minutes per shape
QUACK_TUNED = False


# --- the tile sweep -------------------------------------------------------------------------------

REG_PIPELINE = "canonicalize,cse,dce,tile{%s},lower-reductions,fuse-reductions,lower-ptx,canonicalize,cse,dce"
STAGED_PIPELINE = ("canonicalize,cse,dce,stage-rows{min_bytes=0},tile{%s},lower-reductions,fuse-reductions,lower-ptx,"
                   "canonicalize,cse,dce")
STAGE_SWEEP_SHAPES = [(32768, 4096), (32768, 8192), (32768, 16384), (32768, 32768), (32768, 65536), (16384, 131072),
                      (8192, 262144)]


def sweep_variants(n: int, staged: bool = False) -> dict[str, str]:
    """The swept variants for a row of n bf16 elements, name -> pipeline: tile options around
    the default choice (named by their pipeline); with `staged`, also register rows (`reg`) and
    staged rows (`stg`) at the default tiles, and staged rows under threads x cluster choices
    that fit (a cluster's share of the row at most 200 KB, 8 to 128 elements per thread)."""
    out = {p: p for p in sweep_pipelines(n)}
    if staged:
        out.update({"reg": REG_PIPELINE % "", "stg": STAGED_PIPELINE % ""})
        for c in (1, 2, 4, 8, 16):
            for t in (128, 256, 512):
                if n * 2 / c > 200 * 1024 or n / (c * t) > 128 or n / (c * t) < 8:
                    continue
                out[f"stg c{c} t{t}"] = STAGED_PIPELINE % f"threads={t},cluster={c}"
    return out


def sweep_pipelines(n: int) -> list[str]:
    """Tile options around the default choice for a row of n bf16 elements."""
    from kfc.passes.tile import choose

    rows, threads, vec, cluster = choose(n, 2, 0, 0, 0, 0, True)
    threads_options = {t for t in (threads // 2, threads, threads * 2) if 1 <= t <= 1024}
    cluster_options = {c for c in (cluster // 2, cluster, cluster * 2) if 1 <= c <= 16} if n >= 16384 else {1}
    out = []
    for t in sorted(threads_options):
        for c in sorted(cluster_options):
            for r in sorted({0, 2 * max(1, 256 // t)} if c == 1 and t < 256 else {0}):
                opts = f"threads={t},cluster={c}" + (f",rows={r}" if r else "")
                out.append(REG_PIPELINE % opts)
    return out


def prebuild(op: str, shapes, target: str, sweep: bool, staged: bool = False) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from kfc.frontend import load_kfc
    from kfc.runtime.kernel import cached_compile
    from kfc.model.target import parse_target

    spec = load_kfc(ROOT / "kernels" / f"{op}.kfc")
    t = parse_target(target)
    jobs = []
    for _, n in shapes:
        for pipe in [None] + (list(sweep_variants(n, staged).values()) if sweep else []):
            jobs.append((n, pipe))

    def build(job):
        n, pipe = job
        try:
            cached_compile(spec, t, pipe, {"N": n})
            return None
        except Exception as e:  # noqa: BLE001
            return f"N={n} {pipe}: {str(e).splitlines()[0]}"

    import os

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        problems = [p for p in pool.map(build, jobs) if p]
    for p in problems:
        print("failed:", p, file=sys.stderr)
    print(f"prebuilt {len(jobs) - len(problems)}/{len(jobs)} {op} kernels for {target}")
    return 1 if problems else 0


# --- the run --------------------------------------------------------------------------------------

TILE_PIPELINE = "canonicalize,cse,dce,stage-rows,tile{%s},lower-reductions,fuse-reductions,lower-ptx,canonicalize,cse,dce"


def run(op: str, shapes, sweep: bool, with_peers: bool, seed: int = 0, tiles=(), staged: bool = False) -> dict:
    import torch

    gen = torch.Generator(device="cuda")
    ref = reference(op)
    tol = 1e-2  # bf16 outputs
    contenders = [harness.Contender("kfc", kfc_contender(op))]
    if with_peers:
        contenders += peers(op)
    contenders += [harness.Contender(f"kfc[{t}]", kfc_contender(op, TILE_PIPELINE % t)) for t in tiles]
    fns = {c.name: harness.safe(c.make) for c in contenders}
    rows: dict = {}
    sweep_rows: dict = {}
    for m, n in shapes:
        gen.manual_seed(seed + n)
        first = make_inputs(op, m, n, gen)
        per_call = bytes_per_call(first)
        sets = [first] + [make_inputs(op, m, n, gen) for _ in range(harness.rotation(per_call) - 1)]
        rows[(m, n)] = {}
        for c in contenders:
            fn = fns[c.name]
            if isinstance(fn, str):
                rows[(m, n)][c.name] = harness.Measurement(c.name, False, error=fn)
                continue
            rows[(m, n)][c.name] = harness.measure(c, fn, sets, ref, tol, per_call)
            print(f"{op} {m}x{n} {c.name}: {rows[(m, n)][c.name]}", file=sys.stderr, flush=True)
        if sweep:
            best, swept = None, []
            for name, pipe in sweep_variants(n, staged).items():
                c = harness.Contender(name, kfc_contender(op, pipe))
                fn = harness.safe(c.make)
                meas = harness.measure(c, fn, sets, ref, tol, per_call) if callable(fn) else \
                    harness.Measurement(name, False, error=fn)
                sweep_rows.setdefault(f"{m}x{n}", []).append(
                    attrs_dict(meas) if name == pipe else {**attrs_dict(meas), "pipeline": pipe})
                swept.append(meas)
                if meas.ok and (best is None or meas.tbps > best.tbps):
                    best = meas
            if best is not None:
                rows[(m, n)]["kfc_best_swept"] = best
            if staged:
                print(stage_line(op, m, n, swept), flush=True)
        del sets, first
        torch.cuda.empty_cache()
    return {"rows": rows, "sweep": sweep_rows}


def stage_line(op: str, m: int, n: int, swept: list) -> str:
    """The six fastest swept variants of a shape (eager TB/s; a failed one says why), then the
    register (`reg`) and default staged (`stg`) figures."""
    def short(name: str) -> str:
        return name if name in ("reg", "stg") or name.startswith("stg ") else \
            name[name.index("tile{") + 5:name.index("}")] or "default"

    ranked = sorted(swept, key=lambda x: x.eager_tbps if x.ok else 0.0, reverse=True)
    by_name = {x.contender: x for x in swept}
    best = " | ".join(f"{short(x.contender)} {x.eager_tbps:.2f}" if x.ok else
                      f"{short(x.contender)} ERR {x.error[:80]}" for x in ranked[:6])
    figures = " ".join(f"{k} {by_name[k].eager_tbps:.2f}" if k in by_name and by_name[k].ok else f"{k} -"
                       for k in ("reg", "stg"))
    return f"{op} {m}x{n}: {best} || {figures}"


def attrs_dict(m: harness.Measurement) -> dict:
    import attrs

    return attrs.asdict(m)


def summarise(op: str, shapes, rows: dict, names: list[str]) -> dict:
    peer_names = [n for n in names if n not in ("kfc", "kfc_best_swept")]
    per_shape = []
    ratios, graph_ratios, ratios_best = [], [], []
    for shape in shapes:
        r = rows[shape]
        best_peer = max((r[p] for p in peer_names if p in r and r[p].ok), key=lambda m: m.tbps, default=None)
        entry = {"M": shape[0], "N": shape[1], **{k: attrs_dict(v) for k, v in r.items()}}
        kfc = r.get("kfc")
        if kfc is not None and kfc.ok:
            entry["kfc_eager_over_graph"] = kfc.eager_tbps / kfc.tbps
        if best_peer is not None and kfc is not None and kfc.ok:
            # the headline compares eager figures (what a user calling the op sees); the best
            # peer is chosen by its eager figure too
            best_eager = max((r[p] for p in peer_names if p in r and r[p].ok), key=lambda m: m.eager_tbps)
            entry["best_peer"] = best_eager.contender
            entry["ratio_vs_best_peer"] = kfc.eager_tbps / best_eager.eager_tbps
            entry["best_peer_graph"] = best_peer.contender
            entry["graph_ratio_vs_best_peer"] = kfc.tbps / best_peer.tbps
            ratios.append(entry["ratio_vs_best_peer"])
            graph_ratios.append(entry["graph_ratio_vs_best_peer"])
            if "kfc_best_swept" in r:
                entry["ratio_best_swept_vs_best_peer"] = r["kfc_best_swept"].eager_tbps / best_eager.eager_tbps
                ratios_best.append(entry["ratio_best_swept_vs_best_peer"])
        per_shape.append(entry)
    return {"shapes": per_shape, "geomean_ratio_vs_best_peer": harness.geomean(ratios) if ratios else None,
            "geomean_graph_ratio_vs_best_peer": harness.geomean(graph_ratios) if graph_ratios else None,
            "geomean_ratio_best_swept_vs_best_peer": harness.geomean(ratios_best) if ratios_best else None}


def main(op: str, argv=None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m bench.{op}", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", help="MxN,... (default: QuACK's 11 shapes)")
    ap.add_argument("--sweep", action="store_true", help="also time a grid of kfc tile options")
    ap.add_argument("--stage-sweep", action="store_true",
                    help="--sweep with rows staged through shared memory too (default shapes: STAGE_SWEEP_SHAPES)")
    ap.add_argument("--no-peers", action="store_true", help="time kfc and nothing else")
    ap.add_argument("--prebuild", metavar="TARGET", help="only compile kfc's kernels into the JIT cache")
    ap.add_argument("--quack-tuned", action="store_true",
                    help="also time QuACK's autotuned rmsnorm (it compiles hundreds of configs per shape)")
    ap.add_argument("--out", help="also write the JSON result (with its provenance) here")
    ap.add_argument("--tile", action="append", default=[], metavar="OPTS",
                    help="also time kfc with tile{OPTS} in its default pipeline, e.g. stages=2 (repeatable; "
                         "reported beside the default, not in the ratios)")
    args = ap.parse_args(argv)
    global QUACK_TUNED
    QUACK_TUNED = args.quack_tuned
    args.sweep = args.sweep or args.stage_sweep
    shapes = parse_shapes(args.shapes) if args.shapes else STAGE_SWEEP_SHAPES if args.stage_sweep else QUACK_SHAPES
    if args.prebuild:
        return prebuild(op, shapes, args.prebuild, args.sweep, args.stage_sweep)
    result = run(op, shapes, args.sweep, not args.no_peers, tiles=args.tile, staged=args.stage_sweep)
    rows = result["rows"]
    names = ["kfc"] + (["kfc_best_swept"] if args.sweep else []) + \
        ([] if args.no_peers else [c.name for c in peers(op)])
    tiled = [f"kfc[{t}]" for t in args.tile]
    summary = summarise(op, shapes, rows, names)
    names += tiled
    prov = harness.provenance(["quack-kernels", "liger-kernel", "fla-core", "nvidia-cutlass-dsl"])
    payload = {"op": op, "dtype": "bf16 x, fp32 weights", "metric": "TB/s = (bytes read + bytes written) / time",
               "timing": "eager: triton.testing.do_bench median, L2 flushed before each call (the headline); "
                         "graph: CUDA graph of rotating input sets beyond L2, median of 10 replays",
               "env": prov,
               **summary, "sweep": result["sweep"]}
    path = save(f"{op}", payload, also=args.out)
    harness.print_table(f"{op}: TB/s on {prov.get('gpu', '?')} (bf16)", shapes, names, rows)
    print("\nkfc / best peer, eager (graph), per shape: " + ", ".join(
        f"{s['N']}:{s['ratio_vs_best_peer']:.2f} ({s['graph_ratio_vs_best_peer']:.2f})"
        for s in summary["shapes"] if "ratio_vs_best_peer" in s))
    print("kfc eager / graph, per shape: " + ", ".join(
        f"{s['N']}:{s['kfc_eager_over_graph']:.3f}" for s in summary["shapes"] if "kfc_eager_over_graph" in s))
    g, gg = summary["geomean_ratio_vs_best_peer"], summary["geomean_graph_ratio_vs_best_peer"]
    print(f"geomean kfc / best peer: eager {g:.3f}, graph {gg:.3f}" if g else "geomean: no peer ran")
    gb = summary["geomean_ratio_best_swept_vs_best_peer"]
    if gb:
        print(f"geomean best swept kfc / best peer: {gb:.3f}")
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "rmsnorm", sys.argv[2:]))

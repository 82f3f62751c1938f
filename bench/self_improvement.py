"""Does the factory learn across runs? Softmax tuned with an empty knowledge base (cold), and
again with a knowledge base filled by tuning rmsnorm and layernorm (warm), at the same shapes,
with the same policy and budget.

    python -m bench.self_improvement [--budget 24] [--warm-kb PATH-with-rmsnorm]

For each shape: the best time found by either softmax run, and how many candidates each run
needed to get within 5% of it (95% of the best speed). The warm run must need at most half the
candidates of the cold one. Writes bench/results/self_improvement-<stamp>.json and the
best-so-far curves of both runs as PNG beside it.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

from .provenance import save
from .shapes import parse_shapes

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(32768, 4096), (32768, 16384), (32768, 65536)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=int, default=24)
    ap.add_argument("--warm-kb", help="start the warm knowledge base from this one (e.g. rmsnorm already tuned)")
    ap.add_argument("--out", default=".", help="folder for the knowledge bases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8, help="candidates proposed and compiled together")
    ap.add_argument("--result", help="also write the JSON result here (and the plot beside it)")
    ap.add_argument("--shapes", help="MxN,... (default: 32768x4096,32768x16384,32768x65536)")
    ap.add_argument("--summarize-only", action="store_true",
                    help="no tuning and no GPU: summarize the finished tunes in --out's knowledge bases")
    ap.add_argument("--fresh", action="store_true",
                    help="start both knowledge bases over (default: keep them, so a stopped call resumes)")
    args = ap.parse_args(argv)
    if args.summarize_only and args.fresh:
        ap.error("--fresh would delete the knowledge bases --summarize-only reads")

    from kfc.factory.evaluate import Evaluator
    from kfc.factory.offline import SearchPolicy
    from kfc.factory.tune import finished_tune, tune
    from kfc.frontend import load_kfc
    from kfc.kb.store import KnowledgeBase
    from kfc.model.target import parse_target

    if not args.summarize_only:
        import torch
    target = parse_target("sm_90a")
    shapes = parse_shapes(args.shapes) if args.shapes else SHAPES
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cold_path, warm_path = out / "kb-cold.sqlite", out / "kb-warm.sqlite"
    if args.fresh:
        for p in (cold_path, warm_path):
            for f in (p, p.with_name(p.name + "-wal"), p.with_name(p.name + "-shm")):
                f.unlink(missing_ok=True)
    if args.warm_kb and not warm_path.exists():
        with KnowledgeBase(args.warm_kb, create=False) as src, sqlite3.connect(warm_path) as dst:
            src.integrity_check()
            src.conn.backup(dst)  # the WAL's committed pages included, unlike a file copy
    specs = {k: load_kfc(ROOT / "kernels" / f"{k}.kfc") for k in ("rmsnorm", "layernorm", "softmax")}
    runs = {"cold": {}, "warm": {}}
    if args.summarize_only:  # no GPU: the finished tunes are read back from both knowledge bases
        with KnowledgeBase(cold_path, create=False) as cold, KnowledgeBase(warm_path, create=False) as warm:
            for kind, kb in (("cold", cold), ("warm", warm)):
                for m, n in shapes:
                    r = finished_tune(specs["softmax"], target, {"M": m, "N": n}, args.budget, "search", kb)
                    if r is None:
                        sys.exit(f"error: {kb.path} holds no finished softmax tune at {m}x{n} with budget {args.budget}")
                    runs[kind][(m, n)] = r
            rows, curves = summarize(cold, warm, runs, shapes)
            gpu = cold.runs()[-1]["gpu"]
    else:
        ev = Evaluator([str(i) for i in range(torch.cuda.device_count())])

        def run(op: str, kb, dims: dict, seed: int):
            """Tune, or read back a tune this knowledge base already finished (a resumed call)."""
            done = finished_tune(specs[op], target, dims, args.budget, "search", kb)
            return done or tune(specs[op], target, dims, args.budget, SearchPolicy(seed=seed), kb, ev,
                                batch=args.batch)

        try:
            cold = KnowledgeBase(cold_path)
            for m, n in shapes:
                runs["cold"][(m, n)] = run("softmax", cold, {"M": m, "N": n}, args.seed)
                print(f"cold softmax {m}x{n}: best {runs['cold'][(m, n)].best.outcome.median_us:.1f} us", flush=True)
            warm = KnowledgeBase(warm_path)
            for op in ("rmsnorm", "layernorm"):
                for m, n in shapes:
                    run(op, warm, {"M": m, "N": n}, args.seed + 1)
                    print(f"warm-up {op} {m}x{n} done", flush=True)
            for m, n in shapes:
                runs["warm"][(m, n)] = run("softmax", warm, {"M": m, "N": n}, args.seed)
                print(f"warm softmax {m}x{n}: best {runs['warm'][(m, n)].best.outcome.median_us:.1f} us", flush=True)
            rows, curves = summarize(cold, warm, runs, shapes)
            cold.close()
            warm.close()
        finally:
            ev.close()
        gpu = torch.cuda.get_device_name()
    ok = all(r["warm_at_most_half"] for r in rows)
    path = save("self_improvement", {"budget": args.budget, "shapes": [list(s) for s in shapes], "rows": rows,
                                     "curves_best_so_far_us": curves, "warm_at_most_half_everywhere": ok,
                                     "gpu": gpu, "policy": "search", "batch": args.batch,
                                     "seed": args.seed, "command": " ".join(["python -m bench.self_improvement"]
                                                                            + list(argv or sys.argv[1:]))},
                also=args.result)
    plot(curves, path.with_suffix(".png"))
    if args.result:
        plot(curves, Path(args.result).with_suffix(".png"))
    print(f"{'M x N':>16} {'best us':>9} {'cold to 95%':>12} {'warm to 95%':>12}")
    for r in rows:
        print(f"{r['M']:>7} x {r['N']:<7} {r['best_us']:9.1f} {str(r['cold_candidates_to_95']):>12} "
              f"{str(r['warm_candidates_to_95']):>12}")
    print(f"warm needs at most half the cold run's candidates everywhere: {ok}; saved {path}")
    return 0


def summarize(cold, warm, runs: dict, shapes: list) -> tuple[list[dict], dict]:
    """Per shape: the best time either softmax run found, the candidates each needed to get
    within 5% of it, and both best-so-far curves (the baseline left out of both)."""
    rows, curves = [], {}
    for m, n in shapes:
        row, curves[f"{m}x{n}"] = compare_runs(cold, runs["cold"][(m, n)], warm, runs["warm"][(m, n)])
        rows.append({"M": m, "N": n, **row, "warm_at_most_half": row["warm_candidates_to_95"] is not None and (
            row["cold_candidates_to_95"] is None or row["warm_candidates_to_95"] <= row["cold_candidates_to_95"] / 2)})
    return rows, curves


FIRST = 4  # the candidates of each run whose pipelines a comparison keeps


def compare_runs(cold_kb, cold_run, warm_kb, warm_run) -> tuple[dict, dict]:
    """A cold and a warm tune of one shape: the best time either found, the candidates each
    needed to get within 5% of it (95% of the best speed), each run's first FIRST candidates
    (pipeline, time, rationale), and both best-so-far curves (the baseline left out of both)."""
    from kfc.factory.tune import candidates_to_reach, curve

    trials = {"cold": cold_kb.trials(run_id=cold_run.run_id), "warm": warm_kb.trials(run_id=warm_run.run_id)}
    search = {k: [t for t in ts if t.proposal.proposer != "baseline"] for k, ts in trials.items()}
    best = min(min(t.outcome.median_us for t in ts if t.outcome.median_us) for ts in search.values())
    need = {k: candidates_to_reach(ts, best / 0.95) for k, ts in search.items()}
    row = {"best_us": best, "cold_candidates_to_95": need["cold"], "warm_candidates_to_95": need["warm"],
           "cold_best_us": min(t.outcome.median_us for t in search["cold"] if t.outcome.median_us),
           "warm_best_us": min(t.outcome.median_us for t in search["warm"] if t.outcome.median_us),
           "baseline_us": cold_run.baseline.outcome.median_us,
           "cold_run": cold_run.run_id, "warm_run": warm_run.run_id,
           # what each run tried first and why: where a warm run's prior came from, kept with the result
           "first_candidates": {k: [{"pipeline": t.proposal.pipeline, "us": t.outcome.median_us,
                                     "why": t.proposal.rationale} for t in ts[:FIRST]] for k, ts in search.items()}}
    return row, {k: curve(ts) for k, ts in search.items()}


def plot(curves: dict, path: Path, op: str = "softmax") -> None:
    """Best-so-far time against candidate number, cold and warm, one panel per shape (or seed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(curves), 3.4))
    FigureCanvasAgg(fig)
    for i, (shape, runs) in enumerate(curves.items(), 1):
        ax = fig.add_subplot(1, len(curves), i)
        for k, ys in runs.items():
            xs = [j for j, y in enumerate(ys, 1) if y != float("inf")]
            ax.plot(xs, [ys[j - 1] for j in xs], marker=".", label=f"{k} knowledge base")
        ax.set_title(f"{op} {shape}")
        ax.set_xlabel("candidate")
        ax.set_ylabel("best time so far (us)")
        ax.legend()
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=110)
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())

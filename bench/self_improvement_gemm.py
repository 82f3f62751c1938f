"""Does the factory learn across GEMM shapes? kernels/gemm.kfc tuned at one shape with an empty
knowledge base (cold), and again with one that holds tunes of other GEMM shapes (warm), with the
same policy, seed and budget, for each of several seeds.

    python -m bench.self_improvement_gemm [--shape 128x8192x8192] [--others 64x8192x8192,...]
                                          [--seeds 0,1,2,3,4] [--budget 16] [--others-budget 32]
                                          [--out DIR] [--result FILE]

Per seed: the best time either run found, and how many candidates each needed to get within 5%
of it (95% of the best speed). The warm run must need at most a third of the cold run's
candidates, for every seed. Each seed's cold run has a knowledge base of its own (a cold run
must not learn from the seed before it); each warm run starts from a copy of one knowledge base
holding the other shapes' tunes (seed 0's search, once). The knowledge bases stay in --out, so
a stopped call resumes where it stopped. The experiment means something only where the
default pipeline is far from the best: where it is within 5%, the first candidate of either run
already is. At 4096³ it is within 2%; at 16 x 8192 x 8192 it was 1.26x from it until the default
took 64-row tiles for products of at most 64 rows. So the default shape is 128 x 8192 x 8192,
where the default's 128 x 256 tiles make 32 CTAs for 132 SMs, as they did at 16 rows (how far
its best is from the default there is not yet measured). Writes
bench/results/self_improvement_gemm-<stamp>.json and the best-so-far curves, one panel per
seed, as PNG beside it.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from pathlib import Path

from .gemm import parse_shapes
from .provenance import save
from .self_improvement import compare_runs, plot

ROOT = Path(__file__).resolve().parent.parent
SHAPE = (128, 8192, 8192)
OTHERS = [(64, 8192, 8192), (4096, 4096, 4096)]
SEEDS = (0, 1, 2, 3, 4)
FRACTION = 1 / 3  # the warm run's candidates to 95% against the cold run's, at most


def dims(shape) -> dict[str, int]:
    return dict(zip("MNK", shape))


def experiment(spec, target, shape, others, seeds, budget: int, evaluator, out: Path, batch: int | None = None,
               log=print, others_budget: int | None = None) -> tuple[list[dict], dict]:
    """Tune the other shapes into a base knowledge base (others_budget candidates each, else
    budget), then per seed a cold and a warm tune of `shape`; per seed a row (the runs'
    comparison, and whether warm needed at most FRACTION of the cold run's candidates) and the
    best-so-far curves."""
    from kfc.factory.offline import SearchPolicy
    from kfc.factory.tune import finished_tune, tune
    from kfc.kb.store import KnowledgeBase

    def run(kb, at, seed: int, n: int = budget):
        """Tune, or read back a tune this knowledge base already finished (a resumed call)."""
        return finished_tune(spec, target, dims(at), n, "search", kb) or \
            tune(spec, target, dims(at), n, SearchPolicy(seed=seed), kb, evaluator, batch=batch)

    out.mkdir(parents=True, exist_ok=True)
    base_path = out / "kb-others.sqlite"
    with KnowledgeBase(base_path) as base:
        for other in others:
            run(base, other, 0, others_budget or budget)
            log(f"other shape {'x'.join(map(str, other))} tuned")
    rows, curves = [], {}
    for seed in seeds:
        cold_path, warm_path = out / f"kb-cold-seed{seed}.sqlite", out / f"kb-warm-seed{seed}.sqlite"
        if not warm_path.exists():
            with KnowledgeBase(base_path, create=False) as src, sqlite3.connect(warm_path) as dst:
                src.conn.backup(dst)  # the WAL's committed pages included, unlike a file copy
        with KnowledgeBase(cold_path) as cold, KnowledgeBase(warm_path) as warm:
            row, curve = compare_runs(cold, run(cold, shape, seed), warm, run(warm, shape, seed))
        c, w = row["cold_candidates_to_95"], row["warm_candidates_to_95"]
        rows.append({"seed": seed, **row, "warm_within_fraction": w is not None and (c is None or w <= c * FRACTION)})
        curves[f"seed {seed}"] = curve
        log(f"seed {seed}: best {row['best_us']:.1f} us; to 95%: cold {c}, warm {w}")
    return rows, curves


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.self_improvement_gemm", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", help="MxNxK to tune (default: 128x8192x8192)")
    ap.add_argument("--others", help="MxNxK,... the warm knowledge base holds (default: "
                                     + ",".join("x".join(map(str, s)) for s in OTHERS) + ")")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="the search policy's seeds (default: 0,1,2,3,4)")
    ap.add_argument("--budget", type=int, default=16, help="candidates per tune, the baseline not counted")
    ap.add_argument("--others-budget", type=int, default=32,
                    help="candidates per tune of the other shapes (default 32: a knowledge base's record of a shape "
                         "is usually a longer search than one tune)")
    ap.add_argument("--batch", type=int, default=8, help="candidates proposed and compiled together")
    ap.add_argument("--out", default="kfc-out/self-improvement-gemm", help="folder for the knowledge bases")
    ap.add_argument("--result", help="also write the JSON result here (and the plot beside it)")
    args = ap.parse_args(argv)

    import torch

    from kfc.factory.evaluate import Evaluator
    from kfc.frontend import load_kfc
    from kfc.model.target import parse_target

    shape = parse_shapes(args.shape)[0] if args.shape else SHAPE
    others = parse_shapes(args.others) if args.others else OTHERS
    seeds = [int(s) for s in args.seeds.split(",")]
    ev = Evaluator([str(i) for i in range(torch.cuda.device_count())])
    try:
        rows, curves = experiment(load_kfc(ROOT / "kernels" / "gemm.kfc"), parse_target("sm_90a"), shape, others,
                                  seeds, args.budget, ev, Path(args.out), args.batch,
                                  log=lambda m: print(m, flush=True), others_budget=args.others_budget)
    finally:
        ev.close()
    ok = all(r["warm_within_fraction"] for r in rows)
    path = save("self_improvement_gemm", {
        "op": "gemm", "shape": list(shape), "others": [list(s) for s in others], "budget": args.budget,
        "others_budget": args.others_budget,
        "seeds": seeds, "rows": rows, "curves_best_so_far_us": curves, "warm_within_a_third_for_every_seed": ok,
        "gpu": torch.cuda.get_device_name(), "policy": "search", "batch": args.batch,
        # paths by their last part: a result carries no machine's folders
        "command": " ".join(["python -m bench.self_improvement_gemm"]
                            + [Path(a).name if "/" in a else a for a in (argv or sys.argv[1:])])},
        also=args.result)
    plot(curves, path.with_suffix(".png"), op=f"gemm {'x'.join(map(str, shape))}")
    if args.result:
        plot(curves, Path(args.result).with_suffix(".png"), op=f"gemm {'x'.join(map(str, shape))}")
    print(f"{'seed':>4} {'best us':>9} {'cold to 95%':>12} {'warm to 95%':>12}")
    for r in rows:
        print(f"{r['seed']:>4} {r['best_us']:9.1f} {str(r['cold_candidates_to_95']):>12} "
              f"{str(r['warm_candidates_to_95']):>12}")
    print(f"warm needs at most a third of the cold run's candidates for every seed: {ok}; saved {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

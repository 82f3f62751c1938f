"""`kfc tune` over QuACK's 11 shapes: does the factory find kernels at least as fast as kfc's
default pipeline?

    python -m bench.tune_quack [--op rmsnorm] [--budget 32] [--kb PATH]

Each shape is tuned with the offline search policy; the default pipeline is timed first, in
the same process, as the baseline. Writes bench/results/tune-<op>-<stamp>.json with, per
shape, the baseline's and the best candidate's time and bandwidth, and the best pipeline.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .provenance import save
from .rows import QUACK_SHAPES

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="rmsnorm")
    ap.add_argument("--budget", type=int, default=32)
    ap.add_argument("--kb", default=None, help="knowledge base path (default: a new one beside the result)")
    ap.add_argument("--shapes", help="MxN,... (default: QuACK's 11 shapes)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=8, help="candidates proposed and compiled together")
    ap.add_argument("--result", help="also write the JSON result here")
    args = ap.parse_args(argv)

    import torch

    from kfc.factory.evaluate import Evaluator
    from kfc.factory.offline import SearchPolicy
    from kfc.factory.tune import tune
    from kfc.frontend import load_kfc
    from kfc.kb.store import KnowledgeBase
    from kfc.target import parse_target

    shapes = QUACK_SHAPES if not args.shapes else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    spec = load_kfc(ROOT / "kernels" / f"{args.op}.kfc")
    target = parse_target("sm_90a")
    kb = KnowledgeBase(args.kb or f"kb-{args.op}.sqlite")
    ev = Evaluator([str(i) for i in range(torch.cuda.device_count())])
    rows = []
    try:
        for m, n in shapes:
            t0 = time.perf_counter()
            r = tune(spec, target, {"M": m, "N": n}, args.budget, SearchPolicy(seed=args.seed), kb, ev,
                     batch=args.batch)
            base, best = r.baseline.outcome, r.best.outcome
            nbytes = best.bytes_moved or base.bytes_moved
            rows.append({"M": m, "N": n, "run": r.run_id, "candidates": r.candidates,
                         "baseline_us": base.median_us, "best_us": best.median_us,
                         "baseline_tbps": nbytes / base.median_us / 1e6, "best_tbps": nbytes / best.median_us / 1e6,
                         "speedup_over_default": r.speedup, "best_pipeline": r.best.proposal.pipeline,
                         "best_is_default": r.best.candidate_id == r.baseline.candidate_id,
                         "seconds": round(time.perf_counter() - t0, 1)})
            print(f"{args.op} {m}x{n}: default {base.median_us:.1f} us, best {best.median_us:.1f} us "
                  f"({r.speedup:.3f}x) after {r.candidates} candidates", flush=True)
    finally:
        ev.close()
        kb.close()
    ok = all(r["best_us"] <= r["baseline_us"] for r in rows)
    path = save(f"tune-{args.op}", {"op": args.op, "budget": args.budget, "policy": "search",
                                    "gpu": torch.cuda.get_device_name(), "rows": rows,
                                    "all_at_least_as_fast_as_default": ok, "kb": str(args.kb),
                                    "batch": args.batch}, also=args.result)
    print(f"{'M x N':>16} {'default TB/s':>13} {'best TB/s':>10} {'speedup':>8}")
    for r in rows:
        print(f"{r['M']:>7} x {r['N']:<7} {r['baseline_tbps']:13.2f} {r['best_tbps']:10.2f} "
              f"{r['speedup_over_default']:8.3f}")
    print(f"every shape at least as fast as the default: {ok}; saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

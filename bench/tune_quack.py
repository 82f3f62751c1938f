"""`kfc tune` over QuACK's 11 shapes: does the factory find kernels at least as fast as kfc's
default pipeline?

    python -m bench.tune_quack [--op rmsnorm] [--budget 32] [--kb PATH]

Each shape is tuned with the offline search policy; the default pipeline is timed first, in
the same process, as the baseline. Run again with the same --kb after being stopped, it reads
back the shapes already tuned to this budget and resumes the one that was cut short. Writes bench/results/tune-<op>-<stamp>.json with, per
shape, the baseline's and the best candidate's time and bandwidth, and the best pipeline.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .provenance import save
from .shapes import QUACK_SHAPES, parse_shapes

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
    from kfc.factory.tune import finished_tune, tune
    from kfc.frontend import load_kfc
    from kfc.kb.store import KnowledgeBase
    from kfc.model.target import parse_target

    shapes = parse_shapes(args.shapes) if args.shapes else QUACK_SHAPES
    spec = load_kfc(ROOT / "kernels" / f"{args.op}.kfc")
    target = parse_target("sm_90a")
    kb = KnowledgeBase(args.kb or f"kb-{args.op}.sqlite")
    ev = Evaluator([str(i) for i in range(torch.cuda.device_count())])
    rows = []

    def payload(complete: bool) -> dict:
        return {"op": args.op, "budget": args.budget, "policy": "search", "gpu": torch.cuda.get_device_name(),
                "rows": rows, "complete": complete, "all_at_least_as_fast_as_default":
                complete and all(r["best_us"] <= r["baseline_us"] for r in rows), "kb": str(args.kb),
                "batch": args.batch, "seed": args.seed,
                "command": " ".join(["python -m bench.tune_quack"] + list(argv or sys.argv[1:]))}

    try:
        for m, n in shapes:
            t0 = time.perf_counter()
            dims = {"M": m, "N": n}
            # a shape already tuned to this budget in this knowledge base (an earlier, stopped call) is read back
            r = finished_tune(spec, target, dims, args.budget, "search", kb)
            resumed = r is not None
            r = r or tune(spec, target, dims, args.budget, SearchPolicy(seed=args.seed), kb, ev, batch=args.batch)
            base, best = r.baseline.outcome, r.best.outcome
            nbytes = best.bytes_moved or base.bytes_moved
            rows.append({"M": m, "N": n, "run": r.run_id, "candidates": r.candidates,
                         "baseline_us": base.median_us, "best_us": best.median_us,
                         "baseline_tbps": nbytes / base.median_us / 1e6, "best_tbps": nbytes / best.median_us / 1e6,
                         "speedup_over_default": r.speedup, "best_pipeline": r.best.proposal.pipeline,
                         "best_is_default": r.best.candidate_id == r.baseline.candidate_id,
                         "seconds": None if resumed else round(time.perf_counter() - t0, 1)})
            print(f"{args.op} {m}x{n}: default {base.median_us:.1f} us, best {best.median_us:.1f} us "
                  f"({r.speedup:.3f}x) after {r.candidates} candidates"
                  + (" (read from the knowledge base)" if resumed else f" in {rows[-1]['seconds']} s"), flush=True)
            if args.result:  # a stopped call still leaves what it finished
                Path(args.result).write_text(json.dumps(payload(False), indent=2) + "\n")
    finally:
        ev.close()
        kb.close()
    doc = payload(len(rows) == len(shapes))
    ok = doc["all_at_least_as_fast_as_default"]
    path = save(f"tune-{args.op}", doc, also=args.result)
    print(f"{'M x N':>16} {'default TB/s':>13} {'best TB/s':>10} {'speedup':>8}")
    for r in rows:
        print(f"{r['M']:>7} x {r['N']:<7} {r['baseline_tbps']:13.2f} {r['best_tbps']:10.2f} "
              f"{r['speedup_over_default']:8.3f}")
    print(f"every shape at least as fast as the default: {ok}; saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

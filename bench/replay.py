"""The self-improvement protocol (bench.self_improvement) replayed on recorded H200 landscapes
(bench.landscape), for many seeds, in seconds and without a GPU: a testbed for search
policies before they are measured for real.

    python -m bench.replay [--seeds 0-19] [--budget 24] [--landscape bench/data/h200-rows.json]
                           [--basin-tolerance 0] [--no-anchor] [--joint]

A candidate's time is one of its recorded medians (drawn at random: the run-to-run noise), its
recorded failure, or, for a configuration never measured, the geometric mean of the nearest
recorded ones. Replayed numbers are evidence about a policy, not measurements: only the H200
runs of bench.self_improvement are. Prints, per shape, how often the warm run needed at most
half the cold run's candidates to come within 5% of the best, and the median candidates of each.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from concurrent.futures import Future
from pathlib import Path

from .landscape import Landscape, config_key, load
from .provenance import save
from .self_improvement import SHAPES, summarize

ROOT = Path(__file__).resolve().parent.parent


class ReplayGpu:
    """An evaluator answering from a recorded landscape (the Evaluator's interface)."""

    n_gpus = 1

    def __init__(self, landscape: dict, seed: int) -> None:
        self.ops = landscape["ops"]
        self.rng = random.Random(seed)
        self.cache: dict[tuple[str, str], Landscape] = {}
        self.measured = self.unmeasured = 0

    def evaluate(self, spec, target, pipeline, cases, dims) -> Future:
        from kfc.factory.evaluate import Compiled
        from kfc.factory.gate import GateResult
        from kfc.model.records import Stage
        from kfc.factory.tune import space_for

        shape = f"{dims['M']}x{dims['N']}"
        key = (spec.instance_name, shape)
        if key not in self.cache:
            self.cache[key] = Landscape(self.ops.get(spec.instance_name, {}).get(shape, []))
        land = self.cache[key]
        config = space_for(spec, dims, target).config_of(pipeline)
        f: Future = Future()
        if config is None:
            f.set_result((Compiled(Stage.PARSED, "not a point of the search space: nothing recorded"), None))
            return f
        us, error, measured = land.lookup(config)
        self.measured += measured
        self.unmeasured += not measured
        if us is None:
            f.set_result((Compiled(Stage.VERIFIED, error), None))
            return f
        point = land.by_key.get(config_key(config))
        if point is not None and point["times_us"]:
            us = self.rng.choice(point["times_us"])
        f.set_result((Compiled(Stage.COMPILED, "", 40, 0, 0),
                      GateResult(Stage.TIMED, median_us=us, spread_us=0.0, times_us=(us,),
                                 notes="recorded" if measured else "neighbours")))
        return f

    def close(self) -> None:
        pass


def replay(landscape: dict, seed: int, budget: int, batch: int, shapes, policy_factory) -> list[dict]:
    """One seed of the protocol: cold softmax; rmsnorm and layernorm then softmax on a warm
    knowledge base. Rows as bench.self_improvement writes them."""
    from kfc.factory.tune import tune
    from kfc.frontend import load_kfc
    from kfc.kb.store import KnowledgeBase
    from kfc.model.target import parse_target

    target = parse_target("sm_90a")
    specs = {k: load_kfc(ROOT / "kernels" / f"{k}.kfc") for k in ("rmsnorm", "layernorm", "softmax")}
    gpu = ReplayGpu(landscape, seed)
    runs: dict = {"cold": {}, "warm": {}}
    with tempfile.TemporaryDirectory() as tmp, KnowledgeBase(Path(tmp) / "cold.sqlite") as cold, \
            KnowledgeBase(Path(tmp) / "warm.sqlite") as warm:
        for m, n in shapes:
            runs["cold"][(m, n)] = tune(specs["softmax"], target, {"M": m, "N": n}, budget, policy_factory(seed),
                                        cold, gpu, batch=batch)
        for op, b in (("rmsnorm", 32), ("layernorm", budget)):
            for m, n in shapes:
                tune(specs[op], target, {"M": m, "N": n}, b, policy_factory(seed + 1), warm, gpu, batch=batch)
        for m, n in shapes:
            runs["warm"][(m, n)] = tune(specs["softmax"], target, {"M": m, "N": n}, budget, policy_factory(seed),
                                        warm, gpu, batch=batch)
        rows, _ = summarize(cold, warm, runs, shapes)
    for r in rows:
        r["seed"] = seed
        r["answered_from_neighbours"] = round(gpu.unmeasured / max(1, gpu.measured + gpu.unmeasured), 3)
    return rows


def report(rows: list[dict], shapes, budget: int) -> dict:
    out: dict = {}
    print(f"{'M x N':>16} {'warm <= cold/2':>15} {'cold median':>12} {'warm median':>12}")
    for m, n in shapes:
        rs = [r for r in rows if (r["M"], r["N"]) == (m, n)]
        ok = sum(r["warm_at_most_half"] for r in rs)
        cold = statistics.median(r["cold_candidates_to_95"] or budget + 1 for r in rs)
        warm = statistics.median(r["warm_candidates_to_95"] or budget + 1 for r in rs)
        print(f"{m:>7} x {n:<7} {ok:>9} of {len(rs):<3} {cold:12.1f} {warm:12.1f}")
        out[f"{m}x{n}"] = {"warm_at_most_half": ok, "seeds": len(rs), "cold_median": cold, "warm_median": warm}
    seeds = sorted({r["seed"] for r in rows})
    everywhere = sum(all(r["warm_at_most_half"] for r in rows if r["seed"] == s) for s in seeds)
    share = statistics.mean(r["answered_from_neighbours"] for r in rows)
    print(f"seeds where the warm run needed at most half everywhere: {everywhere} of {len(seeds)}; "
          f"{share:.0%} of candidates answered from recorded neighbours")
    out["seeds_everywhere"] = everywhere
    out["answered_from_neighbours"] = round(share, 3)
    return out


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--landscape", default=str(ROOT / "bench" / "data" / "h200-rows.json"))
    ap.add_argument("--seeds", default="0-19", type=_seeds, help="e.g. 0-19 or 0,3,5")
    ap.add_argument("--budget", type=int, default=24)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--transfer", type=float, default=None, help="the search policy's weight of a similar op's trial")
    ap.add_argument("--no-anchor", action="store_true",
                    help="the search policy steps only from the best configurations, not also from the default's")
    ap.add_argument("--joint", action="store_true", help="the search policy fits its effects jointly (ridge)")
    ap.add_argument("--ridge", type=float, default=None, help="the ridge strength with --joint")
    ap.add_argument("--basin-tolerance", type=float, default=None,
                    help="how near a similar op's best a configuration must be to be tried as its basin's best "
                         "(0: no hedging across basins)")
    args = ap.parse_args(argv)

    from kfc.factory.offline import SearchPolicy

    kw = {k: v for k, v in (("transfer", args.transfer), ("ridge", args.ridge),
                            ("basin_tolerance", args.basin_tolerance)) if v is not None}
    if args.joint:
        kw["joint"] = True
    if args.no_anchor:
        kw["anchor"] = False
    landscape = load(args.landscape)
    rows = []
    for seed in args.seeds:
        rows += replay(landscape, seed, args.budget, args.batch, SHAPES, lambda s: SearchPolicy(seed=s, **kw))
        print(f"seed {seed}: " + ", ".join(f"{r['N']}: {r['cold_candidates_to_95']}/{r['warm_candidates_to_95']}"
                                           for r in rows if r["seed"] == seed), flush=True)
    summary = report(rows, SHAPES, args.budget)
    policy = {"name": "search", **kw}
    path = save("replay", {"landscape": str(Path(args.landscape).relative_to(ROOT)) if Path(args.landscape).is_absolute()
                           and Path(args.landscape).is_relative_to(ROOT) else args.landscape,
                           "policy": policy, "budget": args.budget, "batch": args.batch, "seeds": args.seeds,
                           "summary": summary, "rows": rows,
                           "note": "replayed on recorded H200 timings, not measured: see the module doc"})
    print(f"saved {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

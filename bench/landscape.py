"""Recorded tuning landscapes: every candidate the GPU evaluated, as (op, shape, configuration)
-> measured times or the failure, gathered from knowledge bases into one JSON file, so policy
work can be replayed without a GPU (`bench.replay`).

    python -m bench.landscape KB.sqlite ... -o bench/data/h200-rows.json [--add-to bench/data/h200-rows.json]

A configuration measured several times keeps every median (runs on different days, different
machines of the same kind). Records copied from one knowledge base into another (a warm start)
count once. Only candidates whose pipeline is a point of the search space are kept.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import sys
from pathlib import Path

from kfc.factory.space import GEOMETRY, completed

ROOT = Path(__file__).resolve().parent.parent


def collect(paths: list[str], base: dict | None = None) -> dict:
    """{"gpus": [...], "kfc_commits": [...], "ops": {op: {"MxN": [{"config", "times_us"|"error"}]}}},
    added to `base` (an earlier landscape) when given."""
    from kfc.factory.tune import space_for
    from kfc.frontend import load_kfc
    from kfc.model.target import parse_target

    target = parse_target("sm_90a")
    specs: dict[str, object] = {}
    seen: set[tuple] = set()
    points: dict[str, dict[str, dict[str, dict]]] = {}
    gpus, commits = set((base or {}).get("gpus", [])), set((base or {}).get("kfc_commits", []))
    for op, shapes in (base or {}).get("ops", {}).items():
        for shape, entries in shapes.items():
            for e in entries:
                points.setdefault(op, {}).setdefault(shape, {})[config_key(e["config"])] = \
                    {**e, "times_us": list(e["times_us"])}
    for path in paths:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            db.row_factory = sqlite3.Row
            for r in db.execute("SELECT gpu, kfc_commit FROM runs"):
                gpus.add(r["gpu"])
                commits.add(r["kfc_commit"])
            rows = db.execute(
                "SELECT p.name, c.shape, c.pipeline, o.stage, o.error, o.median_us, o.recorded_utc FROM candidates c "
                "JOIN ops p ON p.id = c.op_id JOIN outcomes o ON o.candidate_id = c.id WHERE c.target = 'sm_90a'")
            for r in rows:
                key = (r["name"], r["shape"], r["pipeline"], r["recorded_utc"])
                if key in seen:
                    continue
                seen.add(key)
                op = r["name"].rsplit("_", 1)[0]
                if op not in specs:
                    specs[op] = load_kfc(ROOT / "kernels" / f"{op}.kfc")
                dims = json.loads(r["shape"])
                config = space_for(specs[op], dims, target).config_of(r["pipeline"])
                if config is None:
                    continue
                shape = f"{dims['M']}x{dims['N']}"
                ck = config_key(config)
                entry = points.setdefault(r["name"], {}).setdefault(shape, {}).setdefault(
                    ck, {"config": config, "times_us": []})
                if r["stage"] == "timed" and r["median_us"]:
                    entry["times_us"].append(round(r["median_us"], 3))
                else:
                    entry["error"] = f"{r['stage']}: {(r['error'] or '').splitlines()[0][:200]}"
    ops = {op: {shape: sorted(cfgs.values(), key=lambda e: config_key(e["config"]))
                for shape, cfgs in sorted(shapes.items())} for op, shapes in sorted(points.items())}
    return {"gpus": sorted(g for g in gpus if g), "kfc_commits": sorted(c for c in commits if c), "ops": ops}


def config_key(config: dict) -> str:
    """One text per configuration, whatever the order of its choices."""
    return json.dumps(completed(config), sort_keys=True)


class Landscape:
    """Times of one op at one shape: measured where recorded, else the geometric mean of the
    nearest recorded configurations, so an unmeasured point is answered by its neighbourhood
    rather than by a model of any policy's. Nearness counts a differing launch-geometry choice
    (kfc.factory.space.GEOMETRY) as `geometry_weight` differing details: another geometry is
    another kernel. Every point as near as the k-th nearest is averaged, so ties do not favour
    the fastest."""

    def __init__(self, points: list[dict], k: int = 3, geometry_weight: int = 3) -> None:
        self.points = points
        self.k = k
        self.geometry_weight = geometry_weight
        self.by_key = {config_key(p["config"]): p for p in points}

    def distance(self, a: dict, b: dict) -> int:
        a, b = completed(a), completed(b)
        return sum((self.geometry_weight if c in GEOMETRY else 1) for c in a if a[c] != b.get(c))

    def lookup(self, config: dict) -> tuple[float | None, str, bool]:
        """(time in us or None, error, measured?)."""
        p = self.by_key.get(config_key(config))
        if p is not None:
            if p["times_us"]:
                return statistics.median(p["times_us"]), "", True
            return None, p.get("error", "failed"), True
        timed = sorted(((self.distance(q["config"], config), q) for q in self.points if q["times_us"]),
                       key=lambda dq: dq[0])
        if not timed:
            return None, "no recorded neighbour", False
        reach = timed[min(self.k, len(timed)) - 1][0]
        logs = [math.log(statistics.median(q["times_us"])) for d, q in timed if d <= reach]
        return math.exp(sum(logs) / len(logs)), "", False


def dumps(doc: dict) -> str:
    """The landscape as JSON with one recorded configuration per line (readable, diffable)."""
    head = {k: v for k, v in doc.items() if k != "ops"}
    lines = ["{" + json.dumps(head)[1:-1] + ', "ops": {']
    ops = list(doc["ops"].items())
    for i, (op, shapes) in enumerate(ops):
        lines.append(f" {json.dumps(op)}: {{")
        items = list(shapes.items())
        for j, (shape, points) in enumerate(items):
            lines.append(f"  {json.dumps(shape)}: [")
            lines += [f"   {json.dumps(q, sort_keys=True)}{',' if n < len(points) - 1 else ''}" for n, q in enumerate(points)]
            lines.append("  ]" + ("," if j < len(items) - 1 else ""))
        lines.append(" }" + ("," if i < len(ops) - 1 else ""))
    lines.append("}}")
    return "\n".join(lines) + "\n"


def load(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kb", nargs="+", help="knowledge bases to read (opened read-only)")
    ap.add_argument("-o", "--output", required=True, help="the landscape JSON to write")
    ap.add_argument("--add-to", metavar="LANDSCAPE.json",
                    help="keep this landscape's points and add those of the knowledge bases, which must not be "
                         "ones it was gathered from (it may be the output)")
    args = ap.parse_args(argv)
    doc = collect(args.kb, load(args.add_to) if args.add_to else None)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(dumps(doc))
    tmp.replace(out)
    for op, shapes in doc["ops"].items():
        print(op, ", ".join(f"{s}: {len(p)}" for s, p in shapes.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

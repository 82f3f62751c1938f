"""How long parsing and verifying each kernel of kernels/ takes.

    python -m bench.frontend [--repeat 20]

Two numbers per kernel: `cold` is a fresh Python process doing everything a `kfc opt` does
before printing (imports, grammar tables, parse, lower, verify), the median of a few runs;
`warm` is parse + lower + verify again in a process that has done it once (median of
--repeat). The CPU is this machine's; the budget is 0.5 s per kernel.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .provenance import save

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 0.5

COLD = """
import time, sys
t = time.perf_counter()
from kfc.frontend import load_kfc
load_kfc(sys.argv[1])
print(time.perf_counter() - t)
"""


def cold(path: Path, runs: int) -> float:
    times = []
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", COLD, str(path)], capture_output=True, text=True, check=True,
                             cwd=ROOT)
        times.append(float(out.stdout.strip()))
    return statistics.median(times)


def warm(path: Path, repeat: int) -> float:
    from kfc.frontend import load_kfc

    load_kfc(path)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        load_kfc(path)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=20, help="warm repetitions per kernel")
    ap.add_argument("--cold-runs", type=int, default=5, help="fresh processes per kernel")
    args = ap.parse_args(argv)
    rows = []
    for path in sorted((ROOT / "kernels").glob("*.kfc")):
        rel = path.relative_to(ROOT)
        rows.append({"kernel": str(rel), "cold_s": cold(rel, args.cold_runs), "warm_s": warm(path, args.repeat)})
    ok = all(r["cold_s"] < BUDGET_S for r in rows)
    out = save("frontend", {"budget_s": BUDGET_S, "repeat": args.repeat, "cold_runs": args.cold_runs,
                            "rows": rows, "all_under_budget": ok})
    print(f"{'kernel':28} {'cold (s)':>10} {'warm (s)':>10}")
    for r in rows:
        print(f"{r['kernel']:28} {r['cold_s']:10.3f} {r['warm_s']:10.4f}")
    print(f"budget {BUDGET_S} s per kernel, cold: {'all under' if ok else 'OVER'}; saved {out.relative_to(ROOT)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The ops of bench.ops run once each under Nsight Compute, and its CSV read back as one line a
kernel: time, DRAM and SM throughput, occupancy, registers, issue rate and the largest stalls.

    ncu --clock-control none --target-processes all --kernel-name regex:kfc_ \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \\
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio' \\
        --csv --page details --log-file prof.csv python -m bench.profile_ops --ops fp8_quant,router --shapes 32768x4096
    python -m bench.profile_ops --table prof.csv

Each op is called by keyword on its default pipeline, once (its build happens before the launch
ncu profiles). An issue rate near 3-4 instructions a cycle with DRAM well below its peak means a
kernel bound by issue (kfc.passes.row_cost); a low issue rate with long-scoreboard stalls, one
waiting on memory with too little in flight.
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys

from . import ops as bench_ops

STALL = "smsp__average_warps_issue_stalled_"
COLUMNS = (("t_ns", "Duration"), ("dram%", "DRAM Throughput"), ("sm%", "Compute (SM) Throughput"),
           ("occ%", "Achieved Occupancy"), ("regs", "Registers Per Thread"), ("ipc", "Issued Ipc Active"))


def run(names: list[str], shapes: list[tuple[int, int]]) -> None:
    import torch

    import kfc

    for op in bench_ops.select(names):
        kernel = kfc.load(bench_ops.ROOT / op.path, kb=False)
        for m, n in shapes:
            if n > op.max_n:
                continue
            inputs = op.inputs(m, n, torch.bfloat16)
            kernel(**inputs)
            torch.cuda.synchronize()
            print(f"{op.name} {m}x{n}", file=sys.stderr, flush=True)


def table(path: str) -> list[str]:
    """One line a profiled kernel of an ncu `--csv --page details` log."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(line for line in f if not line.startswith("=="))]
    head = {h: i for i, h in enumerate(rows[0])}
    kernels: dict = collections.OrderedDict()
    for r in rows[1:]:
        if len(r) <= head["Metric Value"]:
            continue
        key = (r[head["ID"]], r[head["Kernel Name"]], r[head["Grid Size"]], r[head["Block Size"]])
        kernels.setdefault(key, {})[r[head["Metric Name"]]] = r[head["Metric Value"]].replace(",", "")
    lines = []
    for (_, name, grid, block), m in kernels.items():
        stalls = sorted(((float(v), k[len(STALL):].removesuffix("_per_issue_active.ratio"))
                         for k, v in m.items() if k.startswith(STALL)), reverse=True)[:3]
        cols = " ".join(f"{short}={m.get(full, '?')}" for short, full in COLUMNS)
        lines.append(f"{name[:32]:32s} grid{grid} block{block} {cols} | "
                     + " ".join(f"{k}={v:.1f}" for v, k in stalls))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.profile_ops", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", help="a comma-separated subset of bench.ops (default: all)")
    ap.add_argument("--shapes", default="32768x4096", help="MxN,... (default 32768x4096)")
    ap.add_argument("--table", metavar="CSV", help="print the summary of an ncu CSV log instead")
    args = ap.parse_args(argv)
    if args.table:
        print("\n".join(table(args.table)))
        return 0
    try:
        names = [o.name for o in bench_ops.select(args.ops.split(",") if args.ops else None)]
    except ValueError as e:
        ap.error(str(e))
    run(names, [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")])
    return 0


if __name__ == "__main__":
    sys.exit(main())

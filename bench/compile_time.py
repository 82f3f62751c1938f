"""How long `kfc compile` takes on this machine: end to end in a fresh process (nvcc and ptxas
included), and the IR pipeline alone (parse, specialise, passes, codegen to CUDA C++).

    python -m bench.compile_time [--runs 3]

Budgets: 10 s end to end, 1 s for the IR pipeline (kernels/rmsnorm.kfc).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .provenance import save

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ["rmsnorm", "layernorm", "softmax"]


def end_to_end(kernel: str, target: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as d:
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "kfc.cli", "compile", f"kernels/{kernel}.kfc", "--target", target,
                            "--no-kb", "-o", d], check=True, capture_output=True, cwd=ROOT)
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def pipeline_only(kernel: str, target: str, runs: int) -> float:
    from kfc.codegen.cuda import generate_cuda
    from kfc.compile import choose_dims, fixed_dims
    from kfc.frontend import load_kfc
    from kfc.ir.specialize import specialize
    from kfc.passes import PassContext, PassManager, ROW_PIPELINE, parse_pipeline
    from kfc.model.target import parse_target

    times = []
    for _ in range(runs):
        t = time.perf_counter()
        spec = load_kfc(ROOT / "kernels" / f"{kernel}.kfc")
        dims = fixed_dims(spec.func, choose_dims(spec, None))
        func = specialize(spec.func, dims, partial=True)
        lowered = PassManager(parse_pipeline(ROW_PIPELINE), PassContext(parse_target(target), check=spec.check)).run(func)
        generate_cuda(lowered)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args(argv)
    rows = []
    for k in KERNELS:
        for target in ("sm_90a", "sm_100"):
            rows.append({"kernel": k, "target": target, "end_to_end_s": end_to_end(k, target, args.runs),
                         "pipeline_s": pipeline_only(k, target, max(args.runs, 5))})
    ok = all(r["end_to_end_s"] < 10 and r["pipeline_s"] < 1 for r in rows)
    path = save("compile_time", {"budget": {"end_to_end_s": 10, "pipeline_s": 1}, "rows": rows, "all_within": ok})
    print(f"{'kernel':12} {'target':8} {'end to end (s)':>16} {'IR pipeline (s)':>16}")
    for r in rows:
        print(f"{r['kernel']:12} {r['target']:8} {r['end_to_end_s']:16.2f} {r['pipeline_s']:16.3f}")
    print(f"budgets 10 s / 1 s: {'met' if ok else 'MISSED'}; saved {path.relative_to(ROOT)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

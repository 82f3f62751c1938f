"""Where the gate's time goes for one candidate: correctness checks per case, timing, and the
host cost of one kfc call.

    python -m bench.gate_cost [--op rmsnorm] [--shapes 32768x4096,...]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .shapes import parse_shapes

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="rmsnorm")
    ap.add_argument("--shapes", default="32768x256,32768x4096,32768x65536")
    args = ap.parse_args(argv)

    import torch

    from kfc.compile import row_dims
    from kfc.factory.gate import Gate
    from kfc.factory.problem import gate_cases, op_problem
    from kfc.frontend import load_kfc
    from kfc.runtime.kernel import KfcKernel
    from kfc.model.target import parse_target

    spec = load_kfc(ROOT / "kernels" / f"{args.op}.kfc")
    problem = op_problem(spec)
    k = KfcKernel(spec, parse_target("sm_90a"))
    for m, n in parse_shapes(args.shapes):
        dims = {"M": m, "N": n}
        gate = Gate(problem)
        inputs = problem.make_inputs(dims, 1, 1.0)
        t = time.perf_counter()
        k(*inputs)
        torch.cuda.synchronize()
        first = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(100):
            k(*inputs)
        host = (time.perf_counter() - t) / 100
        torch.cuda.synchronize()
        phases = {}
        for case in gate_cases(spec, dims, row_dims(spec.func)):
            t = time.perf_counter()
            gate.check(k, [case])
            torch.cuda.synchronize()
            phases[case.label] = time.perf_counter() - t
        t = time.perf_counter()
        r = gate.time(k, dims)
        phases["timing"] = time.perf_counter() - t
        t = time.perf_counter()
        problem.make_inputs(dims, 2, 1.0)
        torch.cuda.synchronize()
        phases["one make_inputs"] = time.perf_counter() - t
        print(f"{args.op} {m}x{n}: first call {first:.3f} s, host per call {host * 1e6:.0f} us, kernel "
              f"{r.median_us:.1f} us; " + ", ".join(f"{k_}: {v:.3f} s" for k_, v in phases.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A GPU worker: evaluates candidates through the gate in its own process, so a kernel that
crashes (and poisons its CUDA context) or hangs takes only this process down.

Protocol: one JSON job per line on stdin, one JSON result per line on stdout.

    python -m kfc.factory.worker            # serve jobs
    python -m kfc.factory.worker --once F   # time the job in file F once (a fresh-process re-measure)
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import traceback
from typing import Any

import attrs

from ..check.sandbox import Limits, ReferenceFailed
from ..frontend import load_kfc
from ..model.records import Stage
from ..runtime.kernel import KfcKernel
from .gate import Case, Gate, GateResult, Rejected, time_on_gpu
from .problem import op_problem

_specs: dict[tuple, Any] = {}


def _spec(path: str, dtypes: dict[str, str]):
    key = (path, tuple(sorted(dtypes.items())))
    if key not in _specs:
        _specs[key] = load_kfc(path, dtypes)
    return _specs[key]


def _kernel(job: dict):
    return KfcKernel(_spec(job["kfc"], job["dtypes"]), job["target"], job["pipeline"])


def remeasure_in_fresh_process(job: dict):
    def remeasure(fn, dims) -> GateResult:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(job, f)
        r = subprocess.run([sys.executable, "-m", "kfc.factory.worker", "--once", f.name], capture_output=True,
                           text=True, timeout=job.get("timeout_s", 300))
        try:
            d = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return GateResult(Stage.CORRECT, f"the fresh-process re-measure failed: {r.stderr[-500:]}", "roofline")
        return result_from_dict(d)
    return remeasure


def _limits(job: dict):
    r = job.get("reference")
    return Limits(r["timeout_s"], r["memory_bytes"]) if r else None


def evaluate(job: dict) -> GateResult:
    spec = _spec(job["kfc"], job["dtypes"])
    gate = Gate(op_problem(spec, limits=_limits(job)), seeds=tuple(job.get("seeds", (11, 12, 13))),
                scales=tuple(job.get("scales", (1.0, 40.0))), remeasure=remeasure_in_fresh_process(job))
    cases = [Case(c["dims"], c.get("label", "")) for c in job["cases"]]
    try:
        return gate.evaluate(_kernel(job), cases, job.get("timed"))
    except ReferenceFailed as e:  # the op's reference failed, not the candidate
        return GateResult(Stage.COMPILED, f"the reference failed: {e.message}", "reference")


def time_once(job: dict) -> GateResult:
    spec = _spec(job["kfc"], job["dtypes"])
    gate = Gate(op_problem(spec, limits=_limits(job)))
    try:
        return time_on_gpu(gate, _kernel(job), job["timed"])
    except Rejected as r:
        return GateResult(r.stage, r.message, r.defence)
    except ReferenceFailed as e:
        return GateResult(Stage.COMPILED, f"the reference failed: {e.message}", "reference")


def result_to_dict(r: GateResult) -> dict:
    d = attrs.asdict(r)
    d["stage"] = r.stage.value
    return d


def result_from_dict(d: dict) -> GateResult:
    d = dict(d)
    d["stage"] = Stage(d["stage"])
    d["times_us"] = tuple(d.get("times_us") or ())
    d.pop("id", None)
    return GateResult(**d)


def serve() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            out = result_to_dict(evaluate(job))
        except Exception as e:  # noqa: BLE001 - reported as the candidate's failure
            out = {"stage": Stage.COMPILED.value, "error": f"{type(e).__name__}: {e}", "defence": "worker",
                   "notes": traceback.format_exc()[-2000:]}
        out["id"] = job["id"]
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--once":
        with open(sys.argv[2]) as f:
            job = json.load(f)
        print(json.dumps(result_to_dict(time_once(job))))
        return 0
    serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())

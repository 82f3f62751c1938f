"""Evaluating candidates: compile on the CPU cores (threads driving nvcc, results in the JIT
cache), then gate and time on the GPUs, one worker process per visible GPU. A worker that
exceeds the time limit is restarted and its candidate recorded as a failure. A worker that dies
holding a job is restarted and the job tried once more on the fresh worker (it may have been
killed from outside); only a second death records the candidate as a crash."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import attrs

from ..diagnostics import KfcError
from ..model.spec import OpSpec
from ..passes.base import PassError
from ..passes.pipeline import parse_pipeline
from ..model.target import Target
from .gate import GateResult
from ..model.records import Outcome, Stage
from ..runtime.kernel import cached_compile
from .worker import result_from_dict
from ..compile import row_dims


@attrs.frozen
class Compiled:
    stage: Stage
    error: str = ""
    registers: int | None = None
    spills: int | None = None
    smem_bytes: int | None = None


def compile_candidate(spec: OpSpec, target: Target, pipeline: str, dims_list: list[dict[str, int]]) -> Compiled:
    """Parse, run the passes and build the candidate for every shape it will be checked at."""
    try:
        parse_pipeline(pipeline)
    except PassError as e:
        return Compiled(Stage.PROPOSED, e.message)
    report = None
    for dims in dims_list:
        try:
            _, rep = cached_compile(spec, target, pipeline, dims)
        except KfcError as e:
            msg = e.message.splitlines()[0]
            compiled = "spills" in msg or "nvcc" in msg or "ptxas" in msg or "registers" in msg
            return Compiled(Stage.VERIFIED if compiled else Stage.PARSED, msg)
        report = report or rep
    p = report["ptxas"]
    return Compiled(Stage.COMPILED, "", p["registers"], p["spill_stores"] + p["spill_loads"], p["smem_bytes"])


class WorkerDied(Exception):
    """The worker process ended while it held a job; the message says how."""


class GpuWorker:
    """One `python -m kfc.factory.worker` process bound to one GPU."""

    def __init__(self, gpu: str, timeout_s: float) -> None:
        self.gpu = gpu
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue = queue.Queue()

    def command(self) -> list[str]:
        return [sys.executable, "-m", "kfc.factory.worker"]

    def start(self) -> None:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=self.gpu, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, env=env)
        self.lines = queue.Queue()
        proc, lines = self.proc, self.lines

        def pump():
            for line in proc.stdout:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def exit_description(self) -> str:
        """How the worker ended: its exit status or the signal that killed it. The pipe closes a
        moment before the process is reaped, so this waits for it."""
        try:
            code = self.proc.wait(timeout=30) if self.proc else None
        except subprocess.TimeoutExpired:
            return "closed its output but did not exit"
        if code is not None and code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def run(self, job: dict, retries: int = 0) -> GateResult:
        """The job's result. A worker that dies holding it is restarted, and the job tried up to
        `retries` more times on the fresh worker before it counts as a crash."""
        hows = []
        for _ in range(retries + 1):
            try:
                return self._attempt(job)
            except WorkerDied as e:
                self.stop()
                hows.append(str(e))
        how = hows[0] if len(set(hows)) == 1 else ", then ".join(hows)
        tries = f" ({len(hows)} tries, each on a fresh worker)" if len(hows) > 1 else ""
        return GateResult(Stage.COMPILED, f"crashed: the GPU worker {how}{tries}; restarted", "worker")

    def _attempt(self, job: dict) -> GateResult:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(f"{self.exit_description()} before taking the job") from None
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                return GateResult(Stage.COMPILED, f"hung: no result within {self.timeout_s:.0f} s; the worker was "
                                  "killed and restarted", "worker")
            if line is None:
                raise WorkerDied(self.exit_description())
            try:
                d = json.loads(line)
            except ValueError:
                continue  # stray output from a library: not ours
            if d.get("id") == job["id"]:
                return result_from_dict(d)


class Throughput:
    """Candidates evaluated per minute, from the first one submitted to the last one finished
    (time after the last is not the evaluator's)."""

    def __init__(self) -> None:
        self.evaluated = 0
        self._first: float | None = None
        self._last: float | None = None
        self._lock = threading.Lock()

    def submitted(self) -> None:
        with self._lock:
            if self._first is None:
                self._first = time.monotonic()

    def finished(self) -> None:
        with self._lock:
            self.evaluated += 1
            self._last = time.monotonic()

    @property
    def per_minute(self) -> float | None:
        with self._lock:
            if self._first is None or self._last is None or self._last <= self._first:
                return None
            return 60.0 * self.evaluated / (self._last - self._first)


def make_job(job_id: int, spec: OpSpec, target: Target, pipeline: str, cases: list, timed: dict | None,
             reference_limits=None) -> dict:
    """The job a GPU worker evaluates (kfc.factory.worker's format): plain JSON, the op by its
    .kfc path and dtypes."""
    job = {"id": job_id, "kfc": spec.path, "dtypes": spec.dtypes, "pipeline": pipeline, "target": target.name,
           "cases": [{"dims": c.dims, "label": c.label} for c in cases], "timed": timed}
    if reference_limits is not None:
        job["reference"] = {"timeout_s": reference_limits.timeout_s, "memory_bytes": reference_limits.memory_bytes}
    return job


class Evaluator:
    """Compile in parallel on the CPU, gate on the GPUs in parallel, one job per GPU at a time."""

    def __init__(self, gpus: list[str], compile_workers: int | None = None, timeout_s: float = 300.0,
                 reference_limits=None, worker=GpuWorker) -> None:
        self.reference_limits = reference_limits  # kfc.check.sandbox.Limits for the gate's reference
        self.workers: queue.Queue = queue.Queue()
        for g in gpus:
            self.workers.put(worker(g, timeout_s))
        self.n_gpus = len(gpus)
        self.compile_pool = ThreadPoolExecutor(max_workers=compile_workers or os.cpu_count() or 2)
        self.gpu_pool = ThreadPoolExecutor(max_workers=max(1, len(gpus)))
        self.throughput = Throughput()
        self._ids = 0

    @property
    def candidates_per_minute(self) -> float | None:
        return self.throughput.per_minute

    def gate(self, job: dict) -> GateResult:
        worker = self.workers.get()
        try:
            return worker.run(job, retries=1)
        finally:
            self.workers.put(worker)

    def evaluate(self, spec: OpSpec, target: Target, pipeline: str, cases: list, timed: dict | None) -> Future:
        """A future of (Compiled, GateResult | None)."""
        self._ids += 1
        job_id = self._ids
        self.throughput.submitted()

        def work():
            try:
                compiled = compile_candidate(spec, target, pipeline, distinct_fixed(spec, [c.dims for c in cases]))
                if compiled.stage is not Stage.COMPILED:
                    return compiled, None
                job = make_job(job_id, spec, target, pipeline, cases, timed, self.reference_limits)
                return compiled, self.gpu_pool.submit(self.gate, job).result()
            finally:
                self.throughput.finished()

        return self.compile_pool.submit(work)

    def close(self) -> None:
        while not self.workers.empty():
            self.workers.get().stop()
        self.compile_pool.shutdown(wait=False, cancel_futures=True)
        self.gpu_pool.shutdown(wait=False, cancel_futures=True)


def distinct_fixed(spec: OpSpec, dims_list: list[dict[str, int]]) -> list[dict[str, int]]:
    """One compile per distinct set of fixed dims (the row count does not change the binary)."""
    dynamic = set(row_dims(spec.func))
    seen, out = set(), []
    for d in dims_list:
        key = tuple(sorted((k, v) for k, v in d.items() if k not in dynamic))
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def to_outcome(compiled: Compiled, gated: GateResult | None, baseline: Outcome | None) -> Outcome:
    """The record of a candidate; its speedups over the default pipeline's `baseline` outcome
    of the same run (None for the baseline itself), as timed back to back and eagerly."""
    if gated is None:
        return Outcome(compiled.stage, compiled.error, compiled.registers, compiled.spills, compiled.smem_bytes)

    def over(base: float | None, mine: float | None) -> float | None:
        return base / mine if base and mine else None

    return Outcome(gated.stage, (f"{gated.defence}: " if gated.defence and gated.error else "") + gated.error,
                   compiled.registers, compiled.spills, compiled.smem_bytes, gated.median_us, gated.spread_us,
                   gated.bytes_moved, None, gated.roofline_fraction,
                   over(baseline and baseline.median_us, gated.median_us), gated.times_us, gated.notes,
                   gated.eager_us, over(baseline and baseline.eager_us, gated.eager_us))

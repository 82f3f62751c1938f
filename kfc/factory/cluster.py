"""Evaluating candidates on a Ray cluster: the single-host Evaluator's interface, with compiles
run as Ray tasks on any node's CPUs and gating on Ray actors, one GPU each.

The driver (the `kfc tune` process) stays the only writer of the knowledge base: tasks and
actors get plain job dicts and return results. A compile task ships the kernels it built to
the actor in its reply (the nodes need not share a JIT cache). An actor hosts a GpuWorker
subprocess, so a crashing kernel kills the subprocess, not the actor; an actor that dies (killed,
or its node lost) is replaced and its candidate evaluated again, so nothing is lost.

Every node needs the same kfc installed and the .kfc file at the same absolute path.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import socket
import threading
from concurrent.futures import Future
from typing import Any

from ..diagnostics import KfcError
from ..model.spec import OpSpec
from ..model.target import Target, parse_target
from .evaluate import Compiled, GpuWorker, Throughput, compile_candidate, distinct_fixed, make_job
from .gate import GateResult
from ..model.records import Stage
from ..runtime import cache
from ..runtime.kernel import kernel_cache_key
from .worker import _spec, result_from_dict, result_to_dict

# what one production actor holds: its GPU, and a core for the worker process driving it
GPU_ACTOR_OPTIONS = {"num_gpus": 1, "num_cpus": 1}

# an actor dying this many times on one candidate makes it a crash, not an accident
MAX_ACTOR_DEATHS = 3


def _ray():
    try:
        import ray  # lazy: ray, an optional extra (kfc[cluster])
    except ImportError:
        raise KfcError("kfc tune --ray needs Ray, which is not installed: pip install 'kfc[cluster]'",
                       hint="or tune on this machine's GPUs without --ray") from None
    return ray


def connect(address: str | None = None, local_cpus: int | None = None) -> bool:
    """Join the Ray cluster at `address` ("auto": the one this machine is a node of), or, with
    `local_cpus`, start a private one on this machine. Returns whether this call connected (the
    caller then disconnects); an existing connection is used as it is."""
    ray = _ray()
    if ray.is_initialized():
        return False
    if address is None and local_cpus is None:
        raise KfcError("give a Ray cluster's address (or auto), or local_cpus for a cluster on this machine")
    kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": "warning", "log_to_driver": False}
    if address is not None:
        _check_reachable(address)
    try:
        if address is not None:
            ray.init(address=address, **kwargs)
        else:
            ray.init(num_cpus=local_cpus, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise KfcError(f"could not join the Ray cluster at {address}: {e}",
                       hint="start one with `ray start --head` (and `ray start --address=HEAD:6379` on each GPU "
                            "node), or check the address") from None
    return True


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse, with one message, an address where nothing listens: Ray itself would retry for
    minutes, printing its own logs."""
    if address == "auto":
        return
    rest = address.removeprefix("ray://")
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "")
    default = 10001 if address.startswith("ray://") else 6379  # Ray client server, GCS
    try:
        port_number = int(port) if port else default
    except ValueError:
        raise KfcError(f"bad Ray address {address!r}", hint="write HOST:PORT, ray://HOST:PORT or auto") from None
    try:
        socket.create_connection((host or "127.0.0.1", port_number), timeout=timeout_s).close()
    except OSError as e:
        raise KfcError(f"nothing answers at the Ray address {address} ({e.strerror or e})",
                       hint="start a cluster with `ray start --head` and give its address, or auto on a node of "
                            "one") from None


def compile_task(path: str, dtypes: dict[str, str], target: str, pipeline: str,
                 dims_list: list[dict[str, int]]) -> tuple[Compiled, list[tuple[str, bytes, dict]]]:
    """Compile a candidate on whichever node runs this (a Ray task), and return its JIT cache
    entries with the outcome, for the GPU actor to install."""

    spec, tgt = _spec(path, dtypes), parse_target(target)
    compiled = compile_candidate(spec, tgt, pipeline, dims_list)
    entries = []
    if compiled.stage is Stage.COMPILED:
        for dims in dims_list:
            key = kernel_cache_key(spec, tgt, pipeline, dims)
            hit = cache.lookup(key)
            if hit is not None:
                entries.append((key, *hit))
    return compiled, entries


class GpuActor:
    """A Ray actor on one GPU, hosting a GpuWorker subprocess there (Ray sets the actor's
    CUDA_VISIBLE_DEVICES to the GPU it was given)."""

    def __init__(self, timeout_s: float) -> None:
        self.worker = GpuWorker(os.environ.get("CUDA_VISIBLE_DEVICES", ""), timeout_s)

    def run(self, job: dict, entries: list[tuple[str, bytes, dict]]) -> dict:
        for key, cubin, report in entries:
            if cache.lookup(key) is None:
                cache.store(key, cubin, report)
        return result_to_dict(self.gate(job))

    def gate(self, job: dict) -> GateResult:
        return self.worker.run(job, retries=1)  # as on a single host: a second death is the kernel's


class RayEvaluator:
    """Evaluator's interface (`evaluate`, `close`, `n_gpus`) over a Ray cluster."""

    def __init__(self, address: str | None = None, *, local_cpus: int | None = None, actors: int | None = None,
                 actor_class: type = GpuActor, actor_options: dict | None = None, timeout_s: float = 300.0,
                 reference_limits=None) -> None:
        ray = self._ray = _ray()
        self._owns_connection = connect(address, local_cpus)
        try:
            n = actors if actors is not None else int(ray.cluster_resources().get("GPU", 0))
            if n < 1:
                raise KfcError(f"the Ray cluster at {address or 'this machine'} has no GPUs",
                               hint="start its GPU nodes with `ray start --address=HEAD:6379` on machines with GPUs")
        except BaseException:
            self._disconnect()
            raise
        self.n_gpus = n
        self.reference_limits = reference_limits
        self.throughput = Throughput()
        self.actors_replaced = 0
        self._lock = threading.Lock()
        self._remote_actor = ray.remote(**(actor_options or GPU_ACTOR_OPTIONS))(actor_class)
        self._timeout_s = timeout_s
        self._compile = ray.remote(num_cpus=1, max_retries=3)(compile_task)  # retried where a node is lost
        # (priority, seq, item): a re-queued candidate goes before new ones, a stop before all
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._seq = itertools.count()
        self._closed = False
        self._actors = [self._new_actor() for _ in range(n)]
        self._threads = [threading.Thread(target=self._serve, args=(i,), daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    @property
    def candidates_per_minute(self) -> float | None:
        return self.throughput.per_minute

    def _new_actor(self):
        return self._remote_actor.remote(self._timeout_s)

    def evaluate(self, spec: OpSpec, target: Target, pipeline: str, cases: list, timed: dict | None) -> Future:
        """A future of (Compiled, GateResult | None)."""
        out: Future = Future()
        self.throughput.submitted()
        job = make_job(next(self._seq), spec, target, pipeline, cases, timed, self.reference_limits)
        job["kfc"] = os.path.abspath(spec.path)  # a Ray worker's working directory is not ours
        dims_list = distinct_fixed(spec, [c.dims for c in cases])
        ref = self._compile.remote(job["kfc"], job["dtypes"], target.name, pipeline, dims_list)

        def compiled(f: Future) -> None:
            try:
                c, entries = f.result()
            except BaseException as e:  # noqa: BLE001 - the tune loop raises it, as with a local compile
                self._finish(out, exception=e)
                return
            if c.stage is not Stage.COMPILED:
                self._finish(out, (c, None))
            else:
                self._jobs.put((1, next(self._seq), (job, entries, c, out, 0)))

        ref.future().add_done_callback(compiled)
        return out

    def _finish(self, out: Future, result=None, exception: BaseException | None = None) -> None:
        if out.done():  # cancelled by close()
            return
        self.throughput.finished()  # before the result: whoever waits on it sees the count
        if exception is not None:
            out.set_exception(exception)
        else:
            out.set_result(result)

    def _serve(self, slot: int) -> None:
        """Feed one actor, a job at a time; replace it when it dies."""
        ray = self._ray
        # the actor is gone (ActorDiedError is a RayActorError); the last two are newer than Ray 2.9
        lost = tuple(getattr(ray.exceptions, n) for n in ("RayActorError", "ActorUnavailableError", "NodeDiedError")
                     if hasattr(ray.exceptions, n))
        while True:
            _, _, item = self._jobs.get()
            if item is None or self._closed:
                return
            job, entries, compiled, out, deaths = item
            try:
                d = ray.get(self._actors[slot].run.remote(job, entries))
            except lost as e:
                if self._closed:
                    return
                self._replace(slot)
                if deaths + 1 >= MAX_ACTOR_DEATHS:
                    self._finish(out, (compiled, GateResult(
                        Stage.COMPILED, f"crashed: the Ray actor gating it died {deaths + 1} times, last: "
                        f"{type(e).__name__}", "worker")))
                else:  # killed, or its node lost: evaluated again, on the next free actor
                    self._jobs.put((0, next(self._seq), (job, entries, compiled, out, deaths + 1)))
                continue
            except ray.exceptions.RayTaskError as e:  # the actor's code raised: the candidate's failure
                self._finish(out, (compiled, GateResult(Stage.COMPILED, f"the GPU actor failed: {e.cause!r}",
                                                        "worker")))
                continue
            except BaseException as e:  # noqa: BLE001 - never leave the tune loop waiting
                self._finish(out, exception=e)
                continue
            self._finish(out, (compiled, result_from_dict(d)))

    def _replace(self, slot: int) -> None:
        with contextlib.suppress(Exception):  # already gone
            self._ray.kill(self._actors[slot], no_restart=True)
        self._actors[slot] = self._new_actor()
        with self._lock:
            self.actors_replaced += 1

    def close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._jobs.put((-1, next(self._seq), None))
        for a in self._actors:
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(a, no_restart=True)
        for t in self._threads:
            t.join(timeout=10)
        while True:  # candidates never gated: cancelled, as the single-host pools cancel theirs
            try:
                _, _, item = self._jobs.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[3].cancel()
        self._disconnect()

    def _disconnect(self) -> None:
        if self._owns_connection:
            self._ray.shutdown()
            self._owns_connection = False

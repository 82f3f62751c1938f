"""The evaluation gate: nothing unproven reaches the knowledge base.

A candidate is any callable `fn(*inputs, out=outputs)` that must write its results into the
given output tensors. It is rejected unless every defence holds:

  written       outputs poisoned with NaN before each call are fully and correctly written,
                for fresh random inputs of several seeds and value ranges (one of each for a
                case moving over 256 MB) (a call that returns results cached from an earlier
                call fails here: each call gets new inputs)
  shapes        ... for the shapes it is tuned on and for unseen, odd ones (N not a multiple of
                8, M = 1, one huge row)
  inputs        inputs are bit-for-bit unchanged after the call
  deterministic the same inputs twice give bit-identical outputs (uninitialised reads do not)
  timed         on the GPU, timed by CUDA events after a full device sync, over input sets
                rotated beyond L2, median and spread; the outputs of the timed calls are
                checked again; work that escapes the timed stream shows up as event time far
                below the wall-clock time between device syncs and is rejected
  roofline      a time faster than moving the bytes at the measured copy bandwidth is
                re-measured in a fresh process, and rejected if it holds

Each defence has a test with a planted cheat that it catches (tests/test_gate.py, and
tests/gpu/test_gate_gpu.py for the two that need a GPU).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Sequence

import attrs

from ..model.records import Stage
from ..check.tolerance import compare_arrays

COPY_BANDWIDTH = 4.25e12  # bytes/s read + written: the H200's device-to-device copy, measured
ROOFLINE_SLACK = 0.97     # a time under 97% of the roofline cannot be real
ESCAPE_RATIO = 0.5        # events under half the synced wall-clock: work escaped the stream
SMALL_CASE_BYTES = 256 << 20  # cases moving more are checked with one seed and one value range


class Rejected(Exception):
    """A defence failed: `stage` is the last stage passed, `defence` which one failed."""

    def __init__(self, defence: str, message: str, stage: Stage) -> None:
        super().__init__(f"{defence}: {message}")
        self.defence = defence
        self.message = message
        self.stage = stage


@attrs.frozen
class Case:
    """One shape to check, as dims, with how to draw inputs at it."""

    dims: dict[str, int]
    label: str = ""


@attrs.frozen
class GateResult:
    stage: Stage
    error: str = ""
    defence: str = ""
    median_us: float | None = None
    spread_us: float | None = None
    times_us: tuple[float, ...] = ()
    bytes_moved: int | None = None
    roofline_fraction: float | None = None
    notes: str = ""
    eager_us: float | None = None  # one call at a time, L2 flushed before each (time_eagerly)


@attrs.define
class Problem:
    """What the gate needs to know about the op: how to draw inputs and outputs, the reference,
    the tolerances, and how many bytes a call must move."""

    make_inputs: Callable[[dict[str, int], int, float], tuple]  # (dims, seed, scale) -> inputs
    make_outputs: Callable[[dict[str, int]], tuple]              # dims -> NaN-poisoned outputs
    reference: Callable[..., tuple]                               # inputs -> outputs (float64/32)
    tolerance: Callable[[Any], float]                             # output tensor -> relative tolerance
    bytes_moved: Callable[[dict[str, int]], int]


def _tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def compare(out, ref, tol: float) -> str | None:
    """None when `out` matches `ref` by the rule of kfc.check.tolerance; else what is wrong."""
    import torch  # lazy: torch (~3 s); the tune parent imports this module and never loads torch

    # fp32 is exact enough for tolerances of 1e-6 and up, and halves the memory of a huge check
    wide = torch.float64 if tol < 1e-6 else torch.float32
    o = out.detach().to(wide)
    c = compare_arrays(o, ref.detach().to(device=o.device, dtype=wide), tol)
    if c.ok:
        return None
    if c.shape_mismatch:
        return c.shape_mismatch
    if c.unwritten:
        return f"{c.unwritten} element(s) unwritten or not finite"
    if c.special_mismatch:
        return f"{c.special_mismatch} element(s) differ where the reference is NaN or inf"
    if tol == 0.0:
        return "integers differ"
    return f"wrong results: relative RMSE {c.rel_rmse:.3g}, {c.beyond} element(s) beyond tolerance {tol:g}"


class Gate:
    def __init__(self, problem: Problem, seeds: Sequence[int] = (11, 12, 13), scales: Sequence[float] = (1.0, 40.0),
                 timer: Callable | None = None, remeasure: Callable | None = None,
                 copy_bandwidth: float = COPY_BANDWIDTH) -> None:
        self.p = problem
        self.seeds = tuple(seeds)
        self.scales = tuple(scales)
        self.timer = timer or time_on_gpu
        self.remeasure = remeasure
        self.copy_bandwidth = copy_bandwidth

    # --- correctness ----------------------------------------------------------------------
    def call(self, fn: Callable, inputs: tuple, dims: dict[str, int]) -> tuple:
        outs = self.p.make_outputs(dims)
        got = _tuple(fn(*inputs, out=outs if len(outs) > 1 else outs[0]))
        if len(got) != len(outs) or any(g.data_ptr() != o.data_ptr() for g, o in zip(got, outs)):
            raise Rejected("written", "the candidate did not return the output tensors it was given", Stage.COMPILED)
        return outs

    def check(self, fn: Callable, cases: Sequence[Case]) -> None:
        """Every correctness defence; raises Rejected on the first failure."""
        import torch  # lazy: torch (~3 s); the tune parent imports this module and never loads torch

        for case in cases:
            where = f" at {case.label or case.dims}"
            # every seed and value range where a case is small; one of each where it is huge
            small = self.p.bytes_moved(case.dims) <= SMALL_CASE_BYTES
            for seed in self.seeds if small else self.seeds[:1]:
                for scale in self.scales if small else self.scales[:1]:
                    inputs = self.p.make_inputs(case.dims, seed, scale)
                    before = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
                    try:
                        outs = self.call(fn, inputs, case.dims)
                        _sync(inputs)
                    except Rejected:
                        raise
                    except Exception as e:  # noqa: BLE001 - a crashing candidate is a rejected one
                        raise Rejected("written", f"the call failed{where}: {type(e).__name__}: {e}",
                                       Stage.COMPILED) from None
                    for i, (a, b) in enumerate(zip(inputs, before)):
                        same = isinstance(a, torch.Tensor) and (torch.equal(a, b) or bool(
                            ((a == b) | (a.isnan() & b.isnan())).all()))
                        if isinstance(a, torch.Tensor) and not same:
                            raise Rejected("inputs", f"input {i} was modified{where}", Stage.COMPILED)
                    refs = _tuple(self.p.reference(*before))
                    for i, (o, r) in enumerate(zip(outs, refs)):
                        problem = compare(o, r, self.p.tolerance(o))
                        if problem:
                            defence = "shapes" if case.label.startswith("unseen") else "written"
                            raise Rejected(defence, f"output {i}{where}, seed {seed}, scale {scale:g}: {problem}",
                                           Stage.COMPILED)
            # the same inputs twice: bit-identical outputs
            inputs = self.p.make_inputs(case.dims, self.seeds[0], self.scales[0])
            first = [o.clone() for o in self.call(fn, inputs, case.dims)]
            second = self.call(fn, inputs, case.dims)
            _sync(inputs)
            for i, (a, b) in enumerate(zip(first, second)):
                same = torch.equal(a, b) or bool(((a == b) | (a.isnan() & b.isnan())).all())
                if not same:
                    raise Rejected("deterministic", f"output {i}{where} differs between two calls on the same "
                                   "inputs (uninitialised memory, or a race)", Stage.COMPILED)

    # --- timing -----------------------------------------------------------------------------
    def time(self, fn: Callable, dims: dict[str, int]) -> GateResult:
        nbytes = self.p.bytes_moved(dims)
        floor_us = nbytes / self.copy_bandwidth * 1e6
        result = self.timer(self, fn, dims)
        if result.stage is not Stage.TIMED:
            return result
        if result.median_us < ROOFLINE_SLACK * floor_us:
            again = self.remeasure(fn, dims) if self.remeasure is not None else result
            if again.stage is not Stage.TIMED or again.median_us < ROOFLINE_SLACK * floor_us:
                raise Rejected("roofline", f"{result.median_us:.2f} us to move {nbytes} bytes is faster than the "
                               f"memory roofline ({floor_us:.2f} us at {self.copy_bandwidth / 1e12:.2f} TB/s), "
                               "also when re-measured in a fresh process", Stage.CORRECT)
            result = again
        return attrs.evolve(result, bytes_moved=nbytes, roofline_fraction=floor_us / result.median_us)

    def evaluate(self, fn: Callable, cases: Sequence[Case], timed: dict[str, int] | None) -> GateResult:
        try:
            self.check(fn, cases)
            if timed is None:
                return GateResult(Stage.CORRECT)
            return self.time(fn, timed)
        except Rejected as r:
            return GateResult(r.stage, r.message, r.defence)


def _sync(inputs) -> None:
    import torch  # lazy: torch (~3 s); the tune parent imports this module and never loads torch

    if any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs):
        torch.cuda.synchronize()


# --- GPU timing -----------------------------------------------------------------------------

L2_BYTES = 60 * 1024 * 1024
# A timed replay runs the rotation's calls as many times as make at least this long on the GPU:
# each replay starts after a device sync, so a short one (one 256 MB row kernel of 180 us, or two
# calls of a 50 us skinny GEMM) would also time the graph's launch and the idle GPU's start
# (a kfc rmsnorm timed 217 us a call in a one-call replay and 184 us eagerly on an H100)
MIN_REPLAY_US = 1000.0
MAX_REPLAY_CALLS = 512  # a call of 2 us: 1 ms; a candidate whose work escapes the timed stream stays cheap
# Calls timed one at a time, as a user makes them (the benchmarks' headline: triton's do_bench).
# A pipeline faster back to back in a graph can be slower this way (kfc.kb.advice), so both
# figures are recorded.
EAGER_CALLS = 20


def time_eagerly(fn: Callable, sets: list, outs: list, calls: int = EAGER_CALLS) -> float:
    """The median time of `calls` calls, each after L2 is flushed by writing four times its size
    (the flush stays outside the events), the inputs rotating; microseconds."""
    import torch  # lazy: torch (~3 s); the tune parent imports this module and never loads torch

    flush = torch.empty(4 * L2_BYTES, dtype=torch.uint8, device="cuda")
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for i, (start, end) in enumerate(events):
        args, o = sets[i % len(sets)], outs[i % len(outs)]
        flush.zero_()
        start.record()
        fn(*args, out=o if len(o) > 1 else o[0])
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in events)


def time_on_gpu(gate: Gate, fn: Callable, dims: dict[str, int], replays: int = 10) -> GateResult:
    """CUDA events around a CUDA graph of calls over rotating inputs, repeated to at least
    MIN_REPLAY_US a replay (a loop when the candidate cannot be captured), after a full device
    sync; a wall-clock cross-check between device syncs; the timed calls' outputs checked
    afterwards."""
    import torch  # lazy: torch (~3 s); the tune parent imports this module and never loads torch

    nbytes = gate.p.bytes_moved(dims)
    rotation = max(1, min(32, math.ceil(4 * L2_BYTES / max(nbytes, 1))))
    sets = [gate.p.make_inputs(dims, 1000 + i, 1.0) for i in range(rotation)]
    outs = [gate.p.make_outputs(dims) for _ in range(rotation)]

    def batch():
        for args, o in zip(sets, outs):
            fn(*args, out=o if len(o) > 1 else o[0])

    batch()
    torch.cuda.synchronize()
    repeats = replay_repeats(batch, rotation)

    def timed():
        for _ in range(repeats):
            batch()

    graph = None
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            timed()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            timed()
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - not capturable: time a loop instead
        graph = None
        torch.cuda.synchronize()
    # a loop (a candidate that cannot be captured) runs one batch a timed run, as before: its many
    # launches would fill the queue and hide work escaping the timed stream from the wall clock
    run = graph.replay if graph is not None else batch
    calls = rotation * repeats if graph is not None else rotation
    event_us, wall_us = [], []
    for _ in range(replays):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        w0 = time.perf_counter()
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()  # every stream: work launched elsewhere is waited for here
        wall_us.append((time.perf_counter() - w0) * 1e6 / calls)
        event_us.append(start.elapsed_time(end) * 1e3 / calls)
    med = statistics.median(event_us)
    wall = statistics.median(wall_us)
    if graph is None and med < ESCAPE_RATIO * wall and wall > 20:
        raise Rejected("timed", f"the timed stream saw {med:.1f} us per call but the device was busy for "
                       f"{wall:.1f} us: work ran outside the timed stream", Stage.CORRECT)
    for args, o in zip(sets, outs):
        refs = _tuple(gate.p.reference(*args))
        for i, (a, r) in enumerate(zip(o, refs)):
            problem = compare(a, r, gate.p.tolerance(a))
            if problem:
                raise Rejected("timed", f"output {i} of a timed call: {problem}", Stage.CORRECT)
    q = statistics.quantiles(event_us, n=10) if len(event_us) > 1 else [med] * 9
    return GateResult(Stage.TIMED, median_us=med, spread_us=q[-1] - q[0], times_us=tuple(event_us),
                      notes=f"{'graph' if graph is not None else 'loop'} of {calls} calls",
                      eager_us=time_eagerly(fn, sets, outs))


def replay_repeats(batch: Callable, rotation: int) -> int:
    """How many times a timed replay runs the rotation's calls: enough for MIN_REPLAY_US of work
    by one batch timed after a sync (an overestimate of its time, so never too many)."""
    import torch  # lazy: torch (~3 s); the tune parent imports this module and never loads torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    batch()
    end.record()
    torch.cuda.synchronize()
    return repeats_for(start.elapsed_time(end) * 1e3, rotation)


def repeats_for(batch_us: float, rotation: int) -> int:
    """The repeats of a batch of `rotation` calls taking `batch_us` that make MIN_REPLAY_US, within
    MAX_REPLAY_CALLS calls a replay (and at least one batch)."""
    wanted = math.ceil(MIN_REPLAY_US / max(batch_us, 1.0))
    return max(1, min(MAX_REPLAY_CALLS // rotation, wanted))

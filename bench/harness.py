"""Timing row ops against their peers on one GPU, in one run, the same way for everyone.

For each shape: fresh random inputs (never zeros); every contender's output checked against
the fp32 reference before timing (a wrong contender is reported, not timed); then two timings:
eagerly, as a user calling the op sees it (triton.testing.do_bench: L2 flushed before every
call; the headline figure), and the kernel alone, by CUDA graph replay of back-to-back calls
that rotate through enough input sets to exceed the L2 cache, bracketed by CUDA events after a
full device sync (the median of several replays and its spread). The outputs of the timed
calls are checked again afterwards. Bandwidth counts each input read once and each output
written once.
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import attrs

L2_BYTES = 60 * 1024 * 1024
TARGET_BYTES_PER_GRAPH = 4 * L2_BYTES


@attrs.define
class Contender:
    name: str
    make: Callable[[], Callable]  # returns fn(*inputs) -> output; may raise ImportError
    note: str = ""


@attrs.define
class Measurement:
    contender: str
    ok: bool
    median_us: float = math.nan
    p10_us: float = math.nan
    p90_us: float = math.nan
    tbps: float = math.nan
    error: str = ""
    eager_us: float = math.nan    # triton.testing.do_bench: L2 flushed before each call, as a user calls it
    eager_tbps: float = math.nan


def wrong(out, ref, tol: float) -> str:
    """What is wrong with a contender's output by kfc's tolerance rule ("" when it matches); an
    op of several outputs is checked output by output."""
    from kfc.check.tolerance import compare_arrays

    if isinstance(ref, (tuple, list)):
        if not isinstance(out, (tuple, list)) or len(out) != len(ref):
            return f"{len(ref)} outputs expected"
        problems = [f"output {i}: {p}" for i, (o, r) in enumerate(zip(out, ref)) if (p := wrong(o, r, tol))]
        return "; ".join(problems)
    c = compare_arrays(out.float(), ref.float(), tol)
    return "" if c.ok else f"rel RMSE {c.rel_rmse:.3g}, worst {c.worst:.3g}, {c.unwritten} not finite"


def time_graph(fn: Callable, arg_sets: list[tuple], replays: int = 10) -> tuple[list[float], list[Any]]:
    """Per-call times (us) of graph replays of len(arg_sets) calls, and the calls' outputs."""
    import torch

    outs: list[Any] = []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside capture: compile, autotune, allocate
        for args in arg_sets[:2]:
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in arg_sets:
            outs.append(fn(*args))
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(arg_sets))
    return times, outs


def time_loop(fn: Callable, arg_sets: list[tuple], replays: int = 10) -> tuple[list[float], list[Any]]:
    """The same without a graph, for contenders that cannot be captured."""
    import torch

    for args in arg_sets[:2]:
        fn(*args)
    torch.cuda.synchronize()
    times, outs = [], []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        outs = [fn(*args) for args in arg_sets]
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(arg_sets))
    return times, outs


def prebuild(jobs: list[tuple[Any, list[dict[str, int]]]], out=None) -> None:
    """Build every (kfc kernel, [dims, ...]) job's kernels into the JIT cache before anything is
    timed, all at once (KfcKernel.prebuild): the GPU would otherwise idle through each nvcc run
    of the timed loop. A kernel that cannot be built fails again, with its message, at its first
    call there."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
        problems = sum(pool.map(lambda job: job[0].prebuild(job[1]), jobs), [])
    print(f"prebuilt {sum(len(shapes) for _, shapes in jobs)} kernel(s) in {time.perf_counter() - started:.1f} s"
          + "".join(f"\n  not built: {p}" for p in problems), file=out or sys.stderr, flush=True)


def time_eager(fn: Callable, args: tuple) -> float:
    """Median time (us) of one call as a user makes it: triton.testing.do_bench, which flushes
    the L2 cache before every call and times each call between CUDA events, host time included
    where the GPU outruns the host."""
    from triton.testing import do_bench

    return do_bench(lambda: fn(*args), warmup=25, rep=100, return_mode="median") * 1e3


def eager_and_graph(fn: Callable, nbytes: int) -> dict[str, float]:
    """A call timed both ways the benchmarks report, with the bandwidth each implies: eager
    (time_eager) and the kernel alone (triton's do_bench_cudagraph median)."""
    from triton.testing import do_bench_cudagraph

    r = {"eager_us": time_eager(fn, ()), "graph_us": do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3}
    r["eager_gbs"] = nbytes / (r["eager_us"] * 1e-6) / 1e9
    r["graph_gbs"] = nbytes / (r["graph_us"] * 1e-6) / 1e9
    return r


def failed(e: Exception) -> dict[str, Any]:
    """A contender's failure as a result row: its type and the first line of its message."""
    return {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}


def measure(c: Contender, fn: Callable, arg_sets: list[tuple], reference: Callable, tol: float,
            bytes_per_call: int) -> Measurement:
    import torch

    try:
        first = fn(*arg_sets[0])
        torch.cuda.synchronize()
        problem = wrong(first, reference(*arg_sets[0]), tol)
        if problem:
            return Measurement(c.name, False, error=f"wrong before timing: {problem}")
        try:
            times, outs = time_graph(fn, arg_sets)
            how = "graph"
        except Exception:  # noqa: BLE001 - some peers cannot be captured; time them in a loop
            torch.cuda.synchronize()
            times, outs = time_loop(fn, arg_sets)
            how = "loop"
        for args, out in zip(arg_sets, outs):
            problem = wrong(out, reference(*args), tol)
            if problem:
                return Measurement(c.name, False, error=f"timed outputs wrong: {problem}")
        med = statistics.median(times)
        q = statistics.quantiles(times, n=10) if len(times) >= 2 else [med] * 9
        eager = time_eager(fn, arg_sets[0])
        return Measurement(c.name, True, med, q[0], q[-1], bytes_per_call / (med * 1e-6) / 1e12,
                           error="" if how == "graph" else "timed in a loop (graph capture failed)",
                           eager_us=eager, eager_tbps=bytes_per_call / (eager * 1e-6) / 1e12)
    except Exception as e:  # noqa: BLE001 - a failing peer is a result, not a crash
        return Measurement(c.name, False, error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")


def rotation(bytes_per_call: int) -> int:
    """How many input sets one graph cycles through so that its calls exceed the L2 cache."""
    return max(1, min(64, math.ceil(TARGET_BYTES_PER_GRAPH / max(bytes_per_call, 1))))


def provenance(peers: list[str]) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cuda": torch.version.cuda}
    try:
        info["gpu"] = torch.cuda.get_device_name()
        info["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
    except Exception:  # noqa: BLE001
        pass
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    for pkg in ["triton", *peers]:
        try:
            info[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            info[pkg] = None
    return info


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def print_table(title: str, shapes: list[tuple[int, int]], names: list[str], rows: dict) -> None:
    """TB/s per shape and contender: eager (the headline) / CUDA graph."""
    print(f"\n{title}, eager / graph")
    head = f"{'M x N':>16} " + " ".join(f"{n:>15}" for n in names)
    print(head)
    for shape in shapes:
        cells = []
        for n in names:
            m = rows[shape].get(n)
            cells.append(f"{m.eager_tbps:7.2f}/{m.tbps:<7.2f}" if m is not None and m.ok
                         else f"{'fail':>15}" if m else f"{'-':>15}")
        print(f"{shape[0]:>7} x {shape[1]:<7} " + " ".join(cells))


def safe(make: Callable) -> Callable | str:
    try:
        return make()
    except Exception as e:  # noqa: BLE001
        return f"unavailable: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"

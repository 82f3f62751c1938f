"""Running a `.kfc` file's reference: Python code, run with the user's rights as a test file is,
but never in kfc's own process.

The reference runs in a child process (kfc.check.reference_child) with a wall-clock time limit
per call, a memory limit, an environment without secrets (API keys, tokens, passwords) and a
scratch working directory that is removed afterwards. Inputs travel as raw bytes through a pipe
(on the GPU: as CUDA IPC handles, so nothing is copied), results come back as raw bytes or are
written into buffers kfc shared. Whatever the reference does — raise, call exit, die by a
signal, run forever, exhaust memory, return None or the wrong outputs — kfc reports it as one
clear error at the `reference` line, and the next call starts a fresh child.

Only `kfc check` and the tune gate run references; `kfc compile` and `kfc opt` never do.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import attrs

from ..diagnostics import KfcError, Span
from .descendants import kill_descendants
from .wire import WireClosed, recv, send

DEFAULT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 180.0   # importing torch (and starting CUDA) on a cold, busy machine
# names of environment variables a reference has no business reading
SECRET = re.compile(r"(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|COOKIE|SESSION|AUTH)", re.IGNORECASE)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - every Linux has both
        return 16 << 30


def default_memory_bytes() -> int:
    """Half the machine's memory: a reference may be large (a full-size check), not unbounded."""
    return max(1 << 30, _physical_memory() // 2)


@attrs.frozen
class Limits:
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_bytes: int = attrs.Factory(default_memory_bytes)

    def __attrs_post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise KfcError(f"the reference time limit must be positive, not {self.timeout_s:g} s",
                           hint="e.g. --reference-timeout 120")
        if self.memory_bytes < (64 << 20):
            raise KfcError(f"the reference memory limit must be at least 64 MiB, not {self.memory_bytes} bytes",
                           hint="e.g. --reference-memory 8 (GiB)")


class ReferenceFailed(KfcError):
    """The reference failed: the message says how, the span is its `reference =` line."""


def child_environment(scratch: str, sys_path: list[str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not SECRET.search(k)}
    env.update(TMPDIR=scratch, PYTHONPATH=os.pathsep.join(sys_path), PYTHONUNBUFFERED="1",
               PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONSTARTUP", None)
    return env


def _absolute_sys_path() -> list[str]:
    """The parent's import path with relative entries made absolute (the child runs elsewhere)."""
    out = []
    for p in [os.getcwd()] + sys.path:
        a = os.path.abspath(p or ".")
        if a not in out and os.path.isdir(a):
            out.append(a)
    return out


def _rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Stop(Exception):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


class ReferenceSandbox:
    """One child process serving reference calls on `device` ("cpu" or "cuda"); restarted
    after any failure. Use `call`; `close` (or interpreter exit) ends it and its scratch dir."""

    def __init__(self, limits: Limits | None = None, device: str = "cpu") -> None:
        self.limits = limits or Limits()
        self.device = device
        self.proc: subprocess.Popen | None = None
        self.scratch: str | None = None
        self.stderr_path: str | None = None
        self.ready = False
        self.baseline_rss = 0
        self.lock = threading.RLock()
        atexit.register(self.close)

    # --- the child ----------------------------------------------------------------------------
    def warm(self) -> None:
        """Start the child now, without waiting for it: its imports overlap the caller's work."""
        if self.proc is None or self.proc.poll() is not None:
            self._kill()
            self._spawn()

    def _spawn(self) -> None:
        self.scratch = tempfile.mkdtemp(prefix="kfc-reference-")
        self.stderr_path = os.path.join(self.scratch, ".stderr")
        self.sys_path = _absolute_sys_path()
        config = {"device": self.device, "memory_bytes": self.limits.memory_bytes}
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kfc.check.reference_child", json.dumps(config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=self.scratch,
                env=child_environment(self.scratch, self.sys_path), start_new_session=True)
        self.ready = False

    def _await_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            header, _ = recv(self.proc.stdout.fileno(), self._watch(deadline, memory=False))
        except (WireClosed, _Stop) as e:
            why = self._why(e)
            self._kill()
            raise KfcError(f"the process that runs references did not start: {why}",
                           hint="check that torch imports in this Python environment") from None
        if not header.get("ready"):
            self._kill()
            raise KfcError("the process that runs references did not start: it answered out of turn")
        self.baseline_rss = _rss_bytes(self.proc.pid)
        self.ready = True

    def _watch(self, deadline: float, memory: bool = True):
        """A poll for recv: the child's exit, the deadline, and (once it is ready) its memory
        beyond what it held at its start (torch's import is not the reference's)."""
        def poll() -> None:
            if self.proc.poll() is not None:
                raise _Stop("exited")
            if time.monotonic() > deadline:
                raise _Stop("timeout")
            if memory and _rss_bytes(self.proc.pid) > self.baseline_rss + self.limits.memory_bytes:
                raise _Stop("memory")
        return poll

    def _why(self, e: Exception) -> str:
        kind = e.kind if isinstance(e, _Stop) else "exited"
        if kind == "timeout":
            return "timeout"
        if kind == "memory":
            return "memory"
        rc = self._returncode()
        tail = self._stderr_tail()
        if rc is not None and rc < 0:
            try:
                name = signal.Signals(-rc).name
            except ValueError:
                name = f"signal {-rc}"
            return f"signal {name}" + (f"; its last output: {tail}" if tail else "")
        return f"status {rc}" + (f"; its last output: {tail}" if tail else "")

    def _returncode(self) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def _stderr_tail(self, lines: int = 3) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4000))
                text = f.read().decode(errors="replace")
        except (OSError, TypeError):
            return ""
        kept = [ln.strip() for ln in text.splitlines() if ln.strip()][-lines:]
        return " | ".join(kept)

    def _kill(self) -> None:
        if self.proc is not None:
            kill_descendants(self.proc.pid)  # the reference's processes, detached ones too (its subreaper)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait long
                pass
            for pipe in (self.proc.stdin, self.proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
        self.proc = None
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch = None

    def close(self) -> None:
        """End the child: it leaves on its own when its input closes (releasing what it mapped
        through CUDA IPC while kfc still holds it), else it is killed."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        if self.device == "cuda" and "torch" in sys.modules:
            import torch  # lazy: torch (~3 s), imported already when a GPU reference ran

            torch.cuda.ipc_collect()  # the child is gone: nothing it mapped is held any more

    # --- a call -------------------------------------------------------------------------------
    def call(self, reference: str, is_function: bool, span: Span | None, inputs: list[tuple[str, str, Any]],
             dims: dict[str, int], outputs: list[tuple[str, tuple[int, ...]]]):
        """Run the reference on `inputs` ((name, kind, value): kind "tensor" for numpy arrays or
        torch tensors, "scalar", "absent") at `dims`; return one result per output (float64
        numpy arrays on the CPU; float32 tensors on the inputs' GPU for device "cuda")."""
        with self.lock:  # one request at a time on the child's pipes
            return self._call(reference, is_function, span, inputs, dims, outputs)

    def _call(self, reference, is_function, span, inputs, dims, outputs):
        self.warm()
        if not self.ready:
            self._await_ready()
        header, blobs, keep, buffers = self._request(reference, is_function, inputs, dims, outputs)
        fd_in, fd_out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        try:
            send(fd_in, header, blobs)
            answer, data = recv(fd_out, self._watch(time.monotonic() + self.limits.timeout_s))
        except (WireClosed, BrokenPipeError, _Stop) as e:
            why = self._why(e)
            self._kill()
            raise self._failure(why, span) from None
        finally:
            del keep
        if self.device == "cuda":
            import torch  # lazy: torch (~3 s), only a reference run on the GPU needs it

            torch.cuda.ipc_collect()  # free what the child mapped and has let go of
        if not answer.get("ok"):
            raise self._refusal(answer, span, outputs)
        if self.device == "cuda":
            return buffers
        import numpy as np  # lazy: numpy (~0.3 s), kept off kfc's start-up: the parser reads this module's limits

        return [np.frombuffer(b, dtype=np.float64).reshape(shape) for b, (_, shape) in zip(data, outputs)]

    def _request(self, reference, is_function, inputs, dims, outputs):
        """The request's header and blobs, the tensors the child maps (kept alive until it
        answered), and the buffers it writes the results into (on the GPU)."""
        import torch  # lazy: torch (~3 s), only a reference call needs it

        specs, blobs, keep, buffers = [], [], [], []
        for name, kind, value in inputs:
            if kind == "scalar":
                specs.append({"name": name, "kind": "scalar", "value": value})
            elif kind == "absent" or value is None:
                specs.append({"name": name, "kind": "absent"})
            elif self.device == "cuda":
                specs.append({"name": name, "kind": "cuda", "ipc": _ipc_handle(value)})
                keep.append(value)
            else:
                t = _as_cpu_torch(value)
                specs.append({"name": name, "kind": "bytes", "dtype": str(t.dtype).removeprefix("torch."),
                              "shape": list(t.shape), "blob": len(blobs)})
                blobs.append(t.contiguous().view(-1).view(torch.uint8).numpy())
        outs = []
        for name, shape in outputs:
            o = {"name": name, "shape": list(shape)}
            if self.device == "cuda":
                device = next((v.device for _, k, v in inputs if k == "tensor" and v is not None), "cuda")
                buf = torch.full(tuple(shape), float("nan"), dtype=torch.float32, device=device)
                buffers.append(buf)
                o["ipc"] = _ipc_handle(buf)
            outs.append(o)
        if self.device == "cuda":
            torch.cuda.synchronize()  # the child reads the inputs on its own streams
        header = {"reference": reference, "kind": "function" if is_function else "expr", "dims": dict(dims),
                  "inputs": specs, "outputs": outs, "device": self.device, "sys_path": self.sys_path}
        return header, blobs, keep, buffers

    def _failure(self, why: str, span: Span | None) -> ReferenceFailed:
        if why == "timeout":
            return ReferenceFailed(f"the reference did not finish within {self.limits.timeout_s:g} s; it was stopped",
                                  span, "make it faster, or raise the limit (--reference-timeout SECONDS)")
        if why == "memory":
            return ReferenceFailed(f"the reference used more than {_gib(self.limits.memory_bytes)} of memory; "
                                  "it was stopped", span, "raise the limit (--reference-memory GIB), or check "
                                  "smaller shapes")
        if why.startswith("signal"):
            return ReferenceFailed(f"the reference crashed ({why})", span,
                                  "run the reference by hand in Python on small inputs to find the fault")
        return ReferenceFailed(f"the process running the reference exited ({why}) before returning the outputs",
                              span, "the reference must return the outputs; it may not end the process")

    def _refusal(self, answer: dict, span: Span | None, outputs) -> ReferenceFailed:
        kind, message, where = answer.get("kind"), str(answer.get("message")), answer.get("where") or ""
        at = f" (at {where})" if where and not where.startswith("<reference>") else ""
        names = ", ".join(n for n, _ in outputs)
        hints = {
            "exit": "return the outputs instead of exiting: a check that exits checks nothing",
            "none": f"return the outputs ({names}) in order, or as a dict by name",
            "count": f"return exactly the outputs {names}, in order, or as a dict by name",
            "type": "return torch tensors (or numbers)",
            "shape": "return each output with the shape the op declares",
            "import": "give \"package.module:function\" importable from where kfc runs, or a torch expression",
            "memory": "raise the limit (--reference-memory GIB), or check smaller shapes",
        }
        hint = hints.get(kind, "the reference sees the inputs by name as torch tensors, scalars as numbers, "
                               "and the dims as integers")
        if kind == "memory":
            message += f" (limit {_gib(self.limits.memory_bytes)})"
        return ReferenceFailed(message + at, span, hint)


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def _as_cpu_torch(value):
    import torch  # lazy: torch (~3 s), only a reference call needs it

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    raise TypeError(f"expected a torch tensor, got {type(value).__name__}")


def _ipc_handle(t) -> str:
    """A CUDA tensor as the picklable handle torch.multiprocessing would send (hex text)."""
    from torch.multiprocessing.reductions import reduce_tensor  # lazy: torch (~3 s), GPU references only

    return pickle.dumps(reduce_tensor(t)).hex()


_shared: dict[tuple, ReferenceSandbox] = {}


def shared_sandbox(limits: Limits | None = None, device: str = "cpu") -> ReferenceSandbox:
    """One sandbox per (limits, device) for this process: the child's start (importing torch)
    is paid once, not once per check."""
    limits = limits or Limits()
    key = (limits, device)
    if key not in _shared:
        _shared[key] = ReferenceSandbox(limits, device)
    return _shared[key]

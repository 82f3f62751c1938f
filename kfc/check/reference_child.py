"""The child process that runs a `.kfc` file's reference (started by kfc.check.sandbox).

It serves one request at a time over its stdin/stdout pipes (kfc.check.wire); the reference's
own prints go to stderr, and reading stdin gives it end-of-file. Tensors come as raw bytes (CPU)
or as CUDA IPC handles of the parent's tensors (the GPU gate); results go back as float64
bytes, or are copied into output buffers the parent shared, so the parent never unpickles
anything this process wrote. Every failure of the reference is an answer, not a crash.

    python -m kfc.check.reference_child '{"memory_bytes": ..., "device": "cpu"}'
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import resource
import sysconfig
import pickle
import math
import importlib
import inspect

from .descendants import become_subreaper, kill_descendants
from .wire import WireClosed, recv, send


def _limit_memory(limit: int) -> None:
    """An address-space limit of what is mapped now plus `limit` (CPU only: CUDA reserves
    terabytes of address space; the parent also watches the resident size)."""
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + limit, resource.RLIM_INFINITY))


def _user_frame(tb) -> str:
    """Where in the user's code the exception came from: the innermost frame outside Python's
    and the libraries' own files (the reference expression itself is `<reference>`)."""
    lib_dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
    here = os.path.dirname(os.path.abspath(__file__))
    frames = traceback.extract_tb(tb)
    for fr in reversed(frames):
        path = fr.filename
        if path.startswith("<frozen"):
            continue
        if path.startswith("<") or not (any(path.startswith(d) for d in lib_dirs) or path.startswith(here)):
            return f"{path}:{fr.lineno}"
    return ""


def _inputs(req: dict, blobs: list, torch):
    """The reference's namespace: inputs by name (torch tensors, numbers), and the dims."""
    values = {}
    for spec in req["inputs"]:
        name = spec["name"]
        if spec["kind"] == "scalar":
            values[name] = spec["value"]
        elif spec["kind"] == "absent":
            values[name] = None
        elif spec["kind"] == "cuda":
            values[name] = _from_ipc(spec["ipc"])
        else:
            dtype = getattr(torch, spec["dtype"])
            raw = blobs[spec["blob"]]
            t = torch.frombuffer(raw, dtype=dtype) if len(raw) else torch.empty(0, dtype=dtype)
            values[name] = t.reshape(spec["shape"])
    return values


def _from_ipc(handle_hex: str):
    """A tensor of kfc's process, mapped here through its CUDA IPC handle (the pickled reduction
    kfc wrote; the reference never writes one)."""
    rebuild, args = pickle.loads(bytes.fromhex(handle_hex))
    return rebuild(*args)


def _reference(req: dict):
    """A callable of the namespace for the request's reference (an expression, or module:function)."""
    import torch  # lazy: torch (~3 s), imported in the child only, after stdout is redirected to stderr
    import torch.nn.functional as F  # lazy: torch (~3 s), imported in the child only, after stdout is redirected to stderr

    text = req["reference"]
    if req["kind"] == "function":
        mod_name, fn_name = text.split(":")
        try:
            mod = importlib.import_module(mod_name)
        except BaseException as e:  # noqa: BLE001 - reported, whatever the module does on import
            raise _Refused("import", f"cannot import the reference module {mod_name!r}: {type(e).__name__}: {e}")
        fn = getattr(mod, fn_name, None)
        if not callable(fn):
            raise _Refused("import", f"module {mod_name!r} has no function {fn_name!r}")
        # besides the inputs, the dims and size parameters (C of kda<C: 16 | 32>) it names
        try:
            named = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a callable without a signature Python can read: the inputs only
            named = {}
        return lambda inputs, dims: fn(**inputs, **{k: v for k, v in dims.items() if k in named and k not in inputs})
    code = compile(text, "<reference>", "eval")
    return lambda inputs, dims: eval(code, {"torch": torch, "F": F, "math": math, **dims, **inputs})  # noqa: S307


def _out_of_memory(e: BaseException) -> bool:
    """MemoryError, or torch's allocators refusing (CPU: "can't allocate memory"; CUDA: OOM)."""
    text = str(e).lower()
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and (
        "can't allocate memory" in text or "out of memory" in text))


class _Refused(Exception):
    def __init__(self, kind: str, message: str, where: str = "") -> None:
        super().__init__(message)
        self.kind, self.message, self.where = kind, message, where


def _outputs(result, req: dict, torch) -> list:
    """The reference's result as one tensor per output, in order, each of the output's shape."""
    names = [o["name"] for o in req["outputs"]]
    if result is None:
        raise _Refused("none", "the reference returned None")
    if isinstance(result, dict):
        missing = [n for n in names if n not in result]
        if missing:
            raise _Refused("count", f"the reference returned a dict without {missing[0]!r}")
        result = [result[n] for n in names]
    elif not isinstance(result, (tuple, list)):
        result = [result]
    if len(result) != len(names):
        raise _Refused("count", f"the reference returned {len(result)} value(s) for {len(names)} output(s)")
    out = []
    for r, o in zip(result, req["outputs"]):
        try:
            t = torch.as_tensor(r)
        except (TypeError, ValueError, RuntimeError):
            raise _Refused("type", f"the reference returned a {type(r).__name__} for output {o['name']!r}, "
                           "not a tensor or number") from None
        want = tuple(o["shape"])
        if tuple(t.shape) != want:
            squeezed = [d for d in t.shape if d != 1] == [d for d in want if d != 1]
            if not squeezed:
                raise _Refused("shape", f"the reference's output {o['name']!r} has shape {list(t.shape)}; "
                               f"the op's {o['name']} is {list(want)}")
            t = t.reshape(want)
        out.append(t)
    return out


def serve(proto_in: int, proto_out: int, device: str) -> None:
    send(proto_out, {"ready": True, "pid": os.getpid()})
    while True:
        try:
            req, blobs = recv(proto_in)
        except WireClosed:
            kill_descendants(os.getpid())  # what the reference started ends with this process
            return
        header, out_blobs = answer(req, blobs)  # its tensors are gone once it returns (CUDA IPC views too)
        send(proto_out, header, out_blobs)


def answer(req: dict, blobs: list) -> tuple[dict, list]:
    """The reply to one request: the results, or why there are none."""
    import torch  # lazy: torch (~3 s), imported in the child only, after stdout is redirected to stderr

    try:
        sys.path[:0] = [p for p in req.get("sys_path", []) if p not in sys.path]
        fn = _reference(req)
        inputs = _inputs(req, blobs, torch)
        try:
            with torch.no_grad():
                result = fn(inputs, req["dims"])
        except SystemExit as e:
            raise _Refused("exit", f"the reference called exit({e.code if e.code is not None else ''})",
                           _user_frame(e.__traceback__)) from None
        except BaseException as e:  # noqa: BLE001 - the user's code: every failure is reported
            if _out_of_memory(e):
                raise _Refused("memory", f"the reference ran out of memory ({type(e).__name__}: "
                               f"{str(e)[:200]})", _user_frame(e.__traceback__)) from None
            raise _Refused("exception", f"the reference raised {type(e).__name__}: {e}",
                           _user_frame(e.__traceback__)) from None
        outs = _outputs(result, req, torch)
        if req["device"] == "cuda":
            for t, o in zip(outs, req["outputs"]):
                buf = _from_ipc(o["ipc"])
                buf.copy_(t.to(device=buf.device, dtype=buf.dtype))
            torch.cuda.synchronize()
            return {"ok": True}, []
        arrays = [t.detach().to("cpu", torch.float64).contiguous().numpy() for t in outs]
        return {"ok": True}, [a.tobytes() for a in arrays]
    except _Refused as r:
        return {"ok": False, "kind": r.kind, "message": r.message, "where": r.where}, []
    except MemoryError:
        return {"ok": False, "kind": "memory", "message": "the reference ran out of memory", "where": ""}, []
    except Exception as e:  # noqa: BLE001 - e.g. a result that cannot move: still one answer
        return {"ok": False, "kind": "exception", "where": "",
                "message": f"the reference's result could not be read: {type(e).__name__}: {e}"}, []


def main() -> int:
    config = json.loads(sys.argv[1])
    become_subreaper()  # a detached grandchild stays in this process's tree, to be ended with it
    # the protocol keeps the original stdin/stdout; the user's code gets stderr and end-of-file
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    import numpy  # noqa: F401  # lazy: numpy (~0.3 s), in the child only, before the memory limit is set
    import torch  # lazy: torch (~3 s), imported in the child only, after stdout is redirected to stderr

    if config["device"] == "cuda":
        torch.cuda.init()
    elif config.get("memory_bytes"):
        _limit_memory(int(config["memory_bytes"]))
    serve(proto_in, proto_out, config["device"])
    return 0


if __name__ == "__main__":
    sys.exit(main())

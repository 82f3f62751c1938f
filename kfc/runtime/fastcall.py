"""Building and loading the launch fast path (fastcall.cpp), a CPython extension over ATen.

Why this mechanism (bench/launch_overhead.py measures each on the H200): a call's host time
there is the driver's cuLaunchKernelEx (about 3.7 us, the floor), making the outputs, reading
the tensors, and whatever the glue adds. Through ctypes every tensor is read by Python calls
(0.45 us a tensor) and the launch crosses ctypes; a C extension reading tensors through their
Python methods still pays the reads; reading them through ATen costs 0.05 us a tensor and
at::empty is cheaper than torch.empty_like. So the extension is compiled once per machine and
torch version with the system C++ compiler against torch's headers (as torch's own
cpp_extension does, without its ninja), kept in the JIT cache, and loaded from there. One
generic module driven by data (`Launcher(...)`) rather than a launcher generated per kernel:
the per-call work is the same, and it is built once, not once per kernel.

The first build takes seconds (torch's headers are large); kfc says so on stderr while it
builds. Where it cannot be built (no compiler, no torch headers, KFC_LAUNCHER=ctypes) kfc
says why once and launches through ctypes instead (kfc.runtime.launcher). Self-contained
like launcher.py: `kfc package` copies both, with fastcall.cpp, into the packages it writes.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import warnings
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

try:
    from .cache import cache_dir
except ImportError:  # vendored into a package `kfc package` wrote, which runs without kfc
    def cache_dir() -> Path:
        base = os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")
        return Path(base) / __name__.split(".")[0]

SOURCE = Path(__file__).with_name("fastcall.cpp")
MODULE = "kfc_fastcall"

# Slot kinds, as fastcall.cpp numbers them.
KINDS = {"ptr": 0, "signed char": 1, "bool": 2, "int": 3, "long long": 4, "float": 5, "double": 6}


class BuildFailed(Exception):
    pass


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), sysconfig.get_config_var("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name.split()[0]):
            return name.split()[0]
    return None


def build_command(cxx: str, output: Path, extra_flags: tuple[str, ...] = ()) -> list[str]:
    import torch  # lazy: torch, seconds cold (importtime: 14.6 s here); kfc.runtime imports without it
    from torch.utils.cpp_extension import include_paths, library_paths  # lazy: with torch, on building only

    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    libs = library_paths()
    return [cxx, "-O2", "-shared", "-fPIC", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-I{sysconfig.get_paths()['include']}", *[f"-isystem{p}" for p in include_paths()], *extra_flags,
            str(SOURCE), "-o", str(output), *[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs],
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def build(out_dir: Path, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile fastcall.cpp into out_dir; the path of the shared object."""
    cxx = compiler()
    if cxx is None:
        raise BuildFailed("no C++ compiler (c++, g++ or clang++) is on PATH")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        raise BuildFailed(f"this Python's headers are missing ({sysconfig.get_paths()['include']}/Python.h); "
                          "install python3-dev")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / (MODULE + EXTENSION_SUFFIXES[0])
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        partial = Path(tmp) / target.name
        cmd = build_command(cxx, partial, extra_flags)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BuildFailed(f"{cxx} could not run: {e}") from None
        if r.returncode:
            raise BuildFailed(f"{' '.join(cmd)} failed:\n{(r.stderr or r.stdout).strip()[:2000]}")
        os.replace(partial, target)  # atomic: a concurrent builder finds a whole file or none
    return target


def _key() -> str:
    import torch  # lazy: torch, seconds cold (importtime: 14.6 s here); kfc.runtime imports without it

    h = hashlib.sha256(SOURCE.read_bytes())
    for part in (sys.version, EXTENSION_SUFFIXES[0], str(compiler()), torch.__version__, torch.__file__):
        h.update(part.encode())
    return h.hexdigest()[:16]


def load_from(path: Path):
    import torch  # lazy: torch takes seconds cold; loaded first, the extension links against it  # noqa: F401

    loader = ExtensionFileLoader(MODULE, str(path))
    spec = spec_from_loader(MODULE, loader)
    mod = module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@functools.cache
def module():
    """The compiled extension, or None (with one warning saying why) where it cannot be had."""
    if os.environ.get("KFC_LAUNCHER", "").lower() == "ctypes":
        return None
    try:
        where = cache_dir() / "fastcall" / _key()
        path = where / (MODULE + EXTENSION_SUFFIXES[0])
        if not path.exists():
            print(f"kfc: building its launcher against torch (once per machine and torch version) in {where}",
                  file=sys.stderr, flush=True)
            t0 = time.monotonic()
            build(where)
            print(f"kfc: launcher built in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        return load_from(path)
    except (BuildFailed, OSError, ImportError) as e:
        warnings.warn(f"kfc: the compiled launcher is unavailable, so each kernel call costs a few microseconds "
                      f"more (ctypes): {e}", RuntimeWarning, stacklevel=3)
        return None

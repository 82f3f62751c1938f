"""The CUDA toolchain: find nvcc and ptxas, check their version, turn a .cu into PTX and a cubin,
and read ptxas's resource report (registers, spills, shared memory, stack)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs

from ..diagnostics import InternalError, KfcError
from . import build_cache, nvcc_prelude

MIN_VERSION = (12, 8)  # the first CUDA with sm_100a


class ToolchainError(KfcError):
    pass


@attrs.frozen
class Toolchain:
    nvcc: str
    ptxas: str
    version: tuple[int, int]

    @property
    def version_text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


@attrs.frozen
class PtxasReport:
    registers: int
    spill_stores: int
    spill_loads: int
    stack_bytes: int
    smem_bytes: int
    barriers: int
    cmem_bytes: int

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


@functools.cache
def find_toolchain() -> Toolchain:
    nvcc = os.environ.get("KFC_NVCC")
    if nvcc and not Path(nvcc).is_file():
        raise ToolchainError(f"KFC_NVCC points at {nvcc}, which does not exist",
                             hint="set KFC_NVCC to the nvcc binary of a CUDA toolkit (12.8 or newer), or unset it")
    nvcc = nvcc or shutil.which("nvcc")
    if not nvcc:
        for cand in ("/usr/local/cuda/bin/nvcc", "/opt/cuda/bin/nvcc"):
            if Path(cand).is_file():
                nvcc = cand
                break
    if not nvcc:
        raise ToolchainError("nvcc not found", hint="install the CUDA toolkit (12.8 or newer) and put nvcc on PATH, "
                                                    "or set KFC_NVCC to its path")
    ptxas = str(Path(nvcc).with_name("ptxas"))
    if not Path(ptxas).is_file():
        ptxas = shutil.which("ptxas") or ""
    if not ptxas:
        raise ToolchainError(f"ptxas not found beside {nvcc}", hint="a complete CUDA toolkit has both")
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"cannot run {nvcc}: {e}") from None
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise ToolchainError(f"cannot read the version of {nvcc}", hint="check that it is NVIDIA's nvcc")
    version = (int(m.group(1)), int(m.group(2)))
    if version < MIN_VERSION:
        raise ToolchainError(f"nvcc {version[0]}.{version[1]} is too old: kfc needs CUDA "
                             f"{MIN_VERSION[0]}.{MIN_VERSION[1]} or newer for sm_100a",
                             hint="install a newer CUDA toolkit, or point KFC_NVCC at one")
    return Toolchain(nvcc, ptxas, version)


def find_cuobjdump() -> str:
    """cuobjdump: beside nvcc, on PATH, or from NVIDIA's nvidia-cuda-cuobjdump wheel (kfc[test],
    with nvidia-cuda-nvdisasm, which it runs)."""
    beside = Path(find_toolchain().nvcc).with_name("cuobjdump")
    if beside.is_file():
        return str(beside)
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia  # lazy: an optional extra (kfc[test]: NVIDIA's CUDA wheels install into this namespace)
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", ()):
        wheel = Path(root) / "cu13" / "bin" / "cuobjdump"
        if wheel.is_file():
            return str(wheel)
    raise ToolchainError("cuobjdump not found", hint="install the CUDA toolkit's cuobjdump, or "
                                                      "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (part of kfc[test])")


def disassemble(cubin: bytes) -> str:
    """The SASS of a cubin, as `cuobjdump -sass` prints it."""
    tool = find_cuobjdump()
    with tempfile.TemporaryDirectory(prefix="kfc-sass-") as d:
        path = Path(d) / "kernel.cubin"
        path.write_bytes(cubin)
        try:
            # cuobjdump runs nvdisasm, which NVIDIA's wheels install beside it
            env = {**os.environ, "PATH": os.pathsep.join([str(Path(tool).parent), os.environ.get("PATH", "")])}
            r = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, timeout=120, env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ToolchainError(f"cannot run {tool}: {e}") from None
        if r.returncode != 0:
            raise ToolchainError(f"cuobjdump -sass failed: {r.stderr.strip()[:500]}")
        return r.stdout


_REG = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")
_BAR = re.compile(r"used (\d+) barriers")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def parse_ptxas_report(text: str) -> PtxasReport:
    """The report of the cubin's kernels together: the most any one uses of each resource, and
    the spills of all of them (an op compiled to several kernels must spill in none)."""
    def most(rx, group=1):
        return max((int(m.group(group)) for m in rx.finditer(text)), default=0)

    spills = list(_SPILL.finditer(text))
    return PtxasReport(
        registers=most(_REG), spill_stores=sum(int(m.group(2)) for m in spills),
        spill_loads=sum(int(m.group(3)) for m in spills), stack_bytes=most(_SPILL),
        smem_bytes=most(_SMEM), barriers=most(_BAR), cmem_bytes=most(_CMEM))


@attrs.frozen
class CompiledKernel:
    cu: str
    ptx: str
    cubin: bytes
    arch: str
    report: PtxasReport
    ptxas_log: str


class ToolchainRejected(ToolchainError, InternalError):
    """nvcc or ptxas rejected the code kfc generated: a bug in kfc's code generation."""


# nvcc: `kernel.cu(45): error: ...`; ptxas: `ptxas kernel.ptx, line 12; error   : ...`
_ERROR_LINE = re.compile(r"(\berror\b|\bfatal\b)", re.IGNORECASE)
FIRST_ERRORS = 6


def first_errors(log: str, names: dict[str, str]) -> str:
    """The first error lines of a toolchain log (each with the line after it, nvcc's source
    excerpt), with the temporary file names replaced by the kept copies' paths."""
    lines = log.splitlines()
    picked: list[str] = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.search(line) and len(picked) < 2 * FIRST_ERRORS:
            picked.append(line)
            if i + 1 < len(lines) and not _ERROR_LINE.search(lines[i + 1]) and lines[i + 1].strip():
                picked.append(lines[i + 1])
    text = "\n".join(picked or lines[:2 * FIRST_ERRORS])
    if not names:
        return text
    # one pass, longest name first: a kept path must not be rewritten again
    pattern = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    return re.sub(pattern, lambda m: names[m.group(0)], text)


def keep_failed(files: dict[str, str]) -> Path:
    """Copy a failed build's sources to a folder that outlives it: KFC_DUMP_DIR, else a new
    temporary folder."""
    root = os.environ.get("KFC_DUMP_DIR")
    if root:
        base = Path(root)
        base.mkdir(parents=True, exist_ok=True)
        d = Path(tempfile.mkdtemp(prefix="failed-build-", dir=base))
    else:
        d = Path(tempfile.mkdtemp(prefix="kfc-failed-build-"))
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def _run(cmd: list[str], what: str, sources: dict[Path, str],
         fallible: bool = False) -> subprocess.CompletedProcess | None:
    """Run a toolchain step; on failure keep `sources` (path -> text) and report the first
    errors at their places in the kept files, or, where `fallible` (a try with a fallback),
    return None."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        if fallible:
            return None
        kept = keep_failed({p.name: t for p, t in sources.items()})
        raise ToolchainRejected(f"{what} did not finish within 300 s on the generated kernel (kept in {kept})",
                                hint="this is a bug in kfc's code generation; report it with the kept files") from None
    except OSError as e:
        if fallible:
            return None
        raise ToolchainError(f"cannot run {cmd[0]}: {e}",
                             hint="check the CUDA toolkit's installation, or point KFC_NVCC at a working nvcc") from None
    if r.returncode != 0:
        if fallible:
            return None
        kept = keep_failed({p.name: t for p, t in sources.items()})
        names = {str(p): str(kept / p.name) for p in sources}
        names.update({p.name: str(kept / p.name) for p in sources})
        log = (r.stderr + "\n" + r.stdout).strip()
        raise ToolchainRejected(f"{what} rejected the generated kernel (kept in {kept}):\n"
                                f"{first_errors(log, names)}",
                                hint=f"this is a bug in kfc's code generation; report it with the files in {kept}")
    return r


def compile_cuda(cu: str, arch: str, toolchain: Toolchain | None = None, extra_flags: tuple[str, ...] = ()) -> CompiledKernel:
    """Compile CUDA C++ for one architecture (sm_90a, sm_100, ...) into PTX and a cubin; with
    KFC_BUILD_CACHE set, a build made before is read back (build_cache.py)."""
    tc = toolchain or find_toolchain()
    cache = build_cache.folder()
    if cache is not None:
        digest = build_cache.key(cu, arch, extra_flags, (tc.nvcc, tc.ptxas, tc.version_text))
        if (stored := build_cache.load(cache, digest)) is not None:
            ptx, cubin, log = stored
            return CompiledKernel(cu, ptx, cubin, arch, parse_ptxas_report(log), log)
    kernel = _build(cu, arch, tc, extra_flags)
    if cache is not None:
        build_cache.store(cache, digest, kernel.ptx, kernel.cubin, kernel.ptxas_log)
    return kernel


def _build(cu: str, arch: str, tc: Toolchain, extra_flags: tuple[str, ...]) -> CompiledKernel:
    compute = arch.replace("sm_", "compute_")
    with tempfile.TemporaryDirectory(prefix="kfc-nvcc-") as d:
        src = Path(d) / "kernel.cu"
        src.write_text(cu)
        ptx_path = Path(d) / "kernel.ptx"
        cubin_path = Path(d) / "kernel.cubin"

        def nvcc(source: Path, out: Path) -> list[str]:
            return [tc.nvcc, "-ptx", "-O3", "-std=c++17", f"-arch={compute}", "-o", str(out), str(source), *extra_flags]

        ptx = _ptx(nvcc, src, cu, ptx_path, Path(d) / "kfc_prelude.h")
        r = _run([tc.ptxas, "-v", "-O3", f"-arch={arch}", "-o", str(cubin_path), str(ptx_path)], "ptxas (PTX to cubin)",
                 {src: cu, ptx_path: ptx})
        log = (r.stdout + r.stderr).strip()
        return CompiledKernel(cu, ptx, cubin_path.read_bytes(), arch, parse_ptxas_report(log), log)


# per nvcc binary, whether it builds a trivial kernel against the prelude (probed once, after its
# first kernel that does not build with it): where not (another CUDA release's headers), its
# kernels take the full headers at once rather than after a failed try
_PRELUDE_FITS: dict[str, bool] = {}
_PROBE = 'extern "C" __global__ void kfc_probe(float *x) { x[threadIdx.x] = expf(__int_as_float(x[0] > 0)); }\n'


def _ptx(nvcc: Callable[[Path, Path], list[str]], src: Path, cu: str, ptx_path: Path, prelude: Path) -> str:
    """The kernel's PTX: built against kfc's prelude of the CUDA headers (nvcc_prelude.py), or with
    the full headers where the prelude does not compile; KFC_NVCC_HEADERS=full builds with the full
    headers only, =check with both, and fails unless both build the same PTX. `nvcc(source, out)` is
    the command that builds a source's PTX."""
    how = nvcc_prelude.mode()
    light = None
    tool = nvcc(src, ptx_path)[0]
    with_prelude = (*nvcc_prelude.FLAGS, "-include", str(prelude))
    if how == "check" or (how == "light" and _PRELUDE_FITS.get(tool, True)):
        prelude.write_text(nvcc_prelude.PRELUDE)
        if _run([*nvcc(src, ptx_path), *with_prelude], "nvcc (CUDA C++ to PTX, kfc's prelude)", {src: cu},
                fallible=True) is not None:
            light = ptx_path.read_text()  # else the full build below reports what is wrong
        elif tool not in _PRELUDE_FITS:  # the kernel's fault, or the toolchain's: a trivial kernel tells
            probe = src.with_name("kfc_probe.cu")
            probe.write_text(_PROBE)
            _PRELUDE_FITS[tool] = _run([*nvcc(probe, probe.with_suffix(".ptx")), *with_prelude],
                                       "nvcc (a probe of kfc's prelude)", {probe: _PROBE}, fallible=True) is not None
        if light is not None and how == "light":
            return light
    _run(nvcc(src, ptx_path), "nvcc (CUDA C++ to PTX)", {src: cu})
    ptx = ptx_path.read_text()
    if how == "check" and light != ptx:
        kept = keep_failed({src.name: cu, "full.ptx": ptx, "prelude.ptx": light or "",
                            prelude.name: nvcc_prelude.PRELUDE})
        what = "does not compile" if light is None else "builds other PTX than it does with the full headers"
        raise InternalError(f"the kernel {what} against kfc's prelude of the CUDA headers (kept in {kept})",
                            hint=f"build with {nvcc_prelude.ENV}=full meanwhile, and report it with the kept files")
    return ptx


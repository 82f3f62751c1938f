"""The CUDA toolchain: find nvcc and ptxas, check their version, turn a .cu into PTX and a cubin,
and read ptxas's resource report (registers, spills, shared memory, stack)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import attrs

from ..diagnostics import KfcError

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


_REG = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")
_BAR = re.compile(r"used (\d+) barriers")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def parse_ptxas_report(text: str) -> PtxasReport:
    def num(rx, default=0):
        m = rx.search(text)
        return int(m.group(1)) if m else default

    sp = _SPILL.search(text)
    return PtxasReport(
        registers=num(_REG), spill_stores=int(sp.group(2)) if sp else 0, spill_loads=int(sp.group(3)) if sp else 0,
        stack_bytes=int(sp.group(1)) if sp else 0, smem_bytes=num(_SMEM), barriers=num(_BAR), cmem_bytes=num(_CMEM))


@attrs.frozen
class CompiledKernel:
    cu: str
    ptx: str
    cubin: bytes
    arch: str
    report: PtxasReport
    ptxas_log: str


def _run(cmd: list[str], what: str, source: str | None = None) -> subprocess.CompletedProcess:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        raise ToolchainError(f"{what} timed out after 300 s") from None
    except OSError as e:
        raise ToolchainError(f"cannot run {cmd[0]}: {e}") from None
    if r.returncode != 0:
        log = (r.stderr or r.stdout).strip()
        raise ToolchainError(f"{what} failed:\n{log[-4000:]}",
                             hint="this is a bug in kfc's code generation; KFC_DUMP_DIR keeps the IR, and the .cu "
                                  "is kept next to the outputs with --keep")
    return r


def compile_cuda(cu: str, arch: str, toolchain: Toolchain | None = None, extra_flags: tuple[str, ...] = ()) -> CompiledKernel:
    """Compile CUDA C++ for one architecture (sm_90a, sm_100, ...) into PTX and a cubin."""
    tc = toolchain or find_toolchain()
    compute = arch.replace("sm_", "compute_")
    with tempfile.TemporaryDirectory(prefix="kfc-nvcc-") as d:
        src = Path(d) / "kernel.cu"
        src.write_text(cu)
        ptx_path = Path(d) / "kernel.ptx"
        cubin_path = Path(d) / "kernel.cubin"
        _run([tc.nvcc, "-ptx", "-O3", "-std=c++17", f"-arch={compute}", "-o", str(ptx_path), str(src),
              *extra_flags], "nvcc (CUDA C++ to PTX)")
        r = _run([tc.ptxas, "-v", "-O3", f"-arch={arch}", "-o", str(cubin_path), str(ptx_path)], "ptxas (PTX to cubin)")
        log = (r.stdout + r.stderr).strip()
        return CompiledKernel(cu, ptx_path.read_text(), cubin_path.read_bytes(), arch, parse_ptxas_report(log), log)

"""A content-addressed store of toolchain results: the same CUDA C++ built for the same arch with
the same flags by the same nvcc gives the same PTX and cubin, so a build seen before is read
back instead of run again. Off unless `KFC_BUILD_CACHE` names a folder; the test suite sets one
per run, because many tests build the same kernel for the same target and shape.

An entry is a folder named by the key's SHA-256 holding `kernel.ptx`, `kernel.cubin` and
`ptxas.log`, written as the JIT cache writes its entries (kfc.files.write_folder_atomically), so
processes sharing the folder (pytest-xdist workers) never read half an entry. A failed build is
not stored."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from ..files import write_folder_atomically

ENV = "KFC_BUILD_CACHE"


def folder() -> Path | None:
    """The cache's folder, or None when caching is off."""
    where = os.environ.get(ENV)
    return Path(where) if where else None


def key(cu: str, arch: str, flags: tuple[str, ...], tools: tuple[str, ...]) -> str:
    """What decides a build's output: the source, the arch, the flags and the tools' identity."""
    h = hashlib.sha256()
    for part in (cu, arch, *flags, "\0tools", *tools):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def load(root: Path, digest: str) -> tuple[str, bytes, str] | None:
    """(ptx, cubin, ptxas log) of a stored build, or None. An entry appears whole (renamed into
    place), so one missing a file was torn since: it is removed and built again."""
    entry = root / digest
    try:
        return ((entry / "kernel.ptx").read_text(), (entry / "kernel.cubin").read_bytes(),
                (entry / "ptxas.log").read_text())
    except OSError:
        shutil.rmtree(entry, ignore_errors=True)
        return None


def store(root: Path, digest: str, ptx: str, cubin: bytes, log: str) -> None:
    """Keep a build; a cache that cannot be written is skipped, never an error of the build."""
    try:
        write_folder_atomically(root / digest, {"kernel.ptx": ptx, "kernel.cubin": cubin, "ptxas.log": log})
    except OSError:  # no space, or the folder is not writable
        pass

"""The on-disk JIT cache: compiled kernels keyed by everything that decides the binary — the
op's IR, the pipeline, the target, the fixed dims, the toolchain and kfc versions."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..diagnostics import KfcError
from ..files import write_folder_atomically
from ..model.version import __version__


def cache_dir() -> Path:
    base = os.environ.get("KFC_CACHE_DIR")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kfc"


def writable_cache_dir() -> Path:
    """The cache folder, or one clear error where something other than a folder holds its place."""
    d = cache_dir()
    for p in (d, *d.parents):
        if p.exists():
            if not p.is_dir():
                named = "KFC_CACHE_DIR" if os.environ.get("KFC_CACHE_DIR") else "the JIT cache folder"
                raise KfcError(f"{named} is {d}, but {p} is a file, not a folder",
                               hint="point KFC_CACHE_DIR at a folder (it is created if missing)")
            break
    return d


@functools.cache
def compiler_fingerprint() -> str:
    """A hash of kfc's own source: a change to any pass or to codegen invalidates the cache,
    even where it leaves pipeline strings and versions unchanged."""
    pkg = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(list(pkg.rglob("*.py")) + list(pkg.rglob("*.lark")) + list((pkg.parent / "grammars").glob("*.lark"))):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_key(ir_text: str, pipeline: str, target: str, dims: dict[str, int], toolchain: str,
              codegen: str = "") -> str:
    doc = json.dumps({"ir": ir_text, "pipeline": pipeline, "target": target, "dims": sorted(dims.items()),
                      "toolchain": toolchain, "kfc": __version__, "compiler": compiler_fingerprint(),
                      "codegen": codegen}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:24]


def lookup(key: str) -> tuple[bytes, dict[str, Any]] | None:
    d = cache_dir() / key
    try:
        return (d / "kernel.cubin").read_bytes(), json.loads((d / "report.json").read_text())
    except (OSError, ValueError):
        return None


def store(key: str, cubin: bytes, report: dict[str, Any]) -> None:
    """Readers see a whole entry or none, and two processes compiling the same kernel do not
    collide (write_folder_atomically)."""
    write_folder_atomically(writable_cache_dir() / key, {"kernel.cubin": cubin, "report.json": json.dumps(report, indent=2)})

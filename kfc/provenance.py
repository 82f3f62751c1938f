"""Which kfc produced a result: the commit of the source tree (KFC_COMMIT when the tree
travelled without its .git), and a digest of the sources as they ran, which names the code even
where the commit is stale or the tree dirty (a copy sent to another machine):
`python -m kfc.provenance` prints both for the tree at hand."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    if os.environ.get("KFC_COMMIT"):
        return os.environ["KFC_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=_ROOT)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=_ROOT).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


SOURCES = ("kfc/**/*.py", "kernels/*.kfc", "bench/*.py")


def source_digest() -> str:
    """sha256 (first 16 hex digits) of kfc's package, kernels and benchmarks, path by path in
    sorted order: equal digests, equal code."""
    h = hashlib.sha256()
    for path in sorted({p for pattern in SOURCES for p in _ROOT.glob(pattern) if p.is_file()}):
        h.update(path.relative_to(_ROOT).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


if __name__ == "__main__":
    print(f"commit {git_commit()}\nsources {source_digest()}")

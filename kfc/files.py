"""Writing files so that an interrupted run never leaves half of one."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from .diagnostics import KfcError


def write_atomically(path: Path, data: bytes | str | None = None,
                     writer: Callable[[Path], None] | None = None) -> None:
    """Write `data` (or let `writer` write a temporary path) beside `path`, then rename it into
    place: the file appears whole or not at all."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KfcError(f"cannot create the folder for {path}: {e.strerror or e}",
                       hint="choose an output path in a writable place") from None
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        if writer is not None:
            writer(tmp)
        else:
            tmp.write_bytes(data.encode() if isinstance(data, str) else (data or b""))
        os.replace(tmp, path)
    except OSError as e:
        raise KfcError(f"cannot write {path}: {e.strerror or e}",
                       hint="choose an output path in a writable place") from None
    finally:
        if tmp.exists():
            tmp.unlink()


def write_folder_atomically(path: Path, files: dict[str, bytes | str]) -> None:
    """Write `files` (name -> content) into a temporary folder beside `path`, then rename it into
    place: readers see the whole folder or none. Where another process put the folder there
    first, theirs stays. An error writing the files is raised (OSError)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name[:24]}.", dir=path.parent))
    try:
        for name, content in files.items():
            (tmp / name).write_bytes(content.encode() if isinstance(content, str) else content)
        try:
            os.replace(tmp, path)
        except OSError:  # another process stored it first
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

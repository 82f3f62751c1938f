"""Writing files so that an interrupted run never leaves half of one."""

from __future__ import annotations

import os
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

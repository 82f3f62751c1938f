"""The framing between kfc and the reference's child process: a message is a JSON header and
raw byte blobs, never a pickle from the child (the child runs user code; its bytes are data).

    8 bytes: header length (little endian) | header (UTF-8 JSON, with "blobs": [lengths]) | blobs
"""

from __future__ import annotations

import json
import os
import select
import struct
from typing import Callable

_LEN = struct.Struct("<Q")
MAX_HEADER = 64 << 20  # a header is names, shapes and numbers; anything larger is corrupt


class WireClosed(Exception):
    """The other side closed the pipe (or wrote something that is not a message)."""


def send(fd: int, header: dict, blobs: list = ()) -> None:
    header = dict(header, blobs=[len(memoryview(b).cast("B")) for b in blobs])
    data = json.dumps(header).encode()
    _write_all(fd, _LEN.pack(len(data)) + data)
    for b in blobs:
        _write_all(fd, memoryview(b).cast("B"))


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view[: 1 << 24])
        view = view[n:]


def recv(fd: int, poll: Callable[[], None] | None = None) -> tuple[dict, list[bytearray]]:
    """One message. `poll` runs about every 20 ms while waiting (it raises to give up)."""
    (n,) = _LEN.unpack(_read_exact(fd, _LEN.size, poll))
    if n > MAX_HEADER:
        raise WireClosed(f"a message header of {n} bytes")
    try:
        header = json.loads(_read_exact(fd, n, poll).decode())
    except ValueError as e:
        raise WireClosed(f"a message header that is not JSON ({e})") from None
    if not isinstance(header, dict) or not all(isinstance(k, int) and k >= 0 for k in header.get("blobs", [])):
        raise WireClosed("a message header of the wrong form")
    return header, [_read_exact(fd, k, poll) for k in header.get("blobs", [])]


def _read_exact(fd: int, n: int, poll: Callable[[], None] | None) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if poll is not None:
            while not select.select([fd], [], [], 0.02)[0]:
                poll()
        k = os.readv(fd, [view[got:]])
        if k == 0:
            raise WireClosed("the pipe closed")
        got += k
    return buf

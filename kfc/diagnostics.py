"""Source spans and the one error type every user-facing failure goes through.

A `KfcError` renders as `file:line:col: error: what`, the offending line with a caret under
the span, and a hint that says what to do. The CLI prints it and exits with status 2.
"""

from __future__ import annotations

import stat
from pathlib import Path

import attrs


@attrs.frozen
class Span:
    """A region of source text: 1-based line and column, end exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    @classmethod
    def point(cls, file: str, line: int, col: int) -> "Span":
        return cls(file, line, col, line, col + 1)


SHOWN_LINE = 120  # characters of a source line an error shows (a window of longer ones)

# Text of every source the front ends have read, so a diagnostic can show the line.
_SOURCES: dict[str, str] = {}


def register_source(file: str, text: str) -> None:
    _SOURCES[file] = text


def source_line(file: str, line: int) -> str | None:
    text = _SOURCES.get(file)
    if text is None:
        return None
    lines = text.split("\n")  # line numbers count "\n" alone, as the parser's do
    if 1 <= line <= len(lines):
        return lines[line - 1].rstrip("\r")
    return None


class KfcError(Exception):
    """A problem in the user's input (or in a pass), reported with its place and a fix."""

    kind = "error"

    def __init__(self, message: str, span: Span | None = None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.hint = hint

    def render(self) -> str:
        where = f"{self.span}: " if self.span is not None else "kfc: "
        out = [f"{where}{self.kind}: {self.message}"]
        if self.span is not None:
            text = source_line(self.span.file, self.span.line)
            if text is not None:
                expanded = text.expandtabs(4)
                # the column counts characters; a tab before it is 4 columns on screen
                start = len(text[:max(self.span.col - 1, 0)].expandtabs(4))
                if self.span.end_line == self.span.line:
                    width = max(self.span.end_col - self.span.col, 1)
                else:
                    width = max(len(expanded) - start, 1)
                width = min(width, max(len(expanded) - start, 1))
                if len(expanded) > SHOWN_LINE:  # a window of a long line around the caret
                    lo = max(0, min(start - SHOWN_LINE // 4, len(expanded) - SHOWN_LINE))
                    shown = expanded[lo:lo + SHOWN_LINE]
                    lead = "..." if lo > 0 else ""
                    expanded = lead + shown + ("..." if lo + SHOWN_LINE < len(text.expandtabs(4)) else "")
                    start = start - lo + len(lead)
                    width = min(width, max(len(shown) - (start - len(lead)), 1))
                out.append(f"    {expanded}")
                out.append("    " + " " * start + "^" + "~" * (width - 1))
        if self.hint:
            out.append(f"hint: {self.hint}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()


class InternalError(KfcError):
    """A fault of kfc itself (a crashing pass, a pass that broke the IR, generated code the
    toolchain rejects), reported with what to send in a bug report. The CLI exits with 3."""

    kind = "internal error"


class GpuUnavailable(KfcError):
    """No GPU (or no usable driver) to run a kernel on."""


class VerifyError(KfcError):
    """The IR breaks an invariant of an op or of SSA form."""


class InterpretError(KfcError):
    """The interpreter met a run-time fault (an index out of bounds, a bad input)."""


MAX_SOURCE_BYTES = 1 << 20  # a .kfc file or IR text kfc reads (larger inputs are refused, not slow)


def read_source(path, what: str = "a .kfc file", limit: int = MAX_SOURCE_BYTES) -> str:
    """Read a user's file, turning every failure into one clear message: a missing file, a
    folder, a device or pipe that never ends, a symlink loop, a file over `limit` bytes, text
    that is not UTF-8 (reported at its line and column). A leading byte order mark is dropped, so
    columns on the first line count from the first character after it."""
    p = Path(path)
    try:
        info = p.stat()
        if stat.S_ISDIR(info.st_mode):
            raise KfcError(f"{p} is a directory", hint=f"give the path of {what}")
        if not stat.S_ISREG(info.st_mode):
            raise KfcError(f"{p} is not a regular file (a device, pipe or socket)", hint=f"give the path of {what}")
        with open(p, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise KfcError(f"no such file: {p}", hint=f"give the path of {what}, e.g. kernels/rmsnorm.kfc") from None
    except PermissionError:
        raise KfcError(f"cannot read {p}: permission denied", hint="check the file's permissions") from None
    except OSError as e:
        raise KfcError(f"cannot read {p}: {e.strerror or e}",
                       hint=f"give the path of {what}" + (" (a symlink loop?)" if e.errno == 40 else "")) from None
    if len(data) > limit:
        raise KfcError(f"{p} is larger than {limit >> 20} MiB, the most kfc reads as {what}",
                       hint="an op description is a few kilobytes; is this the right file?")
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark (some Windows editors write one): not text
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[:e.start]
        line = before.count(b"\n") + 1
        col = len(before[before.rfind(b"\n") + 1:].decode("utf-8", errors="replace")) + 1
        register_source(str(p), data.decode("utf-8", errors="replace"))
        raise KfcError(f"the file is not UTF-8 text: byte 0x{data[e.start]:02x} cannot start a character here",
                       Span(str(p), line, col, line, col + 1), "save the file as UTF-8") from None

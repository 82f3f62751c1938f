"""Source spans and the one error type every user-facing failure goes through.

A `KfcError` renders as `file:line:col: error: what`, the offending line with a caret under
the span, and a hint that says what to do. The CLI prints it and exits with status 2.
"""

from __future__ import annotations

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


# Text of every source the front ends have read, so a diagnostic can show the line.
_SOURCES: dict[str, str] = {}


def register_source(file: str, text: str) -> None:
    _SOURCES[file] = text


def source_line(file: str, line: int) -> str | None:
    text = _SOURCES.get(file)
    if text is None:
        return None
    lines = text.splitlines()
    if 1 <= line <= len(lines):
        return lines[line - 1]
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
                out.append(f"    {expanded}")
                # the column counts characters; a tab before it is 4 columns on screen
                start = len(text[:max(self.span.col - 1, 0)].expandtabs(4))
                if self.span.end_line == self.span.line:
                    width = max(self.span.end_col - self.span.col, 1)
                else:
                    width = max(len(expanded) - start, 1)
                width = min(width, max(len(expanded) - start, 1))
                out.append("    " + " " * start + "^" + "~" * (width - 1))
        if self.hint:
            out.append(f"hint: {self.hint}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()


class VerifyError(KfcError):
    """The IR breaks an invariant of an op or of SSA form."""


class InterpretError(KfcError):
    """The interpreter met a run-time fault (an index out of bounds, a bad input)."""


def read_source(path, what: str = "a .kfc file") -> str:
    """Read a user's file, turning the usual failures into one clear message."""
    from pathlib import Path

    p = Path(path)
    try:
        return p.read_text()
    except FileNotFoundError:
        raise KfcError(f"no such file: {p}", hint=f"give the path of {what}, e.g. kernels/rmsnorm.kfc") from None
    except IsADirectoryError:
        raise KfcError(f"{p} is a directory", hint=f"give the path of {what}") from None
    except (PermissionError, UnicodeDecodeError) as e:
        raise KfcError(f"cannot read {p}: {e}") from None

"""The code generator's error: a program it has no rule for, or one it cannot emit as asked."""

from __future__ import annotations

from ..diagnostics import KfcError


class CodegenError(KfcError):
    pass

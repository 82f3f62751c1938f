"""What an expression lowers to: an IR value, a Python number (kept a number until it meets a
value), or a Tensor (an op argument in global memory, loaded when it is used whole)."""

from __future__ import annotations

import attrs

from ..ir.core import Value


@attrs.frozen
class Tensor:
    """A function argument in global memory, as a name in scope."""

    value: Value


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, Value)

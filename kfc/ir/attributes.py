"""Attribute values as they appear in IR text, formatted so that parsing gives them back exactly.

Plain values: bool (`true`/`false`), int, float (`repr`, so every bit survives; `inf`, `-inf`,
`nan`), str (JSON-quoted), None (`none`), lists (`[a, b]`). Enum members print as their
quoted value; objects with a `to_attr()` method print as the quoted string it returns, and
the op's field converter turns the string back into the object.
"""

from __future__ import annotations

import enum
import json
import math


def format_attr(v) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        text = repr(v)
        return text if any(c in text for c in ".e") else text + ".0"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, enum.Enum):
        return json.dumps(str(v.value))
    if hasattr(v, "to_attr"):
        return json.dumps(v.to_attr())
    if isinstance(v, (tuple, list)):
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    raise TypeError(f"cannot print attribute value {v!r}")

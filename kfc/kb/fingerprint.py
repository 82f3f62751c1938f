"""What identifies an op to the knowledge base, and what makes two ops alike.

`op_fingerprint` is a structural hash of the tile IR: the function printed with every value
renamed to a number in order of definition (value names are hints, not structure) and the
function's own name left out, so `rmsnorm` built twice, or parsed from IR text with other
`%names`, has one fingerprint. Types (dtypes, shape symbols, memory spaces, layouts),
attributes and the order of ops all count. Fingerprint the function as `load_func` returns
it (type parameters bound, shapes still symbolic): the shape is recorded beside it.

`op_features` is a small JSON-able summary used to find similar ops; kfc.kb.op_similarity
compares two summaries (1.0 for identical ones).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

from ..ir.core import Value
from ..ir.func import FuncOp
from ..ir.printer import Printer
from ..ir.types import MemSpace, TensorType

FINGERPRINT_LEN = 16


class _CanonicalNamer:
    """Numbers every value in order of definition, ignoring its name hint."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def name(self, v: Value) -> str:
        key = id(v)
        if key not in self.names:
            self.names[key] = str(len(self.names))
        return self.names[key]

    def ref(self, v: Value) -> str:
        if id(v) not in self.names:
            return "%<undefined>"
        return "%" + self.names[id(v)]


def canonical_text(func: FuncOp) -> str:
    """The IR as the printer writes it, but with canonical value names and no function name."""
    printer = Printer()
    printer.namer = _CanonicalNamer()
    text = printer.print_func(func)
    head, sep, rest = text.partition("(")
    return "kfc.func @_(" + rest if sep and head.startswith("kfc.func @") else text


def op_fingerprint(func: FuncOp) -> str:
    """16 hex characters; equal for functions that differ only in value names or the function's name."""
    return hashlib.sha256(canonical_text(func).encode()).hexdigest()[:FINGERPRINT_LEN]


def is_fingerprint(text: str) -> bool:
    return len(text) == FINGERPRINT_LEN and all(c in "0123456789abcdef" for c in text.lower())


def op_features(func: FuncOp) -> dict[str, Any]:
    """Counts of op kinds by name and a few summary numbers; plain JSON types only."""
    counts: Counter[str] = Counter()
    reduce_kinds: set[str] = set()
    max_rank = 0
    for op in func.body.ops:
        for o in op.walk():
            counts[o.NAME] += 1
            if o.NAME == "tile.reduce":
                kind = getattr(o, "kind", None)
                reduce_kinds.add(str(getattr(kind, "value", kind)))
            for v in o.results:
                t = v.type
                if isinstance(t, TensorType) and t.space is not MemSpace.GLOBAL:
                    max_rank = max(max_rank, t.rank)
    return {
        "ops": dict(sorted(counts.items())),
        "reductions": counts.get("tile.reduce", 0),
        "reduce_kinds": sorted(reduce_kinds),
        "scans": counts.get("tile.scan", 0),
        "loads": counts.get("tile.load", 0),
        "stores": counts.get("tile.store", 0),
        "has_dot": counts.get("tile.dot", 0) > 0,
        "loops": counts.get("tile.for", 0),
        "max_rank": max_rank,
        "inputs": [str(v.ttype.dtype) for v in func.inputs],
        "outputs": [str(v.ttype.dtype) for v in func.outputs],
    }

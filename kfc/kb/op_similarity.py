"""How alike two ops are, from their `op_features` summaries (kfc.kb.fingerprint): plain
arithmetic on JSON, so the knowledge base can rank similar ops without loading the IR."""

from __future__ import annotations

import math
from typing import Any


def _cosine(a: dict[str, float], b: dict[str, float]) -> float:
    if not a and not b:
        return 1.0
    dot = sum(x * b.get(k, 0) for k, x in a.items())
    na = math.sqrt(sum(x * x for x in a.values()))
    nb = math.sqrt(sum(x * x for x in b.values()))
    if na == 0 or nb == 0:
        return 0.0
    return dot / (na * nb)


def similarity(a: dict[str, Any], b: dict[str, Any]) -> float:
    """How alike two ops are, in [0, 1]: 0.7 · cosine of the op-count vectors, plus 0.1 each for
    the same number of reductions, the same presence of a `tile.dot`, and the same number of
    sequential loops. Identical features give 1.0; missing keys count as empty/zero."""
    if a == b:
        return 1.0
    cos = _cosine(dict(a.get("ops") or {}), dict(b.get("ops") or {}))
    score = 0.7 * max(0.0, min(1.0, cos))
    score += 0.1 * (a.get("reductions", 0) == b.get("reductions", 0))
    score += 0.1 * (bool(a.get("has_dot")) == bool(b.get("has_dot")))
    score += 0.1 * (a.get("loops", 0) == b.get("loops", 0))
    return round(max(0.0, min(1.0, score)), 6)

"""The knowledge base: every tuning experiment with its provenance (SQLite), op fingerprints and
similarity, and a graph of pass sequences with payoff statistics for policies to read.

The names below are loaded from their modules on first use: kfc.kb.fingerprint pulls kfc.ir (and
ml_dtypes, ~2 s) and kfc.kb.graph networkx (~0.3 s), and `kfc --help` imports kfc.kb.cli, which
needs neither."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .fingerprint import op_features, op_fingerprint
    from .graph import END, START, best_steps, paying_steps, pipeline_graph, step_payoff
    from .op_similarity import similarity
    from .store import SCHEMA_VERSION, KnowledgeBase, canonical_shape, default_path

_HOME = {
    "op_features": "fingerprint", "op_fingerprint": "fingerprint", "similarity": "op_similarity",
    "END": "graph", "START": "graph", "best_steps": "graph", "paying_steps": "graph", "pipeline_graph": "graph",
    "step_payoff": "graph",
    "SCHEMA_VERSION": "store", "KnowledgeBase": "store", "canonical_shape": "store", "default_path": "store",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value
    return value

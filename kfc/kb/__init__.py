"""The knowledge base: every tuning experiment with its provenance (SQLite), op fingerprints and
similarity, and a graph of pass sequences with payoff statistics for policies to read."""

from .fingerprint import op_features, op_fingerprint, similarity
from .graph import END, START, best_steps, paying_steps, pipeline_graph, step_payoff
from .store import SCHEMA_VERSION, KnowledgeBase, canonical_shape, default_path

__all__ = [
           "END",
           "SCHEMA_VERSION",
           "START",
           "KnowledgeBase",
           "best_steps",
           "paying_steps",
           "canonical_shape",
           "default_path",
           "op_features",
           "op_fingerprint",
           "pipeline_graph",
           "similarity",
           "step_payoff",
]

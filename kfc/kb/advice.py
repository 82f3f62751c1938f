"""The knowledge base at compile time: the recorded pipeline to start an op from, when none is
given (kfc compile and kfc.load, from the knowledge base named or the default one where it
exists; --no-kb and kb=False turn it off). The record is the nearest one by what the program
does, not by its name: this op's own tunes first, then those of ops whose features are alike
(kfc.kb.op_similarity), most alike first; within an op, the shape nearest to the one compiled
(by the ratio of each dim) and then the largest speedup over that op's default. Only records
that beat their op's default by at least MIN_SPEEDUP as a user calls them (eagerly, L2 flushed:
Outcome.eager_speedup) count: a pipeline no faster than the default teaches nothing, and one
faster only back to back did not carry over (below). Records of tunes that timed only back to
back (a knowledge base older than the eager figure) give no advice."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import attrs

from ..ir.func import FuncOp
from . import postgres
from ..diagnostics import KfcError
from .database import default_path, reporting_damage
from .fingerprint import op_features, op_fingerprint
from .rows import shape_distance
from .store import KnowledgeBase


# Measured on the H200 for an rmsnorm-like op the knowledge base had never seen: rmsnorm's best
# of a 6-candidate tune at 32768x4096 (1.025x its default as the tuner times kernels, back to
# back) ran 1-3% faster than the default in CUDA graphs but 5-8% slower eagerly (L2 flushed
# before each call) at 32768x4096, 16384x4096 and 8192x8192; its best of 8 at 65536x1024
# (1.10x) ran 1-3% slower eagerly there and 9% slower at 16384x2048. So a record counts by its
# eager speedup, which the gate records beside the back-to-back one.
MIN_SPEEDUP = 1.05


@attrs.frozen
class Advice:
    pipeline: str
    candidate_id: int
    op_name: str
    similarity: float        # 1.0 for the op's own records
    shape: dict[str, int]    # the shape the record was timed at
    speedup: float           # over its op's default pipeline, eagerly, as measured then

    def describe(self) -> str:
        whose = "this op's" if self.similarity >= 1.0 else f"{self.op_name}'s (similarity {self.similarity:.2f})"
        shape = ", ".join(f"{k}={v}" for k, v in self.shape.items())
        return f"candidate {self.candidate_id}, {whose} tune at {shape}, {self.speedup:.2f}x its default eagerly"


def nearest_advice(kb: KnowledgeBase, func: FuncOp, target: str, dims: dict[str, int]) -> Advice | None:
    """The record to start `func` from at `dims` on `target`, or None when the knowledge base
    holds none that beat its op's default."""
    fingerprint = op_fingerprint(func)
    ops: list[tuple[int, str, float]] = []
    own = kb.op_by_fingerprint(fingerprint)
    if own is not None:
        ops.append((own["id"], own["name"], 1.0))
    ops += kb.similar_ops(op_features(func), k=1_000_000, exclude_fingerprint=fingerprint)
    for op_id, name, similarity in ops:
        trials = [t for t in kb.trials(op_id=op_id, target=target)
                  if t.outcome.eager_us is not None and (t.outcome.eager_speedup or 0.0) >= MIN_SPEEDUP]
        if not trials:
            continue
        shapes = {c["id"]: c["shape"] for c in kb.candidates(op_id=op_id, target=target)}
        best = min(trials, key=lambda t: (shape_distance(shapes[t.candidate_id], dims), -t.outcome.eager_speedup,
                                          t.candidate_id))
        return Advice(best.proposal.pipeline, best.candidate_id, name, similarity, shapes[best.candidate_id],
                      best.outcome.eager_speedup)
    return None


def advise_from(location: str | os.PathLike | None, func: FuncOp, target: str, dims: dict[str, int]) -> Advice | None:
    """advise from the knowledge base named (an error where it cannot be read), else from the default one."""
    return advise(location, func, target, dims) if location else advise_by_default(func, target, dims)


_UNREADABLE: set[str] = set()  # default knowledge bases found unreadable, said once each
_UNREADABLE_LOCK = threading.Lock()  # kfc package and kfc warm advise from several threads


def advise_by_default(func: FuncOp, target: str, dims: dict[str, int]) -> Advice | None:
    """advise from the default knowledge base, which nobody named: where it cannot be read (damaged,
    of a newer kfc, a server down) that is said once on stderr and the default pipeline serves."""
    where = default_path()
    try:
        return advise(where, func, target, dims)
    except KfcError as e:
        with _UNREADABLE_LOCK:
            said = str(where) in _UNREADABLE
            _UNREADABLE.add(str(where))
        if not said:
            print(f"kfc: not using the default knowledge base {where}: {e.message.splitlines()[0]} "
                  "(--no-kb or kfc.load(kb=False) stops reading it)", file=sys.stderr)
        return None


def advise(location: str | os.PathLike, func: FuncOp, target: str, dims: dict[str, int]) -> Advice | None:
    """nearest_advice from the knowledge base at `location` (a file or a postgresql:// URL), or
    None where no file is there."""
    where = str(location) if postgres.is_url(str(location)) else Path(location)
    if isinstance(where, Path) and not where.is_file():
        return None
    kb = KnowledgeBase(where, create=False)
    try:
        with reporting_damage(where):
            return nearest_advice(kb, func, target, dims)
    finally:
        kb.close()


"""The factory's vocabulary: what a candidate is, how far it got, and what a policy must do.

A candidate is a pipeline string for one op instance, target and shape; its outcome records the
furthest stage it reached and, once timed, its median time. Policies see the op's features,
the space of choices, the history of this run and what the knowledge base knows, and propose
pipeline strings with a rationale. Nothing a policy says bypasses the verifier or the gate.
"""

from __future__ import annotations

import enum
from typing import Any, Protocol, Sequence

import attrs


class Stage(enum.Enum):
    """How far a candidate got, in order."""

    PROPOSED = "proposed"
    PARSED = "parsed"        # the pipeline string parsed
    VERIFIED = "verified"    # every pass ran and verified
    COMPILED = "compiled"    # nvcc/ptxas built it without spills
    CORRECT = "correct"      # passed every correctness defence of the gate
    TIMED = "timed"          # timed, and the timed outputs re-checked

    @property
    def rank(self) -> int:
        return list(Stage).index(self)


@attrs.frozen
class Proposal:
    pipeline: str
    rationale: str = ""
    proposer: str = ""
    parent: int | None = None  # the candidate id this one mutates, if any


@attrs.frozen
class Outcome:
    stage: Stage
    error: str = ""
    registers: int | None = None
    spills: int | None = None
    smem_bytes: int | None = None
    median_us: float | None = None
    spread_us: float | None = None       # p90 - p10 of the timed replays
    bytes_moved: int | None = None
    flops: int | None = None
    roofline_fraction: float | None = None
    speedup: float | None = None         # over the default pipeline, same shape, same run
    times_us: tuple[float, ...] = ()
    notes: str = ""


@attrs.frozen
class Trial:
    """One evaluated candidate, as a policy sees the history."""

    candidate_id: int
    proposal: Proposal
    outcome: Outcome
    op_id: int | None = None   # the knowledge base's id of the op it ran for, where known


@attrs.frozen
class TuneContext:
    """What a policy is told when asked for proposals."""

    op_name: str
    op_fingerprint: str
    features: dict[str, Any]
    target: str
    shape: dict[str, int]
    space: Any                      # kfc.factory.space.SearchSpace
    history: tuple[Trial, ...]      # this run's trials so far, oldest first
    prior: tuple[Trial, ...] = ()   # from the knowledge base: this op's and similar ops' best trials
    lessons: tuple[str, ...] = ()

    def graph(self):
        """The pass-sequence graph (kfc.kb.graph) over the history and the prior, with payoff
        statistics per step and transition; speedups are each over their own op's baseline, so
        they compare across ops."""
        from ..kb.graph import pipeline_graph

        own = {t.candidate_id for t in self.history}
        return pipeline_graph(list(self.history) + [t for t in self.prior if t.candidate_id not in own])


class Policy(Protocol):
    name: str

    def propose(self, ctx: TuneContext, n: int) -> Sequence[Proposal]:
        """Up to n new pipelines to try (the caller drops ones already tried)."""

    def reflect(self, ctx: TuneContext, trials: Sequence[Trial]) -> Sequence[str]:
        """Lessons (short texts) drawn from the latest trials; may be empty."""

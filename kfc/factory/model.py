"""What a policy is told and what it must do (the records it reads are kfc.model.records).

Policies see the op's features, the space of choices, the history of this run and what the
knowledge base knows, and propose pipeline strings with a rationale. Nothing a policy says bypasses the verifier or the gate.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import attrs

from ..model.records import Proposal, Trial
from ..kb.graph import pipeline_graph


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
        own = {t.candidate_id for t in self.history}
        return pipeline_graph(list(self.history) + [t for t in self.prior if t.candidate_id not in own])


class Policy(Protocol):
    name: str

    def propose(self, ctx: TuneContext, n: int) -> Sequence[Proposal]:
        """Up to n new pipelines to try (the caller drops ones already tried)."""

    def reflect(self, ctx: TuneContext, trials: Sequence[Trial]) -> Sequence[str]:
        """Lessons (short texts) drawn from the latest trials; may be empty."""

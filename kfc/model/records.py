"""The factory's records: what a candidate is and how far it got.

A candidate is a pipeline string for one op instance, target and shape; its outcome records the
furthest stage it reached and, once timed, its median time. The factory writes them, the
knowledge base stores them and both read them back.
"""

from __future__ import annotations

import enum

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
    # as a user calls it: one call at a time, L2 flushed before each (the eager headline figure)
    eager_us: float | None = None
    eager_speedup: float | None = None   # over the default pipeline's eager time, same shape, same run


@attrs.frozen
class Trial:
    """One evaluated candidate, as a policy sees the history."""

    candidate_id: int
    proposal: Proposal
    outcome: Outcome
    op_id: int | None = None   # the knowledge base's id of the op it ran for, where known
    # the shape it ran at, where the knowledge base says (a prior trial may be of another shape)
    shape: dict[str, int] | None = attrs.field(default=None, eq=False)

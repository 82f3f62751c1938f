"""Between the knowledge base's rows and kfc's records: shapes and JSON as the tables store them,
rows decoded into dicts, Outcomes, Proposals and Trials, and pipelines in canonical text.

Shapes are dicts of dim → int stored as canonical JSON (sorted keys, no spaces), so equal
shapes compare equal as text.
"""

from __future__ import annotations

import math

import json
import numbers
import sqlite3
from datetime import UTC, datetime
from typing import Any

from ..diagnostics import KfcError
from ..model.records import Outcome, Proposal, Stage, Trial
from .schema import JSON_COLUMNS


def shape_distance(a: dict[str, int], b: dict[str, int]) -> float:
    """How far two shapes are: the sum over dims both name of |log2 of their ratio|, plus one per
    dim only one of them names."""
    common = set(a) & set(b)
    return sum(abs(math.log2(max(a[d], 1) / max(b[d], 1))) for d in common) + len(set(a) ^ set(b))


def canonical_shape(shape: dict[str, int] | None) -> str:
    """A shape as the text the knowledge base stores: `{"M":32768,"N":4096}`."""
    if shape is None:
        shape = {}
    if not isinstance(shape, dict):
        raise KfcError(f"a shape is a dict of dimension name to size, not {shape!r}", hint='e.g. {"N": 4096}')
    out = {}
    for k, v in shape.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise KfcError(f"bad shape entry {k!r}: {v!r}",
                           hint='a shape maps dimension names to ints, e.g. {"N": 4096}')
        out[k] = int(v)
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def now_utc() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def to_json(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise KfcError(f"{what} must be JSON-able: {e}") from None


DAMAGED_HINT = ("the file was changed outside kfc or torn: restore it from a backup, or give --kb a new "
                 "file (kfc tune fills it again)")


def from_json(text: str, column: str, row_id: Any) -> Any:
    """A JSON column's value, or one clear error naming the column and row that hold garbage."""
    try:
        return json.loads(text)
    except ValueError as e:
        raise KfcError(f"the knowledge base is damaged: column {column} of row {row_id} is not JSON "
                       f"({getattr(e, 'msg', e)}): {text[:60]!r}", hint=DAMAGED_HINT) from None


def decode_row(row: sqlite3.Row) -> dict[str, Any]:
    out = {}
    keys = row.keys()
    for k in keys:
        v = row[k]
        if k in JSON_COLUMNS and isinstance(v, str):
            v = from_json(v, k, row["id"] if "id" in keys else "?")
        out[k] = v
    return out


def outcome_of(row: sqlite3.Row) -> Outcome:
    try:
        stage = Stage(row["stage"])
    except ValueError:
        raise KfcError(f"candidate {row['candidate_id']} has an unknown stage {row['stage']!r}",
                       hint="the knowledge base was written by another version of kfc") from None
    return Outcome(
        stage=stage, error=row["error"], registers=row["registers"], spills=row["spills"],
        smem_bytes=row["smem_bytes"], median_us=row["median_us"], spread_us=row["spread_us"],
        bytes_moved=row["bytes_moved"], flops=row["flops"], roofline_fraction=row["roofline_fraction"],
        speedup=row["speedup"], times_us=tuple(from_json(row["times_us"] or "[]", "times_us", row["candidate_id"])),
        notes=row["notes"], **{k: row[k] if k in row.keys() else None for k in ("eager_us", "eager_speedup")})


def proposal_of(row: sqlite3.Row) -> Proposal:
    return Proposal(pipeline=row["pipeline"], rationale=row["rationale"], proposer=row["proposer"],
                    parent=row["parent_id"])


def trial_of(row: sqlite3.Row) -> Trial:
    shape = from_json(row["shape"], "shape", row["id"]) if "shape" in row.keys() and row["shape"] else None
    return Trial(candidate_id=row["id"], proposal=proposal_of(row), outcome=outcome_of(row), op_id=row["op_id"],
                 shape=shape)


TRIAL_SELECT = """
SELECT c.id, c.op_id, c.shape, c.pipeline, c.rationale, c.proposer, c.parent_id, o.*
FROM candidates c JOIN outcomes o ON o.candidate_id = c.id
"""


def canonical_pipeline(text: str) -> str | None:
    from ..passes.base import PassError  # lazy: kfc.passes pulls kfc.ir, ml_dtypes ~2 s; kfc.kb.store stays light
    from ..passes.pipeline import parse_pipeline  # lazy: kfc.passes pulls kfc.ir, ml_dtypes ~2 s; kfc.kb.store stays light

    try:
        return str(parse_pipeline(text))
    except (PassError, KfcError, ValueError, TypeError):
        return None

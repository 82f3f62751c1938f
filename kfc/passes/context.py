"""What a pass run is given and leaves behind: the target, the op's check block, what
--verify-each runs on, printing and dump settings, and the notes, timings and statistics the
passes record."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

import attrs

from ..model.target import Target


@attrs.define
class VerifyEach:
    """What --verify-each runs the IR on: dims to specialise symbols to, the check block's
    input generators and tolerances, and seeds."""

    dims: dict[str, int]
    check: Any = None  # a CheckSpec, or None for the defaults
    seeds: tuple[int, ...] = (0,)


@attrs.define
class PassContext:
    target: Target
    check: Any = None  # the op's CheckSpec: passes read its tolerances
    verify_each: VerifyEach | None = None
    print_ir_after_all: bool = False
    print_ir_before: frozenset[str] = frozenset()
    print_ir_after: frozenset[str] = frozenset()
    timing: bool = False
    dump_dir: Path | None = None
    out: TextIO = attrs.field(factory=lambda: sys.stderr)
    notes: list[tuple[str, str]] = attrs.Factory(list)
    timings: list[tuple[str, float]] = attrs.Factory(list)
    stats: dict[str, Any] = attrs.Factory(dict)

    def note(self, p, message: str, stats: Any = None) -> None:
        self.notes.append((str(p), message))
        if stats is not None:
            self.stats[str(p)] = stats

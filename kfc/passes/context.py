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
    where: str = ""  # what the dims the pipeline runs at came from, for specialisation's errors
    stages: list | None = None  # given a list, the manager appends (pass, IR after it) for each pass
    dump_dir: Path | None = None
    out: TextIO = attrs.field(factory=lambda: sys.stderr)
    notes: list[tuple[str, str]] = attrs.Factory(list)
    timings: list[tuple[str, float]] = attrs.Factory(list)
    stats: dict[str, Any] = attrs.Factory(dict)
    # every rewrite that may change results within the op's tolerance: (pass, what, where)
    approximations: list[tuple[str, str, str]] = attrs.Factory(list)

    def approximated(self, p, what: str, loc) -> None:
        self.approximations.append((str(p), what, str(loc) if loc is not None else "?"))

    def note(self, p, message: str, stats: Any = None) -> None:
        self.notes.append((str(p), message))
        if stats is not None:
            self.stats[str(p)] = stats

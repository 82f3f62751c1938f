"""Pattern rewriting: `match_and_rewrite(op, rewriter)` with an explicit benefit, and a greedy
driver that applies the patterns until nothing changes (or an iteration cap is hit).

A pattern never mutates: it asks the rewriter to create ops and to replace the matched op's
results; if it then returns False the rewriter drops what it created. A pattern that does not
apply says why with `rewriter.fail(reason)`; the reasons are kept for `--debug` output.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar, Sequence

import attrs

from ..diagnostics import Span
from ..ir.core import Op, Value
from ..ir.func import FuncOp
from ..ir.rewrite import ValueMap, rebuild
from ..ir.types import Type


class PatternRewriter:
    def __init__(self, root: Op, defs: dict[Value, Op]) -> None:
        self.root = root
        self._defs = defs
        self.created: list[Op] = []
        self.replacement: list[Value] | None = None
        self.erased = False
        self.reason: str | None = None

    # --- queries ------------------------------------------------------------------------------
    def defining_op(self, v: Value) -> Op | None:
        return self._defs.get(v)

    # --- actions ------------------------------------------------------------------------------
    def create(self, cls: type[Op], operands: Sequence[Value], result_types: Sequence[Type] | None = None,
               loc: Span | None = None, **attributes) -> Op:
        if result_types is None:
            result_types = cls.infer_result_types([v.type for v in operands], attributes)
            assert result_types is not None, f"{cls.NAME} needs explicit result types"
        results = tuple(Value(t) for t in result_types)
        op = cls(operands=tuple(operands), results=results, loc=loc or self.root.loc, **attributes)
        self.created.append(op)
        for r in results:
            self._defs[r] = op
        return op

    def replace(self, values: Sequence[Value]) -> bool:
        if len(values) != len(self.root.results):
            raise ValueError(f"{self.root.NAME} has {len(self.root.results)} results, replaced with {len(values)}")
        self.replacement = list(values)
        return True

    def erase(self) -> bool:
        self.erased = True
        return True

    def fail(self, reason: str) -> bool:
        self.reason = reason
        return False


class RewritePattern:
    ROOT: ClassVar[type[Op] | tuple[type[Op], ...] | None] = None  # the op classes it may match
    BENEFIT: ClassVar[int] = 1

    @property
    def name(self) -> str:
        return type(self).__name__

    def match_and_rewrite(self, op: Op, rewriter: PatternRewriter) -> bool:
        raise NotImplementedError


@attrs.define
class RewriteStats:
    iterations: int = 0
    applied: Counter = attrs.Factory(Counter)
    failures: Counter = attrs.Factory(Counter)  # (pattern, reason) -> count
    converged: bool = True


def apply_patterns_greedily(func: FuncOp, patterns: Sequence[RewritePattern], max_iterations: int = 16,
                            stats: RewriteStats | None = None) -> FuncOp:
    stats = stats if stats is not None else RewriteStats()
    ordered = sorted(patterns, key=lambda p: -p.BENEFIT)
    for _ in range(max_iterations):
        stats.iterations += 1
        changed = False
        defs: dict[Value, Op] = {}

        def transform(op: Op, vmap: ValueMap):
            nonlocal changed
            for p in ordered:
                if p.ROOT is not None and not isinstance(op, p.ROOT):
                    continue
                rw = PatternRewriter(op, defs)
                if p.match_and_rewrite(op, rw):
                    if rw.replacement is not None:
                        vmap.map_all(op.results, rw.replacement)
                    elif not rw.erased:
                        raise RuntimeError(f"pattern {p.name} matched but neither replaced nor erased {op.NAME}")
                    stats.applied[p.name] += 1
                    changed = True
                    return rw.created
                if rw.created:
                    raise RuntimeError(f"pattern {p.name} created ops and then failed: patterns must not "
                                       "build before they know they apply")
                if rw.reason:
                    stats.failures[(p.name, rw.reason)] += 1
            for r in op.results:
                defs[r] = op
            return None

        func = rebuild(func, transform)
        if not changed:
            return func
    stats.converged = False
    return func

"""The code generator's emission rules, keyed by op class.

Each rule is a function `(emitter, op) -> None` that writes the op's C++ through the emitter
(kfc.codegen.emitter), declared next to the rules of its family:

    elementwise_rules   constants, iota, dims, unary, binary, compare, where, casts, broadcasts
    memory_rules        ptx.ld / ptx.st: vector loads and stores of rows, guarded scalar accesses
    smem_rules          shared-memory buffers, mbarriers, bulk copies and their waits
    reduction_rules     the thread, warp, CTA and cluster steps of a row reduction
    pair_rules          the same steps of a (max, sum of exp) pair
    scan_rules          scans along a row
    control_rules       for and if
    row_launch          gpu.launch over rows: the row loop, fused chunk loops, sums across rows

An op without a rule of its own takes its nearest base class's (every elementwise unary op
takes UnaryOp's); `rule_for(op)` finds it, so the emitter never dispatches on class names.
"""

from __future__ import annotations

from typing import Callable

from ..ir.core import Op

Rule = Callable[..., None]
RULES: dict[type, Rule] = {}


def rule(*op_classes: type):
    """Register the decorated function as the emission rule of these op classes."""
    def register(fn: Rule) -> Rule:
        for cls in op_classes:
            if cls in RULES:
                raise ValueError(f"{cls.__name__} has two emission rules: {RULES[cls].__name__} and {fn.__name__}")
            RULES[cls] = fn
        return fn
    return register


def rule_for(op: Op | type) -> Rule | None:
    """The rule that emits this op (its class's, else its nearest base class's), or None."""
    cls = op if isinstance(op, type) else type(op)
    return next((RULES[c] for c in cls.__mro__ if c in RULES), None)

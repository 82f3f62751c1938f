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
A rule also says what its code does that the code around it must know (`synchronises`: it
exchanges values through shared slots indexed by kfc_phase and bar.sync; `in_cluster`: it
exchanges them with the cluster's other CTAs), asked through `synchronises(op)` and
`in_cluster(op)`, so no list of op classes elsewhere has to remember them.
"""

from __future__ import annotations

from typing import Callable

from ..ir.core import Op

Rule = Callable[..., None]
RULES: dict[type, Rule] = {}


def rule(*op_classes: type, synchronises: bool = False, in_cluster: bool = False):
    """Register the decorated function as the emission rule of these op classes."""
    def register(fn: Rule) -> Rule:
        fn.synchronises = synchronises or in_cluster
        fn.in_cluster = in_cluster
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


def synchronises(op: Op) -> bool:
    """Whether the op's code synchronises the CTA through shared slots alternating with kfc_phase."""
    return getattr(rule_for(op), "synchronises", False)


def in_cluster(op: Op) -> bool:
    """Whether the op's code exchanges values with the other CTAs of the cluster."""
    return getattr(rule_for(op), "in_cluster", False)

"""What an index scalar is known to be a multiple of, from how the IR computes it: the alignment
a vector access needs (kfc.passes.tile's row vectors, the tile emitter's 16-byte groups)."""

from __future__ import annotations

import math
from typing import Callable

from .core import Op, Value
from .tile_ops import BinaryOp, CastOp, ConstOp, ForOp


def known_multiple(v: Value, owner: Callable[[Value], Op | None],
                   loop_of: Callable[[Value], ForOp | None] = lambda v: None) -> int:
    """A number every value of scalar v is a multiple of: a constant; a sum or difference of
    such (their gcd); a product (its factors' product); an integer cast of one; a `for` loop's
    index (`loop_of` the loop whose index v is) that starts at such a multiple and steps by a
    constant. 1 where nothing is known. `owner` gives the op that defines a value, or None."""
    op = owner(v)
    if isinstance(op, ConstOp) and isinstance(op.value, int):
        return abs(op.value)
    if op is not None and op.results and op.result.ttype.is_scalar and op.result.ttype.dtype.is_int:
        if isinstance(op, BinaryOp) and op.NAME in ("tile.add", "tile.sub", "tile.mul"):
            a, b = (known_multiple(x, owner, loop_of) for x in op.operands)
            return a * b if op.NAME == "tile.mul" else math.gcd(a, b)
        if isinstance(op, CastOp) and not op.operands[0].ttype.dtype.is_float:
            return known_multiple(op.operands[0], owner, loop_of)
    loop = loop_of(v)
    if loop is None:
        return 1
    step = owner(loop.operands[2])
    return math.gcd(known_multiple(loop.operands[0], owner, loop_of),
                    step.value if isinstance(step, ConstOp) and isinstance(step.value, int) else 1)


def power_of_two(n: int | None) -> int | None:
    """k where n = 2^k, else None (a division by it is a shift; kfc.codegen's emitters)."""
    return n.bit_length() - 1 if n is not None and n > 0 and n & (n - 1) == 0 else None

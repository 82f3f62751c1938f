"""tri-inv-doubling: tile.tri_inv of a C x C tile, C a power of two, as products:

    (I + L)^-1 = I + N + N^2 + ... + N^(C-1) = (I + N)(I + N^2)(I + N^4) ... (I + N^(C/2))

with L the tile's strict lower part and N = -L (strictly lower, so N^C = 0). Written as

    %n = tile.where (tile.tri {k = -1}), -%x, 0.0      %p = I + %n
    %n2 = tile.dot %n, %n     %p = %p + tile.dot %p, %n2     (and so on, log2(C) - 1 times)

Forward substitution (the op's meaning, and lower-tri-inv) is C dependent row updates that a
code generator runs a column a thread; here every step is a C x C product that a CTA runs whole
(on tensor cores where tf32-dots takes it). KDA's prepare kernel waits a quarter of its time
behind its forward substitution (docs/kda.md). The sums run in another order, so results move
by rounding: the final IR says what the GPU computes, the op's check bounds how far it may be
from the reference, and `--verify-each` compares the two before and after the pass. Not in a
default pipeline yet: `-p "...,tri-inv-doubling,..."` before tf32-dots.
"""

from __future__ import annotations

from ..ir.builder import Builder
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.rewrite import rebuild
from ..ir.tile_ops import TriInvOp
from .base import Pass, define_pass


def doubling_steps(size: int) -> int | None:
    """The squarings a C x C inverse takes (log2(C) - 1), or None where C is no power of two."""
    if size < 2 or size & (size - 1):
        return None
    return size.bit_length() - 2


@define_pass("tri-inv-doubling", "tile.tri_inv of a power-of-two tile as products (I + N)(I + N^2)(I + N^4)...")
class TriInvDoubling(Pass):
    def run(self, func: FuncOp, ctx) -> FuncOp:
        done, left = 0, 0

        def transform(op, vmap):
            nonlocal done, left
            if not isinstance(op, TriInvOp):
                return None
            x = op.operands[0]
            size = x.ttype.shape[0]
            steps = doubling_steps(size)
            if steps is None:
                left += 1
                return None
            done += 1
            b = Builder()
            with b.at(op.loc), b.region() as ops:
                rows = b.iota(size)
                eye = b.cast(b.cmp("eq", b.expand_dims(rows, [1]), b.expand_dims(rows, [0])), DType.F32, name="eye")
                power = b.where(b.tri(size, size, True, -1), b.binary("sub", 0.0, x), 0.0, name="n")
                inverse = b.binary("add", eye, power)
                for _ in range(steps):
                    power = b.dot(power, power)                       # N^(2^s)
                    inverse = b.binary("add", inverse, b.dot(inverse, power))  # times (I + N^(2^s))
            vmap.map(op.result, inverse)
            return ops

        out = rebuild(func, transform)
        if done:
            ctx.note(self, f"{done} triangular inverse(s) as products by doubling")
        if left:
            ctx.note(self, f"{left} triangular inverse(s) of a size no power of two left as they are")
        return out

"""lower-tri-inv: tile.tri_inv, the inverse of a unit lower-triangular tile, as forward
substitution on tile ops a code generator already knows:

    %y = tile.tri_inv %x        ->      %strict = tile.where (tile.tri {k = -1}), %x, 0.0
                                        %eye    = f32(iota[:, None] == iota[None, :])
                                        %y = tile.for %i = 1 to C carry (%a = %eye) {
                                          %pick = iota[:, None] == %i
                                          %li   = tile.reduce sum (tile.where %pick, %strict, 0.0), axis 0
                                          yield tile.where %pick, %a - tile.dot(%li[None, :], %a), %a
                                        }

Row i of the result is e_i minus row i of the strict lower part times the rows above it; the
rows above i are final when row i is built. The interpreter computes tile.tri_inv the same way
(kfc.ir.tile_ops.matmul.TriInvOp), so the rewrite changes no result. KDA's chunk solve
(kernels/kda_fwd.kfc) is the op's user; tri-inv-doubling (kfc/passes/tri_inv_doubling.py)
writes a power-of-two tile's inverse as products instead.
"""

from __future__ import annotations

from ..ir.builder import Builder
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.rewrite import rebuild
from ..ir.tile_ops import TriInvOp
from .base import Pass, define_pass


@define_pass("lower-tri-inv", "tile.tri_inv as forward substitution on tile ops (a loop of row updates)")
class LowerTriInv(Pass):
    def run(self, func: FuncOp, ctx) -> FuncOp:
        count = 0

        def transform(op, vmap):
            nonlocal count
            if not isinstance(op, TriInvOp):
                return None
            count += 1
            b = Builder()
            x = op.operands[0]
            size = x.ttype.shape[0]
            with b.at(op.loc), b.region() as ops:
                rows = b.iota(size)
                col, row = b.expand_dims(rows, [1]), b.expand_dims(rows, [0])
                strict = b.where(b.tri(size, size, True, -1), x, 0.0, name="strict")
                eye = b.cast(b.cmp("eq", col, row), DType.F32, name="eye")
                with b.for_(1, size, 1, carried=[eye], iv_name="i") as loop:
                    a = loop.carried[0]
                    pick = b.cmp("eq", col, loop.iv, name="pick")
                    li = b.reduce("sum", b.where(pick, strict, 0.0), 0, name="li")
                    updated = b.binary("sub", a, b.dot(b.expand_dims(li, [0]), a))
                    loop.yielded = (b.where(pick, updated, a),)
            vmap.map(op.result, loop.results[0])
            return ops

        out = rebuild(func, transform)
        if count:
            ctx.note(self, f"{count} triangular inverse(s) as forward substitution")
        return out

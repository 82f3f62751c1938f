"""bf16-dots: the f32 products of a tile kernel on tensor cores, operands in bf16.

    %d = tile.dot %a, %b : (f32[16, 128], f32[128, 128])   ->   %d = tile.dot %a, %b {precision = "bf16"}

As tf32-dots, for products of whole m16n8k16 tiles (the contraction a multiple of 16): the
operands are rounded to bf16 (7 of f32's 23 mantissa bits, to nearest, ties to even) and the
products summed in f32, which is what `mma.sync.m16n8k16.f32.bf16` computes from two operands
packed a register by `cvt.rn.bf16x2.f32`; the interpreter rounds the same way
(kfc.ir.tile_ops.matmul.round_bf16). A product on m16n8k16 issues half the instructions of
m16n8k8 and packs two operands a register, FlashKDA's form; each operand moves by up to 2^-9 of
itself, four times TF32's, so the pass is not in the default pipeline: it runs before tf32-dots,
which takes what it leaves, where `kfc check` shows the op's tolerance holds:

    kfc compile kernels/kda_prepare_flashkda.kfc \\
        -p approx-math,canonicalize,cse,dce,hoist-loads,sink-stores,bf16-dots,tf32-dots
"""

from __future__ import annotations

from ..ir.func import FuncOp
from .base import Pass, define_pass
from .tf32_dots import mark_products

MMA_K_BF16 = 16  # mma.sync.m16n8k16 with bf16 operands
# the least output tolerance bf16 operands are used under: at 1e-2 kfc check of a product of 32
# terms failed 1 of 800 comparisons (an element past tol (|ref| + rms(ref))), at 2e-2 none; KDA's
# 5e-3 does not hold (docs/kda.md)
BF16_TOLERANCE = 2e-2


@define_pass("bf16-dots", "f32 tile.dot of whole 16x8x16 tiles in a tile kernel on tensor cores, operands in bf16")
class Bf16Dots(Pass):
    def run(self, func: FuncOp, ctx) -> FuncOp:
        return mark_products(self, func, ctx, "bf16", MMA_K_BF16, BF16_TOLERANCE, "bf16 (7 mantissa bits)")

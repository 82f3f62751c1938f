"""tf32-dots: the f32 products of a tile kernel on tensor cores, in TF32.

    %d = tile.dot %a, %b : (f32[16, 128], f32[128, 128])   ->   %d = tile.dot %a, %b {precision = "tf32"}

Each tile.dot of f32 tiles inside a tile.parallel whose product is made of whole m16n8k8 tiles
(M a multiple of 16, N of 8, the contraction of 8) takes precision tf32: its operands are rounded
to TF32 (10 of f32's 23 mantissa bits) and the products summed in f32, which is what
`mma.sync.m16n8k8.f32.tf32` computes; the tile emitter then writes it on tensor cores. The
interpreter rounds the operands the same way (kfc.ir.tile_ops.matmul.round_tf32), so the final IR
still says what the GPU computes. Each operand moves by at most 2^-11 of itself, a product's sum by
about 1e-3 of its terms' scale at worst: the pass applies only where every floating-point output
is checked with a tolerance of at least TF32_TOLERANCE (KDA's and examples/linear_attention.kfc's
5e-3), and keeps the products in f32, with a note, where the op asks for more. Integer and
bf16/f16 products are exact on tensor cores already and are left as they are, as are row
programs' dots (one row) and a whole-tensor matrix product (top level, accelerate-matmul's).
With split=3 each operand is taken as two TF32 values, x's rounding and what that left rounded,
and each step issues three products (precision "tf32x3", 3xTF32): f32's accuracy, for ops
checked to TF32X3_TOLERANCE.
"""

from __future__ import annotations

import attrs

from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.rewrite import rebuild
from ..ir.tile_ops import DotOp, ParallelOp
from .base import Pass, define_pass, option
from .lower_ptx import ctx_tolerance

MMA_M, MMA_N, MMA_K = 16, 8, 8  # mma.sync.m16n8k8 with TF32 operands
TF32_TOLERANCE = 5e-3  # the least output tolerance TF32 operands are used under
# ... and 3xTF32's: its products were within 4e-6 of float64's (relative to their RMS) at
# contractions of 16 to 256 on normal operands, as f32's own (tests/test_tf32x3.py)
TF32X3_TOLERANCE = 1e-5


def fits_mma(op: DotOp, k_step: int = MMA_K, dtype: DType = DType.F32) -> bool:
    """Whether the product is whole m16n8 tiles of operands of dtype, the contraction whole
    steps of k_step (8 for TF32's m16n8k8, 16 for the 16-bit m16n8k16)."""
    a, b = (v.ttype for v in op.operands)
    m, n, k, _ = DotOp.mnk(a, b, op.trans_a, op.trans_b)
    return (a.dtype is dtype and all(isinstance(d, int) for d in (m, n, k))
            and m % MMA_M == 0 and n % MMA_N == 0 and k % k_step == 0)


def mark_products(pass_: Pass, func: FuncOp, ctx, precision: str, k_step: int, least: float, rounded: str) -> FuncOp:
    """func with precision given to every f32 tile.dot still "ieee" inside a tile.parallel whose
    product is whole m16n8 tiles and k_step contraction steps, where every float output is checked
    to `least` or looser; else func, with a note saying why."""
    marked = set()
    for loop in (op for op in func.body.ops if isinstance(op, ParallelOp)):
        marked.update(id(op) for op in loop.walk() if isinstance(op, DotOp) and op.precision == "ieee"
                      and fits_mma(op, k_step))

    def transform(op, vmap):
        return [attrs.evolve(op, precision=precision)] if id(op) in marked else None

    if not marked:
        return func
    tol = ctx_tolerance(ctx, func)
    if tol < least:
        ctx.note(pass_, f"{len(marked)} product(s) kept in f32: the op's outputs are checked to {tol:g}, "
                        f"{precision.upper()} operands need {least:g}")
        return func
    ctx.note(pass_, f"{len(marked)} product(s) on tensor cores in {precision.upper()}")
    for op in func.walk():
        if id(op) in marked:
            ctx.approximated(pass_, f"tile.dot's f32 operands rounded to {rounded}", op.loc)
    return rebuild(func, transform)


@define_pass("tf32-dots", "f32 tile.dot of whole 16x8x8 tiles in a tile kernel on tensor cores, operands in TF32")
class Tf32Dots(Pass):
    """split=3: each operand as two TF32 values, three products a step (3xTF32, precision
    "tf32x3"): f32's accuracy to about 2^-21 at three times the tensor-core work, for ops
    checked to TF32X3_TOLERANCE or looser."""

    split: int = option(1, choices=(1, 3))

    def run(self, func: FuncOp, ctx) -> FuncOp:
        if self.split == 3:
            return mark_products(self, func, ctx, "tf32x3", MMA_K, TF32X3_TOLERANCE,
                                 "two TF32 values each (3xTF32)")
        return mark_products(self, func, ctx, "tf32", MMA_K, TF32_TOLERANCE, "TF32 (10 mantissa bits)")

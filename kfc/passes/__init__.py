"""Passes over the IR: one module per pass, registered by name for pipeline strings."""

from . import (  # noqa: F401 - registration
    accelerate_matmul, approx_math, bf16_dots, canonicalize, chunk_rows, cse, dce, flatten_branches, hoist_loads,
    linearize, lower_ptx, lower_reductions, lower_tri_inv, online_softmax, sink_stores, split_tiles, stage_rows,
    tensor_rows, tf32_dots, tile, tri_inv_doubling,
)
from .base import PASSES, Pass, PassError, register_pass
from .context import PassContext, VerifyEach
from .manager import PassManager
from .pipeline import Pipeline, parse_pipeline, parse_user_pipeline

ROW_PIPELINE = "canonicalize,cse,dce,flatten-branches,chunk-rows,stage-rows,tile,lower-reductions,fuse-reductions,lower-ptx,canonicalize,cse,dce"
# a whole-tensor matrix product and its elementwise epilogue, on tensor cores
MATMUL_PIPELINE = "canonicalize,cse,dce,accelerate-matmul{producer=warpgroup,inflight=1,store=auto},canonicalize,cse,dce"
# a product of at most SKINNY_ROWS rows: a 64-row tile is all of M, and 128-column tiles make
# twice the CTAs of 256-column ones for the few SMs 128 x 256 tiles would keep (16 x 8192 x 8192
# on an H100: 0.69 of cuBLAS with 128 x 256 tiles, 0.98 with these; docs/gemm.md)
SKINNY_ROWS = 64
SKINNY_MATMUL_PIPELINE = ("canonicalize,cse,dce,accelerate-matmul{producer=warpgroup,inflight=1,store=auto,bm=64,"
                          "bn=128,stages=6},canonicalize,cse,dce")
# another tile program (kfc.codegen.tile_emitter): f32 exp, rsqrt and sigmoid on the SFU where the
# tolerance allows (approx-math: 3-4% off KDA's prepare kernel on an H100), each iteration's loads first (stored in one
# phase), its stores together (written in one phase, the products they store pending at once),
# its f32 products of whole 16x8x8 tiles on tensor cores in TF32
TILE_PIPELINE = "approx-math,canonicalize,cse,dce,hoist-loads,sink-stores,tf32-dots"


def default_pipelines() -> str:
    """Every default pipeline as set now: part of the JIT cache's key for a kernel built with
    the default (kfc.runtime.kernel), so one built before a default changed is not served after."""
    return "|".join((ROW_PIPELINE, MATMUL_PIPELINE, SKINNY_MATMUL_PIPELINE, str(SKINNY_ROWS), TILE_PIPELINE))


def default_pipeline(kind: str, rows: int | None = None, target=None) -> str:
    """The pipeline `kfc compile` uses when -p is not given, by kind of op (and, for a matrix
    product on wgmma whose operands TMA moves, by its rows M: matmul_match.tma_product_rows; the
    skinny tiles are measured only there, and tcgen05's tiles are 128 rows)."""
    if kind == "row":
        return ROW_PIPELINE
    if kind == "matmul":
        skinny = rows is not None and rows <= SKINNY_ROWS and target is not None and not target.has("tcgen05")
        return SKINNY_MATMUL_PIPELINE if skinny else MATMUL_PIPELINE
    return TILE_PIPELINE


__all__ = ["PASSES", "Pass", "PassError", "register_pass", "PassContext", "PassManager", "VerifyEach", "Pipeline",
           "parse_pipeline", "parse_user_pipeline", "default_pipeline", "default_pipelines", "ROW_PIPELINE",
           "MATMUL_PIPELINE", "SKINNY_MATMUL_PIPELINE", "SKINNY_ROWS", "TILE_PIPELINE"]

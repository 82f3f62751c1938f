"""Passes over the IR: one module per pass, registered by name for pipeline strings."""

from . import (  # noqa: F401 - registration
    accelerate_matmul, canonicalize, chunk_rows, cse, dce, flatten_branches, linearize, lower_ptx, lower_reductions,
    lower_tri_inv, online_softmax, split_tiles, stage_rows, tensor_rows, tile,
)
from .base import PASSES, Pass, PassError, register_pass
from .context import PassContext, VerifyEach
from .manager import PassManager
from .pipeline import Pipeline, parse_pipeline, parse_user_pipeline

ROW_PIPELINE = "canonicalize,cse,dce,flatten-branches,chunk-rows,stage-rows,tile,lower-reductions,fuse-reductions,lower-ptx,canonicalize,cse,dce"
# a whole-tensor matrix product and its elementwise epilogue, on tensor cores
MATMUL_PIPELINE = "canonicalize,cse,dce,accelerate-matmul{producer=warpgroup,inflight=1,store=auto},canonicalize,cse,dce"


def default_pipeline(kind: str) -> str:
    """The pipeline `kfc compile` uses when -p is not given, by kind of op."""
    if kind == "row":
        return ROW_PIPELINE
    if kind == "matmul":
        return MATMUL_PIPELINE
    return "canonicalize,cse,dce"


__all__ = ["PASSES", "Pass", "PassError", "register_pass", "PassContext", "PassManager", "VerifyEach", "Pipeline",
           "parse_pipeline", "parse_user_pipeline", "default_pipeline", "ROW_PIPELINE", "MATMUL_PIPELINE"]

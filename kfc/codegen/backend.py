"""The backend's choices that depend on the program and the target: which kind of program it
is (so which lowering and default pipeline), which target features its final IR uses, and the
architecture its code is built for.

    program ──kind──▶ pipeline (kfc.passes.default_pipeline) ──▶ final IR ──features──▶ arch

A plain target (sm_90, sm_100) becomes its arch-specific variant (sm_90a, sm_100a) exactly
when the kernel uses an instruction only that variant has (wgmma, setmaxnreg, tcgen05); the
compile report says so.
"""

from __future__ import annotations

from ..diagnostics import KfcError
from ..ir.core import walk_block
from ..ir.func import FuncOp
from ..ir.gpu_ops import LaunchOp
from ..ir.mma_ops import MbarrierArrayOp, RolesOp, TmaLoadOp, Tcgen05MmaOp, WgmmaOp
from ..ir.smem_ops import CopyAsyncOp, MbarrierAllocOp
from ..ir.tile_ops import DotOp, ParallelOp
from ..passes.matmul_match import match_matmul
from ..passes.base import PassError
from ..passes.rows import find_row_loop, row_length
from .tile_emitter import tile_program_problem
from ..model.target import Target, needs_arch_specific


def program_kind(func: FuncOp) -> tuple[str, PassError | None]:
    """("row", None) for a row program, ("matmul", None) for a whole-tensor matrix product with
    an elementwise epilogue, ("tile", None) for another parallel loop whose tiles the shared-memory
    tile emitter takes (kfc.codegen.tile_emitter), ("other", why not) for anything else: said of
    the matrix product's lowering for a program with a dot, of the row lowering for any other."""
    try:
        loop = find_row_loop(func)
        row_length(loop, func)
        return "row", None
    except PassError as e:
        why = PassError("it is not a row program (one parallel loop over rows whose tiles are rows): "
                        f"{e.message}", e.span, e.hint)
    if any(isinstance(op, DotOp) for op in func.body.ops):
        try:
            match_matmul(func)
            return "matmul", None
        except PassError as e:
            why = e
    problem = tile_program_problem(func)
    if problem is None:
        return "tile", None
    loops = [op for op in func.body.ops if isinstance(op, ParallelOp)]
    if loops:
        why = PassError(f"{why.message}; nor does the tile emitter take it: {problem}", why.span, why.hint)
    return "other", why


def kernel_features(func: FuncOp) -> frozenset[str]:
    """The target features the final IR's kernels use."""
    used = set()
    for op in walk_block(func.body):
        if isinstance(op, WgmmaOp):
            used.add("wgmma")
        elif isinstance(op, Tcgen05MmaOp):
            used.add("tcgen05")
        elif isinstance(op, RolesOp) and op.registers:
            used.add("setmaxnreg")
        elif isinstance(op, TmaLoadOp):
            used.add("tma")
        elif isinstance(op, (MbarrierArrayOp, MbarrierAllocOp)):
            used.add("mbarrier")
        elif isinstance(op, CopyAsyncOp):
            used.add("cp_async")
        elif isinstance(op, LaunchOp) and op.cluster > 1:
            used.add("cluster")
    return frozenset(used)


def build_arch(target: Target, features: frozenset[str]) -> tuple[str, str | None]:
    """The architecture to build for, and a note when it is not the target's own name."""
    missing = sorted(f for f in features if not target.has(f))
    if missing:
        raise KfcError(f"the kernel uses {', '.join(missing)}, which {target} ({target.family}) does not have",
                       hint="compile for a target that has it (wgmma: sm_90a; tcgen05: sm_100a)")
    specific = sorted(f for f in features if needs_arch_specific(f))
    if specific and not target.arch_specific:
        arch = f"{target.name}a"
        return arch, (f"built for {arch}, not {target.name}: the kernel uses {', '.join(specific)}, which only "
                      f"{arch} has")
    return target.name, None

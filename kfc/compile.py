"""`kfc compile`: an op description to CUDA C++, PTX, a cubin and a report.

    spec ──specialise (all dims but the row count)──▶ pipeline (verified pass by pass)
         ──▶ CUDA C++ with inline PTX ──nvcc/ptxas──▶ .ptx, .cubin, ptxas report ──▶ report.json

The row count stays a run-time argument, so one cubin serves every number of rows; the other
dims are fixed (from --shape, else from the check block's first shape).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import attrs

from .model.version import __version__
from .codegen.backend import build_arch, kernel_features, program_kind
from .codegen import cuda as codegen_cuda
from .codegen.cuda import LaunchPlan, generate_cuda, unlowered_ops
from .codegen.grid_emitter import GridPlan
from .codegen.resources import check_resources
from .codegen.toolchain import CompiledKernel, compile_cuda, find_toolchain
from .diagnostics import InternalError, KfcError
from .files import write_atomically
from .model.spec import OpSpec
from .ir.func import FuncOp
from .ir.gpu_ops import LaunchOp
from .ir.printer import print_ir
from .ir.specialize import specialize
from .ir.mma_ops import GridOp
from .ir.tile_ops import DimOp, ParallelOp
from .ir.types import MemSpace, SymDim, TensorType
from .passes import MATMUL_PIPELINE, PassContext, PassManager, VerifyEach, default_pipeline, parse_pipeline
from .passes import parse_user_pipeline
from .passes.tensor_rows import RowsOfTensors, tensor_rows_dim
from .passes.tensor_rows import applies as computes_on_whole_tensors
from .model.target import Target
from .passes import ROW_PIPELINE
from .passes.accelerate_matmul import AccelerateMatmul
from .passes.linearize import Linearize
from .passes.matmul_match import tma_product_rows
from .passes.split_tiles import SplitReport, SplitTiles
from .passes.sink_stores import SinkStores
from .passes.tf32_dots import Tf32Dots
from .passes.tile import MAX_CLUSTER, Tile


@attrs.frozen
class CompileResult:
    op: str
    target: Target
    arch: str
    pipeline: str
    dims: dict[str, int]
    dynamic_dims: tuple[str, ...]
    ir: str
    kernel: CompiledKernel
    plan: LaunchPlan | GridPlan
    report: dict[str, Any]


def row_dims(func: FuncOp) -> list[str]:
    """Dims that bound the top-level parallel loop (its indices, linearised into rows), or
    that count a whole-tensor row program's rows: they stay run-time arguments."""
    loops = [op for op in func.body.ops if isinstance(op, ParallelOp)]
    if not loops and (rows := tensor_rows_dim(func)) is not None:
        return [rows]
    if not loops:
        return []
    defs = {r: op for op in func.body.ops for r in op.results}
    out = []

    def dims_of(v) -> None:  # a bound may be an expression of dims: (T + C - 1) // C + N
        d = defs.get(v)
        if isinstance(d, DimOp):
            if d.sym not in out:
                out.append(d.sym)
        elif d is not None and not d.regions:
            for x in d.operands:
                dims_of(x)

    for loop in loops:  # a tile program's loops, each its kernel's grid
        for v in loop.operands:
            dims_of(v)
    # a dim that is also a tile's extent (a later loop reading a whole [NC, D] slab) is fixed: a
    # kernel's tiles have fixed shapes
    extents = {d.name for op in func.walk() for r in op.results if isinstance(r.type, TensorType)
               and r.type.space is MemSpace.REG for d in r.type.shape if isinstance(d, SymDim)}
    return [d for d in out if d not in extents]


def fixed_dims(func: FuncOp, dims: dict[str, int]) -> dict[str, int]:
    """The dims a kernel is specialised on: all but the row dims (those stay run-time)."""
    dynamic = set(row_dims(func))
    return {k: int(v) for k, v in dims.items() if k not in dynamic}


def linearize_loops(func: FuncOp, ctx) -> FuncOp:
    """A whole-tensor program that computes row by row becomes a parallel loop over its rows
    (rows-of-tensors), a parallel loop over [A, B] tiles gets an index for A (split-tiles), and
    a parallel loop over several indices becomes a loop over rows (linearize), each verified
    like every pass, before the op's kind is decided."""
    if computes_on_whole_tensors(func):
        return PassManager(parse_pipeline(RowsOfTensors.NAME), ctx).run(func)
    def rank2(op) -> bool:
        return any(isinstance(v.type, TensorType) and v.type.space is MemSpace.REG and v.type.rank == 2
                   for o in op.body.ops for v in o.results)

    loops = [op for op in func.body.ops if isinstance(op, ParallelOp)]
    if not any(op.rank > 1 or rank2(op) for op in loops):
        return func

    return PassManager(parse_pipeline(f"{SplitTiles.NAME},{Linearize.NAME}"), ctx).run(func)


def check_lowered(func: FuncOp, pipe) -> None:
    """A pipeline given with -p must leave IR the code generator takes: one gpu.launch, every
    op inside lowered. Said of the pipeline (the source line is only where the op came from)."""
    if any(isinstance(op, GridOp) for op in func.body.ops):
        left = unlowered_ops(func)
        if left:
            raise KfcError(f"the pipeline {str(pipe)!r} leaves {left[0].NAME} unlowered in the gpu.grid",
                           left[0].loc, hint=f"leave out -p for the default pipeline: {MATMUL_PIPELINE}")
        return
    if not any(isinstance(op, LaunchOp) for op in func.body.ops):
        raise KfcError(f"the pipeline {str(pipe) or '(empty)'!r} maps no loop onto the GPU: it has no tile pass",
                       hint=f"add tile{{...}}, or leave out -p for the default pipeline: {ROW_PIPELINE}")
    left = unlowered_ops(func)
    if left:
        op = left[0]
        where = f" (from {op.loc})" if op.loc is not None else ""
        raise KfcError(f"the pipeline {str(pipe)!r} leaves {op.NAME}{where} unlowered; code generation needs "
                       "every op of the kernel lowered", hint="run lower-reductions and lower-ptx after tile, or "
                       f"leave out -p for the default pipeline: {ROW_PIPELINE}")


def dim_span(func: FuncOp, sym: str):
    """Where dim `sym` is first written: the type of the first argument that has it."""
    for v in func.args:
        if sym in v.ttype.symbols:
            return v.loc or func.loc
    return func.loc


def choose_dims(spec: OpSpec, shape: dict[str, int] | None) -> dict[str, int]:
    func = spec.func
    dims: dict[str, int] = {}
    if spec.check is not None and spec.check.shapes:
        dims.update(spec.check.shapes[0])
    if shape:
        unknown = sorted(set(shape) - set(func.symbols))
        if unknown:
            raise KfcError(f"--shape names {unknown[0]}, which is not a dimension of {func.sym_name}",
                           hint=f"its dimensions are {', '.join(func.symbols) or 'none'}")
        dims.update(shape)
    return dims


def ir_hash(func: FuncOp) -> str:
    return hashlib.sha256(print_ir(func).encode()).hexdigest()[:16]


@attrs.frozen
class Lowering:
    """An op run through its pipeline at fixed dims: the final IR, and what led to it."""

    func: FuncOp          # the final IR
    pipeline: Any         # the Pipeline run
    fixed: dict[str, int]
    dynamic: list[str]
    ctx: PassContext
    generated: tuple | None = None  # generate_cuda(func), where lowering already ran it


def lower_op(spec: OpSpec, target: Target, pipeline: str | None, dims: dict[str, int], ctx: PassContext) -> Lowering:
    """Specialise every dim of `dims` but the row count and run the pipeline (-p, else the
    default for the kind of op); an op the code generator cannot take is one clear error."""
    func = spec.func
    dynamic = row_dims(func)
    fixed = fixed_dims(func, dims)
    missing = [s for s in func.symbols if s not in dims and s not in dynamic]
    if missing:
        raise KfcError(f"no size for {', '.join(missing)}: kfc compile fixes every dim but the row count, and "
                       "neither --shape nor a check block's shapes give it", dim_span(func, missing[0]),
                       hint=f"pass --shape {','.join(f'{m}=...' for m in missing)}")
    special = specialize(func, fixed, partial=True, where=ctx.where)
    special = linearize_loops(special, ctx)
    kind, why_not = program_kind(special)
    pipe = parse_user_pipeline(pipeline) if pipeline is not None else \
        parse_pipeline(default_pipeline(kind, tma_product_rows(special) if kind == "matmul" else None, target))
    before = (len(ctx.notes), len(ctx.approximations), None if ctx.stages is None else len(ctx.stages))
    lowered = PassManager(pipe, ctx).run(special)
    generated = None
    if pipeline is None and kind == "tile":
        pipe, lowered, generated = tile_products_that_fit(special, pipe, lowered, target, ctx, before)
    if kind not in ("row", "matmul", "tile"):
        # why the rank-2 tiles the row passes refuse stayed
        reports = [r for r in ctx.stats.values() if isinstance(r, SplitReport)]
        kept = [m for r in reports for m in r.kept] if "rank-2 tile" in why_not.message else []
        raise KfcError(f"kfc cannot generate code for {func.sym_name} yet: {why_not.message}",
                       why_not.span or func.loc,
                       f"split-tiles: the {kept[0]}" if kept else why_not.hint or "`kfc opt` still parses, verifies "
                       "and lowers it; code generation covers row ops such as rmsnorm, layernorm and softmax")
    if kind != "tile":
        check_lowered(lowered, pipe)
    return Lowering(lowered, pipe, fixed, dynamic, ctx, generated)


def build_advised(advice, build):
    """Build with a recorded pipeline (a kfc.kb.advice.Advice) where it applies to this op, else
    with the default: (what `build(pipeline)` gave, a line saying which, advice or None as used).
    A record of another op may name a pass this op cannot take; a bug in kfc still surfaces."""
    try:
        return build(advice.pipeline), f"from the knowledge base: {advice.describe()}", advice
    except InternalError:
        raise
    except KfcError as e:
        return build(None), (f"from the knowledge base: {advice.describe()} does not apply here "
                             f"({e.message.splitlines()[0]}); the default pipeline instead"), None


def compile_op(spec: OpSpec, target: Target, pipeline: str | None = None, shape: dict[str, int] | None = None,
               verify_each: bool = False, print_ir_after_all: bool = False, print_ir_before=(), timing: bool = False,
               out=None, allow_spills: bool = False) -> CompileResult:
    started = time.perf_counter()
    func = spec.func
    dims = choose_dims(spec, shape)
    # --verify-each runs the interpreter on a few rows (3 where nothing gives the row count)
    sample = {k: min(dims.get(k, 3), 5) for k in row_dims(func)}
    ctx_kwargs = dict(target=target, check=spec.check, print_ir_after_all=print_ir_after_all, print_ir_before=frozenset(print_ir_before),
                      timing=timing, where="--shape" if shape else "the check block's first shape",
                      verify_each=VerifyEach({**fixed_dims(func, dims), **sample}, spec.check) if verify_each else None)
    if out is not None:
        ctx_kwargs["out"] = out
    def build(pipeline_text):
        ctx = PassContext(**ctx_kwargs)
        t0 = time.perf_counter()
        lowering = lower_op(spec, target, pipeline_text, dims, ctx)
        t_passes = time.perf_counter() - t0
        code, plan = lowering.generated or generate_cuda(lowering.func)
        arch, arch_note = build_arch(target, kernel_features(lowering.func))
        if arch_note:
            ctx.notes.append(("backend", arch_note))
        t1 = time.perf_counter()
        kernel = compile_cuda(code, arch)
        columns, ctas = None, None
        while kernel.report.spills and (tile_kernel_held(plan) or getattr(plan, "register_columns", 0)):
            if getattr(plan, "register_columns", 0):
                # a carried tile's columns in registers left too few for the rest: in shared memory
                columns = False
                ctx.notes.append(("compile", f"the carried tile's columns in registers spilled "
                                             f"{kernel.report.spill_stores} bytes; kept in shared memory"))
            else:  # held to more CTAs an SM than its registers allow: one fewer
                ctas = plan.min_ctas_per_sm - 1
            code, plan = generate_cuda(lowering.func, tile_ctas=ctas, column_registers=columns)
            kernel = compile_cuda(code, arch)
        return ctx, lowering, plan, arch, kernel, t_passes, time.perf_counter() - t1

    ctx, lowering, plan, arch, kernel, t_passes, t_nvcc = build(pipeline)
    if kernel.report.spills and not allow_spills and pipeline is None:
        # the default's tile spilled: the same pipeline over twice the CTAs a row, or a matrix
        # product's roles folded into one
        wider = wider_tile(lowering, target) or single_role(lowering)
        if wider is not None:
            spilled = kernel.report.spill_stores
            retry = build(wider)
            if not retry[4].report.spills:
                ctx, lowering, plan, arch, kernel, t_passes, t_nvcc = retry
                ctx.notes.append(("compile", f"the default tile spilled {spilled} bytes; built with {wider}"))
    lowered, pipe, fixed, dynamic = lowering.func, lowering.pipeline, lowering.fixed, lowering.dynamic
    features = kernel_features(lowered)
    rep = kernel.report
    try:
        check_resources(plan, rep, target, spec.instance_name, spec.smaller_sizes)
    except KfcError as e:  # said of the op, at its signature
        raise type(e)(e.message, e.span or func.loc, e.hint) from None
    if rep.spills and not allow_spills:
        raise KfcError(f"{spec.instance_name} spills registers to local memory with {pipe} at "
                       f"{', '.join(f'{k}={v}' for k, v in fixed.items())}: {rep.spill_stores} bytes stored, "
                       f"{rep.spill_loads} loaded, {rep.registers} registers",
                       hint=f"{spill_remedy(pipe)}, or allow spills (kfc compile --allow-spills)")
    tc = find_toolchain()
    report = {
        "op": func.sym_name, "source": spec.path, "kfc_version": __version__,
        "target": target.name, "arch": arch, "family": target.family, "features": sorted(features),
        "pipeline": str(pipe), "dims": fixed, "dynamic_dims": dynamic, "ir_hash": ir_hash(lowered),
        # the launch contract: the kernels to launch in order (kfc.runtime.contract reads it)
        "kernels": plan.contracts(),
        "ptxas": attrs.asdict(kernel.report),
        "toolchain": {"nvcc": tc.nvcc, "version": tc.version_text},
        "seconds": {"passes": round(t_passes, 4), "nvcc_ptxas": round(t_nvcc, 3),
                    "total": round(time.perf_counter() - started, 3)},
        "pass_notes": [f"{p}: {m}" for p, m in ctx.notes],
        # what may differ from exact arithmetic within the op's tolerance, and where
        "approximations": [{"pass": p, "what": w, "at": at} for p, w, at in ctx.approximations],
    }
    return CompileResult(func.sym_name, target, arch, str(pipe), fixed, tuple(dynamic), print_ir(lowered), kernel,
                         plan, report)


def spill_remedy(pipe) -> str:
    """What to change when the kernel `pipe` built spills: the last pass with a say in a thread's
    registers names its options, else the row tile's remedy."""
    hints = [h for h in (p.spill_hint() for p in pipe) if h]
    return hints[-1] if hints else "choose a tile with fewer elements per thread (more threads, or a cluster)"


def tile_kernel_held(plan) -> bool:
    """A shared-memory tile kernel compiled to fit more than one CTA an SM (its shared memory
    allows it: kfc.codegen.tile_plan.ctas_per_sm)."""
    return isinstance(plan, GridPlan) and bool(plan.shared_tiles) and plan.min_ctas_per_sm > 1


def wider_tile(lowering: Lowering, target: Target) -> str | None:
    """The pipeline that was run with its row tile spread over twice the CTAs a row (a cluster
    twice as large, each thread holding half as much), where the target and the largest cluster
    allow it: the default's answer to a tile that spilled. None where there is no such step."""
    launches = [op for op in lowering.func.walk() if isinstance(op, LaunchOp)]
    tiles = [p for p in lowering.pipeline if isinstance(p, Tile)]
    if len(launches) != 1 or len(tiles) != 1 or not target.has("cluster"):
        return None
    launch = launches[0]
    if launch.cluster * 2 > MAX_CLUSTER or launch.rows_per_cta != 1:
        return None
    passes = [attrs.evolve(p, cluster=launch.cluster * 2, threads=launch.threads) if p is tiles[0] else p
              for p in lowering.pipeline]
    return ",".join(map(str, passes))


def tile_products_that_fit(special: FuncOp, pipe, lowered: FuncOp, target: Target, ctx: PassContext, before):
    """The default tile pipeline and its IR, or, where its kernel keeps more in shared memory at
    once than the target has, the first of these that fits, else the one needing the fewest
    bytes if fewer: the pipeline without sink-stores (each store where written, its tile's
    buffer freed sooner), then without tf32-dots too (the products as f32 loops, their results
    never stored whole). Decided here, before the final IR is anyone's, so that what kfc check
    interprets is what is built. Third, the kept IR's generate_cuda where this ran it (kfc
    compile then reuses it), else None."""
    fallbacks = []
    for dropped in ((SinkStores,), (SinkStores, Tf32Dots)):
        kept = [p for p in pipe if not isinstance(p, dropped)]
        if len(kept) < len(pipe) and kept not in fallbacks:
            fallbacks.append(kept)
    if not fallbacks:
        return pipe, lowered, None
    # sized as the shared-memory form, which a kernel holding a tile in registers falls back to
    # where that spills (compile_op's build); rebuilt there where the registers are asked for
    generated = generate_cuda(lowered, column_registers=False)
    reused = None if codegen_cuda.TILE_COLUMN_REGISTERS else generated
    needed = generated[1].smem_dynamic
    if needed <= target.smem_per_block:
        return pipe, lowered, reused
    best = None
    for kept in fallbacks:
        plain = parse_pipeline(",".join(map(str, kept)))
        other = attrs.evolve(ctx, notes=[], approximations=[], stages=None if ctx.stages is None else [], stats={},
                             timings=[])
        plain_ir = PassManager(plain, other).run(special)
        plain_generated = generate_cuda(plain_ir, column_registers=False)
        if plain_generated[1].smem_dynamic < (best[3][1].smem_dynamic if best else needed):
            best = (plain, other, plain_ir, plain_generated)
        if plain_generated[1].smem_dynamic <= target.smem_per_block:
            break
    if best is None:
        return pipe, lowered, reused
    plain, other, plain_ir, plain_generated = best
    # the run that is kept replaces the other's records
    notes, approximations, stages = before
    what = ("the stores together" if any(isinstance(p, Tf32Dots) for p in plain)
            else "the products on tensor cores and the stores together" if any(isinstance(p, SinkStores) for p in pipe)
            else "the products on tensor cores")
    ctx.notes[notes:] = other.notes + [("compile", f"{what} needed {needed} bytes of shared memory, {target} has "
                                                   f"{target.smem_per_block}; built with {plain}")]
    ctx.approximations[approximations:] = other.approximations
    if stages is not None:
        ctx.stages[stages:] = other.stages
    ctx.stats.update(other.stats)
    return plain, plain_ir, None if codegen_cuda.TILE_COLUMN_REGISTERS else plain_generated


def single_role(lowering: Lowering) -> str | None:
    """The pipeline that was run with a warp-specialised matrix product built as one role of
    two warpgroups instead (255 registers a thread, not the 168 a CTA of three warpgroups
    leaves): the default's answer to an epilogue that spilled. None where there is no such step."""
    matmuls = [p for p in lowering.pipeline if isinstance(p, AccelerateMatmul)]
    if len(matmuls) != 1 or matmuls[0].producer != "warpgroup":
        return None
    one = attrs.evolve(matmuls[0], producer="mma", inflight=0, registers=0, tiles="grid")
    return ",".join(str(one if p is matmuls[0] else p) for p in lowering.pipeline)


def check_output_dir(out_dir: Path) -> None:
    """Fail now, before any work, if `out_dir` cannot become the output folder: a file in its
    place, or no writable folder to create it in. Creates nothing."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise KfcError(f"the output {out_dir} is a file; kfc writes a folder of outputs there",
                       hint="give -o a folder path (it is created if missing)")
    base = out_dir
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        raise KfcError(f"cannot create the output folder {out_dir}: {base} is not a writable folder",
                       hint="give -o a folder in a writable place")


def prepare_output_dir(out_dir: Path) -> None:
    """The output folder, created if need be (check_output_dir's errors, or the OS's)."""
    check_output_dir(out_dir)
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KfcError(f"cannot create the output folder {out_dir}: {e.strerror or e}",
                       hint="give -o a folder in a writable place") from None


def write_outputs(result: CompileResult, out_dir: Path) -> list[Path]:
    """Write .cu, .ptx, .cubin, .kir and report.json; each file appears whole or not at all."""
    prepare_output_dir(out_dir)
    stem = result.op
    files = {
        f"{stem}.cu": result.kernel.cu.encode(), f"{stem}.ptx": result.kernel.ptx.encode(),
        f"{stem}.cubin": result.kernel.cubin, f"{stem}.kir": result.ir.encode(),
        "report.json": (json.dumps(result.report, indent=2) + "\n").encode(),
    }
    written = []
    for name, data in files.items():
        write_atomically(out_dir / name, data)
        written.append(out_dir / name)
    return written

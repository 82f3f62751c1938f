"""Emission rules for Blackwell's tensor-core MMA (kfc.ir.mma_ops.tcgen05), written through the
grid emitter: the tensor-memory allocation (warp 0 of the CTA, its address through shared
memory), the MMAs one thread issues on staged tiles, their commit to an mbarrier, the loads of
the accumulator's columns and the deallocation once every thread is done."""

from __future__ import annotations

from ..ir.dtypes import DType
from ..ir.mma_ops import CHUNK_BYTES, Tcgen05CommitOp, Tcgen05MmaOp, TmemAllocOp, TmemDeallocOp, TmemLoadOp
from ..ir import layouts
from . import ptx
from .errors import CodegenError
from .mma_rules import SWIZZLE_PERIOD, barrier_at, check_issuer, stage_bytes
from .rules import rule


@rule(TmemAllocOp)
def emit_tmem_alloc(em, op: TmemAllocOp) -> None:
    """Warp 0 allocates the columns and writes their address to a shared slot; every thread
    reads it after the barrier (fenced for tcgen05 on both sides)."""
    slot = em.fresh("kfc_tmem_slot")
    em.smem_decls.append(f"__shared__ unsigned {slot};")
    em.smem_static += 4
    em.emit(f"if (kfc_tid / 32 == 0) {{ {ptx.tmem_alloc(ptx.smem_addr(slot), op.columns)} }}")
    em.emit("kfc_tcgen05_fence_before();")
    em.emit("__syncthreads();")
    em.emit("kfc_tcgen05_fence_after();")
    em.emit(f"const unsigned {em.name(op.result)} = {slot};  // {op.result.type}")


@rule(TmemDeallocOp)
def emit_tmem_dealloc(em, op: TmemDeallocOp) -> None:
    """After every role (every thread meets here), warp 0 gives the columns back."""
    acc = op.operands[0]
    em.emit("kfc_tcgen05_fence_before();")
    em.emit("__syncthreads();")
    em.emit("kfc_tcgen05_fence_after();")
    em.emit(f"if (kfc_tid / 32 == 0) {{ {ptx.tmem_dealloc(em.name(acc), acc.ttype.shape[1])} }}")


@rule(Tcgen05MmaOp)
def emit_tcgen05_mma(em, op: Tcgen05MmaOp) -> None:
    """Per 16 columns of K one tcgen05.mma of the whole tile: A's descriptor (K-major) at the
    chunk holding those columns, B's (N-major, chunks `leading` bytes apart) at those rows of K;
    the first adds to the accumulator only where `accumulate` says so."""
    check_issuer(em, op)
    acc, a, b, stage, accumulate = op.operands
    ta, tb = a.ttype, b.ttype
    m, n = acc.ttype.shape
    per_chunk = ta.shape[3]
    bk = ta.shape[1] * per_chunk
    dtype = "bf16" if ta.dtype is DType.BF16 else "f16"
    if ta.dtype not in (DType.BF16, DType.F16):
        raise CodegenError(f"tcgen05.mma kind::f16 takes bf16 or f16 operands, not {ta.dtype}", op.loc)
    idesc = ptx.umma_instruction_descriptor(m, n, dtype)
    s = em.name(stage)
    em.emit("{")
    em.emit(f"  const unsigned kfc_a = {em.name(a)} + (unsigned)({s}) * {stage_bytes(ta)}u;")
    em.emit(f"  const unsigned kfc_b = {em.name(b)} + (unsigned)({s}) * {stage_bytes(tb)}u;")
    em.emit("  #pragma unroll")
    em.emit(f"  for (int kk = 0; kk < {bk // 16}; ++kk) {{")
    a_addr = f"kfc_a + (kk * 16 / {per_chunk}) * {ta.shape[2] * CHUNK_BYTES}u + (kk * 16 % {per_chunk}) * " \
             f"{ta.dtype.itemsize}u"
    b_addr = f"kfc_b + kk * {16 * CHUNK_BYTES}u"
    em.emit(f"    kfc_umma({em.name(acc)}, kfc_umma_desc({a_addr}, 16u, {SWIZZLE_PERIOD}u), "
            f"kfc_umma_desc({b_addr}, {tb.shape[2] * CHUNK_BYTES}u, {SWIZZLE_PERIOD}u), {idesc}u, "
            f"({em.name(accumulate)}) || kk > 0);")
    em.emit("  }")
    em.emit("}")


@rule(Tcgen05CommitOp)
def emit_tcgen05_commit(em, op: Tcgen05CommitOp) -> None:
    check_issuer(em, op)
    em.emit(f"kfc_umma_commit({barrier_at(em, *op.operands)});")


@rule(TmemLoadOp)
def emit_tmem_load(em, op: TmemLoadOp) -> None:
    """Each warp loads its 32 lanes (rows) of the columns: thread t of the warpgroup row t."""
    acc, col = op.operands
    n = em.declare(op.result)
    lane = layouts.TensorMemory().lane_c("kfc_tid / 32", "0")
    address = layouts.TensorMemory().address_c(lane, f"(unsigned)({em.name(col)})", em.name(acc))
    em.emit("kfc_tcgen05_fence_after();")
    em.emit("__syncwarp();  // tcgen05.ld is .sync.aligned: the warp's lanes meet first (lane 0 issued the MMAs)")
    em.emit("{")
    for line in ptx.tmem_load_32(n, address).split("\n"):
        em.emit("  " + line)
    em.emit("}")

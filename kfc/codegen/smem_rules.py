"""Emission rules for shared memory and async copies: the buffers and mbarriers laid out before
the row loop (one part per row slot, each stage after the other), the announcement of a CTA's
bytes, the bulk copies of its spans of a row or the threads' copies of their chunks, and the
phase waits.
"""

from __future__ import annotations

import contextlib

from ..ir.core import Value
from ..ir.smem_ops import CopyAsyncArriveOp, CopyAsyncOp, ExpectTxOp, MbarrierAllocOp, MbarrierWaitOp, SmemAllocOp
from ..ir.smem_ops import copy_bytes
from ..ir.types import TensorType
from . import ptx
from .errors import CodegenError
from .rules import rule


def emit_smem_setup(em) -> None:
    """Shared-memory buffers (one part per row slot of the CTA, in dynamic shared memory)
    and mbarriers (one per row slot), initialised before the row loop."""
    bars = em.bars
    shared_sums = em.sums is not None and em.launch.sums_in == "shared"
    if not em.staged and not bars and not shared_sums:
        return
    offset = 0
    if em.staged or shared_sums:
        em.smem_decls.append("extern __shared__ __align__(128) unsigned char kfc_dsmem[];")
    for k, op in enumerate(em.staged):
        t = op.result.ttype
        if t.rank != 1 or t.shape[0] != em.N:
            raise CodegenError(f"a shared-memory buffer of {t} in a row kernel of rows of {em.N}", op.loc,
                               "stage whole rows: buffers have the row's length")
        part = cta_part_bytes(em, t)
        name = f"kfc_sbuf{k}"
        em.emit(f"const unsigned {name} = {ptx.smem_addr('kfc_dsmem[0]')} + {offset}u + "
                  f"(unsigned)kfc_r * {part}u;")
        stage = -(-em.R * part // 128) * 128
        em.stage_bytes[op.result] = stage
        em.stage_base[op.result] = name
        em.names[op.result] = name if em.S == 1 else f"({name} + kfc_s * {stage}u)"
        offset += em.S * stage
    if shared_sums:
        # each thread's words: [result][row slot][register][thread], so that a warp's
        # accesses to one register fall in distinct banks
        em.emit(f"float* const kfc_sums = reinterpret_cast<float*>(kfc_dsmem + {offset}) + "
                  f"kfc_r * {em.EV * em.T} + kfc_t;")
        offset += len(em.launch.results) * em.R * em.EV * em.T * 4
    em.smem_dynamic = offset
    if not em.staged and not bars:
        return
    counts = [barrier_count(em, op) for op in bars]
    for k, op in enumerate(bars):
        em.smem_decls.append(f"__shared__ alignas(8) unsigned long long kfc_mbar{k}[{em.S * em.R}];")
        em.smem_bytes += 8 * em.S * em.R
        em.stage_base[op.result] = f"kfc_mbar_addr{k}"
        em.stage_bytes[op.result] = 8 * em.R
        em.names[op.result] = f"kfc_mbar_addr{k}" if em.S == 1 else \
            f"(kfc_mbar_addr{k} + kfc_s * {8 * em.R}u)"
    em.emit("if (threadIdx.x == 0) {")
    em.indent += 1
    em.emit(f"for (int r = 0; r < {em.S * em.R}; ++r) {{")
    for k in range(len(bars)):
        em.emit("  " + ptx.mbarrier_init(ptx.smem_addr(f"kfc_mbar{k}[r]"), counts[k]))
    em.emit("}")
    em.emit(ptx.fence_mbarrier_init())
    em.emit(ptx.fence_proxy_async_shared())
    em.indent -= 1
    em.emit("}")
    em.emit(ptx.bar_sync(0))
    for k in range(len(bars)):
        em.emit(f"const unsigned kfc_mbar_addr{k} = {ptx.smem_addr(f'kfc_mbar{k}[kfc_r]')};")


def barrier_count(em, op: MbarrierAllocOp) -> int:
    """The arrivals the hardware counts in a phase of `op`'s barrier: one announcement of the
    bulk copies' bytes, or every thread of the row slot once for each copy made by the threads."""
    copies = copies_on(em, op.result)
    by_threads = [c for c in copies if c.ARRIVES]
    if by_threads:
        if len(by_threads) != len(copies) or op.arrivals != len(by_threads):
            raise CodegenError(f"a barrier of {op.arrivals} arrival(s) with {len(by_threads)} copies made by the "
                               f"threads and {len(copies) - len(by_threads)} bulk copies", op.loc,
                               "put one kind of copy on a barrier: bulk copies after one gpu.expect_tx, or copies "
                               "by the threads, each an arrival")
        return em.T * len(by_threads)
    if op.arrivals != 1:
        raise CodegenError(f"row kernels arrive once per mbarrier phase, not {op.arrivals} times", op.loc)
    return 1


@rule(SmemAllocOp)
def emit_smem_alloc(em, op: SmemAllocOp) -> None:
    pass  # laid out in dynamic shared memory before the row loop (emit_smem_setup)


@rule(MbarrierAllocOp)
def emit_mbarrier_alloc(em, op: MbarrierAllocOp) -> None:
    pass  # declared and initialised before the row loop (emit_smem_setup)


@rule(ExpectTxOp)
def emit_expect_tx(em, op: ExpectTxOp) -> None:
    """Thread 0 of the row slot arrives and announces the bytes its CTA's copies carry
    (the IR's count is the whole row's; a cluster splits it); a slot without a row only
    arrives, so every slot's phase completes. With two stages this is where the next row's
    announcement and copies go, into the other stage (the first row's precede the loop)."""
    if em.S == 1:
        announce_tx(em, op, "kfc_rowvalid", em.name(op.operands[0]))
        return
    emit_next_row(em, lambda *where: emit_stage_copies(em, op, *where))


def emit_next_row(em, emit_copies) -> None:
    """With two stages: the next row's copies, into the other stage, if the CTA has a next row
    (emit_copies(valid, stage, row) emits them)."""
    em.emit("if (kfc_base + kfc_stride < kfc_rows) {")
    em.indent += 1
    em.emit("const bool kfc_valid_next = kfc_base + kfc_stride + kfc_r < kfc_rows;")
    em.emit(f"const unsigned kfc_sn = (kfc_s + 1) % {em.S};")
    emit_copies("kfc_valid_next", "kfc_sn", "(kfc_m + kfc_stride)")
    em.indent -= 1
    em.emit("}")


def emit_first_copies(em, lo: str) -> None:
    """The copies of the CTA's first rows, into stage 0, before the row loop."""
    em.emit(f"if ((long long)(blockIdx.x / {em.C}) * {em.R} < kfc_rows) {{")
    em.indent += 1
    em.emit(f"const bool kfc_valid0 = (long long)(blockIdx.x / {em.C}) * {em.R} + kfc_r < kfc_rows;")
    first = f"((long long)({lo}) + (long long)(blockIdx.x / {em.C}) * {em.R} + kfc_r)"
    for op in em.launch.body.ops:
        if isinstance(op, ExpectTxOp):
            emit_stage_copies(em, op, "kfc_valid0", "0u", first)
        elif isinstance(op, CopyAsyncArriveOp):
            emit_stage_thread_copy(em, op, "kfc_valid0", "0u", first)
    em.indent -= 1
    em.emit("}")


def emit_stage_copies(em, expect: ExpectTxOp, valid: str, stage: str, row: str) -> None:
    """Announce and issue the copies on `expect`'s barrier for the row `row`, into `stage`."""
    bar = expect.operands[0]
    announce_tx(em, expect, valid, at_stage(em, bar, stage))
    with row_named(em, row):
        for c in copies_on(em, bar):
            emit_copy(em, c, valid, at_stage(em, c.operands[1], stage), at_stage(em, bar, stage))


def at_stage(em, v: Value, stage: str) -> str:
    """The address of a staged buffer or barrier in stage `stage`."""
    return f"({em.stage_base[v]} + ({stage}) * {em.stage_bytes[v]}u)"


@contextlib.contextmanager
def row_named(em, row: str):
    """Emit with the row loop's index read as `row` (the row a copy issued ahead addresses)."""
    row_value = em.launch.body.args[0]
    saved = em.names[row_value]
    em.names[row_value] = row
    try:
        yield
    finally:
        em.names[row_value] = saved


def announce_tx(em, op: ExpectTxOp, valid: str, bar: str) -> None:
    copies = copies_on(em, op.operands[0])
    if op.bytes != sum(copy_bytes(c.operands[1].ttype) for c in copies):
        raise CodegenError(f"gpu.expect_tx announces {op.bytes} bytes; the copies on its barrier carry "
                           f"{sum(copy_bytes(c.operands[1].ttype) for c in copies)}", op.loc)
    per_cta = sum(cta_part_bytes(em, c.operands[1].ttype) for c in copies)
    if per_cta >= 1 << 20:
        raise CodegenError(f"a CTA's part of the staged rows is {per_cta} bytes; an mbarrier phase counts at most "
                           f"2^20-1", op.loc, "split the row over a larger cluster")
    em.emit("if (kfc_t == 0) {")
    em.indent += 1
    em.emit("unsigned kfc_tx = 0;")
    for c in copies:
        isz = c.operands[1].ttype.dtype.itemsize
        em.emit(f"for (int e = 0; e < {em.E}; ++e) {{ const long long j0 = {em.row.cta_span_start_c('e', 'kfc_crank')}; "
                  f"if (j0 < {em.N}) kfc_tx += (unsigned)({em.row.span_length_c('j0', em.N)} * {isz}); }}")
    em.emit(f"if ({valid}) {ptx.mbarrier_arrive_expect_tx_var(bar, 'kfc_tx')}")
    em.emit(f"else {ptx.mbarrier_arrive(bar)}")
    em.indent -= 1
    em.emit("}")


@rule(CopyAsyncOp)
def emit_copy_async(em, op: CopyAsyncOp) -> None:
    if em.S == 1:  # with two stages the copies go with their announcement (emit_expect_tx)
        emit_copy(em, op, "kfc_rowvalid", em.name(op.operands[1]), em.name(op.operands[2]))


def emit_copy(em, op: CopyAsyncOp, valid: str, buf: str, bar: str) -> None:
    """Thread 0 of the row slot copies each of its CTA's spans of the row in one bulk copy
    (the last span stops at the row's end: both ends stay 16-byte aligned because the
    row's byte length is a multiple of 16)."""
    src = op.operands[0]
    t = src.ttype
    isz = t.dtype.itemsize
    if [ix.kind for ix in op.index] != ["point"] * (t.rank - 1) + ["all"]:
        raise CodegenError("row kernels copy whole rows (x[m, :]) into shared memory", op.loc)
    if (em.N * isz) % 16 or (em.row.span * isz) % 16:
        raise CodegenError(f"a bulk copy moves multiples of 16 bytes; rows of {em.N} x {isz} bytes in spans of "
                           f"{em.row.span} elements do not split so", op.loc,
                           "leave this row in registers (stage-rows skips such rows)")
    em.emit(f"if (kfc_t == 0 && {valid}) {{")
    em.indent += 1
    em.emit(ptx.fence_proxy_async_shared())
    em.emit("#pragma unroll")
    em.emit(f"for (int e = 0; e < {em.E}; ++e) {{")
    em.indent += 1
    em.emit(f"const long long j0 = {em.row.cta_span_start_c('e', 'kfc_crank')};")
    em.emit(f"if (j0 < {em.N}) {{")
    em.indent += 1
    em.emit(f"const unsigned kfc_nb = (unsigned)({em.row.span_length_c('j0', em.N)} * {isz});")
    addr = f"{em.name(src)} + {em._address(op, src, op.index, op.operands[3:], 'j0')}"
    dst = f"{buf} + (unsigned)({em.row.cta_offset_c('e', '0')}) * {isz}u"
    em.emit(ptx.cp_async_bulk_to_shared(dst, addr, "kfc_nb", bar))
    em.indent -= 1
    em.emit("}")
    em.indent -= 1
    em.emit("}")
    em.indent -= 1
    em.emit("}")


@rule(CopyAsyncArriveOp)
def emit_copy_async_arrive(em, op: CopyAsyncArriveOp) -> None:
    """Every thread copies its chunks and arrives; with two stages, the next row's chunks into
    the other stage (the first row's precede the loop)."""
    if em.S == 1:
        emit_thread_copy(em, op, "kfc_rowvalid", em.name(op.operands[1]), em.name(op.operands[2]))
        return
    emit_next_row(em, lambda *where: emit_stage_thread_copy(em, op, *where))


def emit_stage_thread_copy(em, op: CopyAsyncArriveOp, valid: str, stage: str, row: str) -> None:
    with row_named(em, row):
        emit_thread_copy(em, op, valid, at_stage(em, op.operands[1], stage), at_stage(em, op.operands[2], stage))


def emit_thread_copy(em, op: CopyAsyncArriveOp, valid: str, buf: str, bar: str) -> None:
    """Each thread copies its chunks of the row (its CTA's part) to where it will read them, 16
    bytes at a time where a chunk allows, and arrives on the barrier once they have landed (a
    thread of a slot without a row arrives at once)."""
    src = op.operands[0]
    isz = src.ttype.dtype.itemsize
    if [ix.kind for ix in op.index] != ["point"] * (src.ttype.rank - 1) + ["all"]:
        raise CodegenError("row kernels copy whole rows (x[m, :]) into shared memory", op.loc)
    chunk = em.V * isz
    piece = 16 if chunk % 16 == 0 else chunk
    if piece not in (4, 8, 16) or (em.N * isz) % piece:
        raise CodegenError(f"cp.async copies 4, 8 or 16 aligned bytes; chunks of {em.V} x {isz} bytes in rows of "
                           f"{em.N} do not split so", op.loc, "copy the row in bulk: stage-rows{copy=bulk}")
    per = piece // isz
    em.emit(f"if ({valid}) {{")
    em.indent += 1
    em.emit("#pragma unroll")
    em.emit(f"for (int e = 0; e < {em.E}; ++e) {{")
    em.indent += 1
    em.emit(f"const long long j = {em.row.chunk_start_c('e', 'kfc_g')};")
    for p in range(chunk // piece):
        at = f"(j + {p * per})" if p else "j"
        addr = f"{em.name(src)} + {em._address(op, src, op.index, op.operands[3:], at)}"
        dst = f"{buf} + (unsigned)({em.row.cta_offset_c('e', 'kfc_t')} + {p * per}) * {isz}u"
        copy = ptx.cp_async_to_shared(dst, addr, piece)
        em.emit(copy if em.exact else f"if ({at} < {em.N}) {copy}")
    em.indent -= 1
    em.emit("}")
    em.indent -= 1
    em.emit("}")
    em.emit(ptx.cp_async_mbarrier_arrive(bar))


@rule(MbarrierWaitOp)
def emit_mbarrier_wait(em, op: MbarrierWaitOp) -> None:
    # one phase per iteration; with two stages each barrier completes every other iteration
    parity = "kfc_phase" if em.S == 1 else f"((kfc_it / {em.S}) & 1u)"
    em.emit(ptx.mbarrier_wait_parity(em.name(op.operands[0]), parity))


def cta_part_bytes(em, buffer: TensorType) -> int:
    """The bytes of one staged row this CTA holds: its spans, the last one padded."""
    return em.E * em.row.span * buffer.dtype.itemsize


def copies_on(em, bar: Value) -> list[CopyAsyncOp]:
    return [o for o in em.launch.body.ops if isinstance(o, CopyAsyncOp) and o.operands[2] is bar]

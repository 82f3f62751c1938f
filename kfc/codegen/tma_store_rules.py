"""Emission rules for the epilogue through shared memory (kfc.ir.mma_ops.tma_store): registers
into a swizzled staging slot, the slot to global memory by TMA, and the wait until the store
has read it. Each warpgroup works alone on its 64 rows, meeting at a named barrier of its own
(1 + its index in the CTA, whatever role it is in: barrier 0 is the CTA's)."""

from __future__ import annotations

from ..ir import layouts
from ..ir.dtypes import DType
from ..ir.mma_ops import CHUNK_BYTES, STORE_ROWS, StageFragmentOp, TmaStoreOp, TmaStoreWaitOp
from . import float16, ptx
from .errors import CodegenError
from .mma_rules import stage_bytes
from .rules import rule

WARPGROUP_THREADS = 128
# a pair of adjacent columns as one shared-memory store: (C type of the pair, asm store of it)
PAIRS = {DType.BF16: (float16.PAIR[DType.BF16], "st.shared.b32", "r", "unsigned"),
         DType.F16: (float16.PAIR[DType.F16], "st.shared.b32", "r", "unsigned"),
         DType.F32: ("float2", "st.shared.v2.f32", None, None)}


def _warpgroup_barrier() -> str:
    return ptx.bar_sync_threads("1 + threadIdx.x / 128", WARPGROUP_THREADS)


def staged_registers(frag, column: int, width: int) -> tuple[int, int]:
    """The registers [first, last) of each thread holding columns [column, column + width) of a
    warpgroup fragment, for every piece of rows it holds (columns are the slow index)."""
    return frag.registers(column), frag.registers(column + width)


@rule(StageFragmentOp)
def emit_stage_fragment(em, op: StageFragmentOp) -> None:
    """Each thread's registers of the chunk's columns, two adjacent columns per store, where the
    128-byte swizzle puts them: 16-byte unit u of row r lands at unit u ^ (r % 8). A warp's
    stores of one register pair cover 8 rows whose units the swizzle spreads over every bank."""
    value, tile, slot = op.operands
    t = tile.ttype
    if t.dtype not in PAIRS:
        raise CodegenError(f"{op.NAME} stages bf16, f16 or f32 fragments, not {t.dtype}", op.loc)
    frag = layouts.of(value.ttype.layout)
    width = t.shape[3]
    size = t.dtype.itemsize
    first, last = staged_registers(frag, op.column, width)
    pair_t, store, constraint, bits = PAIRS[t.dtype]
    em.emit("#pragma unroll")
    em.emit(f"for (int i = {first}; i < {last}; i += 2) {{")
    em.emit(f"  const unsigned r = {frag.row_c('i', 'kfc_tid')};")
    em.emit(f"  const unsigned b = (unsigned)({frag.col_c('i', 'kfc_tid')} - {op.column}) * {size}u;")
    em.emit(f"  const unsigned a = {em.name(tile)} + (unsigned)({em.name(slot)}) * {stage_bytes(t)}u + "
            f"r * {CHUNK_BYTES}u + ((((b >> 4) ^ (r & 7u)) << 4) | (b & 15u));")
    with em.register_locals() as lets:
        v0, v1 = em.elem(value, "i"), em.elem(value, "i + 1")
    for line in lets:
        em.emit("  " + line)
    em.emit(f"  {pair_t} w; w.x = {v0}; w.y = {v1};")
    # no "memory" clobber: the stores may not pin a fused epilogue's global loads (a bias) behind
    # them, one L2 round trip per register pair; the fence and barrier of gpu.tma_store (asm
    # with the clobber) order them before the store
    if constraint:
        em.emit(f'  asm volatile("{store} [%0], %1;" :: "r"(a), "{constraint}"(*reinterpret_cast<{bits}*>(&w)));')
    else:
        em.emit(f'  asm volatile("{store} [%0], {{%1, %2}};" :: "r"(a), "f"(w.x), "f"(w.y));')
    em.emit("}")


@rule(TmaStoreOp)
def emit_tma_store(em, op: TmaStoreOp) -> None:
    """The warpgroup meets (its fenced writes are all in), and its first thread stores its rows:
    a box of 64 rows per piece, committed as one bulk group."""
    tmap, tile, slot, row, col = op.operands
    t = tile.ttype
    P = op.pieces
    em.emit(_warpgroup_barrier())
    em.emit("if ((kfc_tid & 127) == 0) {")
    for piece in range(P):
        fn = "kfc_tma_store_2d" if piece == P - 1 else "kfc_tma_store_2d_part"
        first = f"(kfc_wg * {P} + {piece})" if P > 1 else "kfc_wg"
        em.emit(f"  {fn}(&{em.name(tmap)}, {em.name(tile)} + (unsigned)({em.name(slot)}) * "
                f"{stage_bytes(t)}u + {first} * {STORE_ROWS * CHUNK_BYTES}u, (int)({em.name(col)}), "
                f"(int)({em.name(row)} + {first} * {STORE_ROWS}));")
    em.emit("}")


@rule(TmaStoreWaitOp)
def emit_tma_store_wait(em, op: TmaStoreWaitOp) -> None:
    """The storing thread waits for its bulk groups to have read their slots, then the warpgroup
    meets: no thread writes a slot before its store has read it."""
    em.emit(f"if ((kfc_tid & 127) == 0) {ptx.bulk_wait_read(op.pending)}")
    em.emit(_warpgroup_barrier())

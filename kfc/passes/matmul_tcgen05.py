"""accelerate-matmul on Blackwell (tcgen05): the accumulator in tensor memory, one thread
issuing tcgen05.mma on each k-tile's stage and committing it to an mbarrier, then the warpgroup
loading the accumulator 32 columns at a time for the epilogue and the store. TMA-fed operands
take a producer warpgroup (gpu.roles); others are copied by the threads into two stages. `p` is
the AccelerateMatmul pass whose options (bm, bn, bk, stages, group, copy) and shared builders
(stages, TMA loads, the producer loop, the epilogue) these use; kfc.passes.accelerate_matmul
runs them where the target's MMA is tcgen05."""

from __future__ import annotations

from ..ir import layouts
from ..ir.builder import Builder
from ..ir.core import Block, Value
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.mma_ops import (TMEM_LOAD_COLUMNS, CtaBarrierOp, GridOp, MbarrierArrayOp, MbarrierWaitParityOp, RolesOp,
                          SingleThreadOp, StoreTileOp, Tcgen05CommitOp, Tcgen05MmaOp, TmemAllocOp, TmemDeallocOp,
                          TmemLoadOp, barrier_array_type)
from ..ir.tile_ops import IndexDim
from ..ir.types import MemSpace, TensorType
from .base import PassError
from .matmul_epilogue import epilogue


def run_tcgen05(p, func: FuncOp, ctx, m, ops) -> FuncOp:
    """Blackwell: the accumulator in tensor memory, one thread issuing tcgen05.mma on each
    k-tile's stage and committing it to an mbarrier, then the warpgroup loading the
    accumulator 32 columns at a time for the epilogue and the store. TMA-fed operands take
    a producer warpgroup (_tcgen05_tma); others are copied by the threads (_tcgen05_threads).
    `ops` is what the pass resolved of the product (AccelerateMatmul.operands)."""
    if p.bm != layouts.TMEM_LANES:
        raise PassError(f"accelerate-matmul: the tcgen05 kernel computes tiles of {layouts.TMEM_LANES} rows, not "
                        f"bm={p.bm}", m.dot.loc, f"leave bm at {layouts.TMEM_LANES}; on sm_90a the wgmma kernel takes "
                        "other heights")
    if p.tiles != "grid":
        raise PassError(f"accelerate-matmul: the tcgen05 kernel computes one tile a CTA, not tiles={p.tiles}",
                        m.dot.loc, "leave tiles at grid; on sm_90a the wgmma kernel takes persistent tiles")
    A, B, C, M, N, K = ops.A, ops.B, ops.C, ops.M, ops.N, ops.K
    by_tma = ops.copy == "tma"
    p.check_smem(ops, ctx, func)
    b = Builder()
    pm, pn = Value(TensorType(DType.INDEX), "pm"), Value(TensorType(DType.INDEX), "pn")
    with b.at(m.dot.loc), b.region() as top:
        with b.region() as inner:
            row0 = b.binary("mul", pm, b.const(p.bm, DType.INDEX), name="row0")
            col0 = b.binary("mul", pn, b.const(p.bn, DType.INDEX), name="col0")
            acc = b.create(TmemAllocOp, [], [TensorType(DType.F32, (p.bm, p.bn), MemSpace.TMEM,
                                                        layouts.TensorMemory().as_layout())], name="acc").result
            if by_tma:
                _tcgen05_tma(p, b, m, A, B, C, K, acc, row0, col0, ops.approx_tanh)
            else:
                _tcgen05_threads(p, b, m, A, B, C, K, acc, row0, col0, ops.approx_tanh)
            b.create(TmemDeallocOp, [acc], [])
        top.append(GridOp(regions=(Block((pm, pn), inner),), grid=(-(-M // p.bm), -(-N // p.bn)),
                          threads=256 if by_tma else 128, group=p.group, loc=m.dot.loc))
    p.note_copy(ops, ctx)
    ctx.note(p, "tcgen05: " + ("a producer warpgroup loads by TMA" if by_tma else
                                  "the threads copy the operands' tiles") + ", one thread issues the MMAs into "
             "tensor memory")
    return func.evolve(regions=(Block(func.args, [*m.prelude, *top]),))

def _tmem_epilogue(p, b: Builder, m, C: Value, acc: Value, row0: Value, col0: Value, approx: bool) -> None:
    """The accumulator 32 columns at a time into registers, the .kfc's epilogue on them, the store."""
    chunk_t = TensorType(DType.F32, (p.bm, TMEM_LOAD_COLUMNS), layout=layouts.TmemRows().as_layout())
    with b.for_(b.const(0, DType.INDEX), b.const(p.bn // TMEM_LOAD_COLUMNS, DType.INDEX),
                b.const(1, DType.INDEX), iv_name="chunk") as chunks:
        col = b.binary("mul", chunks.iv, b.const(TMEM_LOAD_COLUMNS, DType.INDEX), name="col")
        part = b.create(TmemLoadOp, [acc, col], [chunk_t], name="part").result
        at = b.binary("add", col0, col, name="at")
        value = epilogue(b, m, part, chunk_t, at, approx)
        b.create(StoreTileOp, [value, C, row0, at], [],
                 index=(IndexDim("slice", p.bm), IndexDim("slice", TMEM_LOAD_COLUMNS)))

def _tcgen05_tma(p, b: Builder, m, A: Value, B: Value, C: Value, K: int, acc: Value, row0: Value,
                 col0: Value, approx: bool) -> None:
    """A producer warpgroup's thread loads k-tile kt by TMA once empty[s] says its stage is
    free; thread 0 of the MMA warpgroup issues its MMAs and commits them to empty[s], the last
    to `done`, which the whole warpgroup waits on before the epilogue."""
    S, kt_count = p.stages, -(-K // p.bk)


    sa, sb, full, load = p.tma_stages(b, A, B)
    empty = b.create(MbarrierArrayOp, [], [barrier_array_type(S)], arrivals=1, name="empty").result
    done = b.create(MbarrierArrayOp, [], [barrier_array_type(1)], arrivals=1, name="done").result
    with b.region() as producer:
        with b.region() as one_thread:
            p.produce(b, empty, load, kt_count, row0, col0, b.as_index(0))
        b.create(SingleThreadOp, [], [], regions=[Block((), one_thread)])
    with b.region() as mma:
        with b.region() as one_thread:
            with b.for_(b.as_index(0), b.as_index(kt_count), b.as_index(1), iv_name="kt") as loop:
                s = b.binary("rem", loop.iv, b.as_index(S), name="s")
                parity = b.binary("rem", b.binary("div", loop.iv, b.as_index(S)), b.as_index(2), name="parity")
                b.create(MbarrierWaitParityOp, [full, s, parity], [])
                b.create(Tcgen05MmaOp, [acc, sa, sb, s, b.cmp("gt", loop.iv, b.as_index(0))], [])
                b.create(Tcgen05CommitOp, [empty, s], [])  # the stage is free once these are done
            b.create(Tcgen05CommitOp, [done, b.as_index(0)], [])
        b.create(SingleThreadOp, [], [], regions=[Block((), one_thread)])
        b.create(MbarrierWaitParityOp, [done, b.as_index(0), b.as_index(0)], [])
        _tmem_epilogue(p, b, m, C, acc, row0, col0, approx)
    b.create(RolesOp, [], [], regions=[Block((), producer), Block((), mma)], warpgroups=(1, 1))

def _tcgen05_threads(p, b: Builder, m, A: Value, B: Value, C: Value, K: int, acc: Value, row0: Value,
                     col0: Value, approx: bool) -> None:
    """Operands TMA cannot move: the warpgroup's threads copy k-tile kt + 1 into the other of
    two stages while k-tile kt's MMAs run, once the MMAs of k-tile kt - 1, which read that
    stage, are done (their commit to mma_done[stage]); then a fence and a barrier."""
    kt_count = -(-K // p.bk)


    sa, sb = p.staged_tiles(b, A, B, 2)
    mma_done = b.create(MbarrierArrayOp, [], [barrier_array_type(2)], arrivals=1, name="mma_done").result

    def copy(kt: Value, s: Value) -> None:
        p.copy_tiles(b, m, sa, sb, kt, s, row0, col0)

    copy(b.as_index(0), b.as_index(0))
    b.create(CtaBarrierOp, [], [])
    with b.for_(b.as_index(0), b.as_index(kt_count), b.as_index(1), iv_name="kt") as loop:
        kt = loop.iv
        s = b.binary("rem", kt, b.as_index(2), name="s")
        with b.region() as one_thread:
            b.create(Tcgen05MmaOp, [acc, sa, sb, s, b.cmp("gt", kt, b.as_index(0))], [])
            b.create(Tcgen05CommitOp, [mma_done, s], [])
        b.create(SingleThreadOp, [], [], regions=[Block((), one_thread)])
        nxt = b.binary("add", kt, b.as_index(1), name="next")
        with b.region() as ahead:
            other = b.binary("rem", nxt, b.as_index(2), name="other")
            with b.region() as after_first:  # k-tile kt - 1's MMAs read the other stage
                b.create(MbarrierWaitParityOp, [mma_done, other, b.binary(
                    "rem", b.binary("div", b.binary("sub", kt, b.as_index(1)), b.as_index(2)), b.as_index(2), name="parity")], [])
            b.if_(b.cmp("gt", kt, b.as_index(0)), after_first, [], [], [], [])
            copy(nxt, other)
        b.if_(b.cmp("lt", nxt, b.as_index(kt_count)), ahead, [], [], [], [])
        b.create(CtaBarrierOp, [], [])
    # the last k-tile's commit: every MMA is done once its phase completes
    last = (kt_count - 1) % 2
    b.create(MbarrierWaitParityOp, [mma_done, b.as_index(last), b.as_index(((kt_count - 1) // 2) % 2)], [])
    if kt_count >= 2:  # the phase of the k-tile before it, which nobody waited for
        b.create(MbarrierWaitParityOp, [mma_done, b.as_index(1 - last), b.as_index(((kt_count - 2) // 2) % 2)], [])
    _tmem_epilogue(p, b, m, C, acc, row0, col0, approx)

"""Blackwell's tensor-core MMA (tcgen05): the accumulator in tensor memory, MMAs one thread
issues on staged tiles, the commit that makes an mbarrier's phase wait for them, and the load
of the accumulator's columns into registers.

    %acc = gpu.tmem_alloc : f32[128, 256] @tmem #tmem
        columns of tensor memory for the CTA (warp 0 allocates them for all)
    gpu.tcgen05_mma %acc, %sa, %sb, %s, %accumulate
        acc (+)= A·B of stage s (A K-major, B N-major, as gpu.wgmma takes them), issued
        asynchronously by one thread; `accumulate` false overwrites what acc held
    gpu.tcgen05_commit %bars, %s
        bars[s]'s phase gets one arrival once every tcgen05.mma this thread issued is done
    %t = gpu.tmem_load %acc, %col : f32[128, 32] #tmem_rows
        columns col .. col + 31 of acc into registers: thread t of the warpgroup row t
    gpu.tmem_dealloc %acc
        the CTA gives its columns back (after every thread is done with them)

The interpreter computes an MMA when it is issued and keeps it in flight, reading its stages
and writing acc, until a phase that a commit made wait for it completes: a copy into such a
stage, or a load of acc, before then is a hazard at the op that does it.
"""

from __future__ import annotations

import numpy as np

from .. import layouts
from ..core import Op, define_op
from ..dtypes import DType
from ..smem_ops import HazardError
from ..tile_ops.checks import check_int_scalar, tensor_of
from ..types import MemSpace, TensorType
from .grid import TCGEN05, is_barrier_array, stage_index, tcgen05_groups_of, unfenced_of
from .schedule import yield_point
from .wgmma import wgmma_operands

TMEM_LOAD_COLUMNS = 32  # columns a tcgen05.ld .32x32b.x32 brings: 32 registers a thread


class TensorMemoryTile:
    """An accumulator in tensor memory: its cells (None when only the protocol is followed)."""

    def __init__(self, name: str, data: np.ndarray | None) -> None:
        self.name = name
        self.data = data


def _is_tmem(t) -> bool:
    return isinstance(t, TensorType) and t.space is MemSpace.TMEM and t.layout is not None \
        and t.layout.kind == layouts.TensorMemory.KIND


@define_op("gpu.tmem_alloc", operands=0, results=1)
class TmemAllocOp(Op):
    def verify_(self) -> None:
        t = tensor_of(self, self.result, "result")
        if not _is_tmem(t):
            raise self.error(f"allocates a tile in tensor memory, f32[128, N] @tmem #tmem, not {t}")
        cols = t.shape[1]
        if cols < 32 or cols & (cols - 1):
            raise self.error(f"tensor memory is allocated in powers of two from 32 columns, not {cols}")

    @property
    def columns(self) -> int:
        return self.result.ttype.shape[1]

    def interpret(self, interp, ins, env):
        t = self.result.ttype
        return [TensorMemoryTile(self.result.name or "tmem", np.full(t.shape, np.nan, dtype=np.float32))]


@define_op("gpu.tmem_dealloc", traits={"writes_memory"}, operands=1, results=0)
class TmemDeallocOp(Op):
    def verify_(self) -> None:
        if not _is_tmem(self.operands[0].type):
            raise self.error(f"frees a tile of tensor memory, not {self.operands[0].type}")

    def interpret(self, interp, ins, env):
        return None


@define_op("gpu.tcgen05_mma", traits={"writes_memory", "reads_memory"}, operands=5, results=0)
class Tcgen05MmaOp(Op):
    """Operands: the accumulator in tensor memory, A's and B's staged tiles, the stage, and
    whether to add to what the accumulator holds."""

    def verify_(self) -> None:
        acc, a, b = (tensor_of(self, v, w) for v, w in zip(self.operands, ("accumulator", "A", "B")))
        if not _is_tmem(acc) or acc.dtype is not DType.F32:
            raise self.error(f"accumulates in f32 in tensor memory (@tmem #tmem), not {acc}")
        check_int_scalar(self, self.operands[3], "stage")
        flag = self.operands[4].ttype
        if not (flag.is_scalar and flag.dtype is DType.BOOL):
            raise self.error(f"`accumulate` is a scalar bool, not {flag}")
        as_fragment = TensorType(DType.F32, acc.shape, layout=layouts.WgmmaAccumulator(acc.shape[0] // 64).as_layout())
        problem = wgmma_operands(as_fragment, a, b)
        if problem:
            raise self.error(problem.replace("the accumulator is held in a #wgmma_acc layout", "the accumulator"))

    def advance(self, machine, ins) -> int:
        """Issued reading stage s (returned) of A and B, which must have landed, and writing acc."""
        yield_point(machine)
        acc, ta, tb = ins[0], ins[1], ins[2]
        s = stage_index(self, ins[3], self.operands[1].ttype.shape[0])
        for t in (ta, tb):
            if (id(t), s) in unfenced_of(machine):
                raise HazardError(f"{self.NAME}: reads stage {s} of {t.name}, which the threads wrote, before a "
                                  "gpu.fence_proxy_async", self.loc, "fence the threads' copies first")
            t.stage_ready(self, s)
        tcgen05_groups_of(machine).append({(id(ta), s), (id(tb), s), ("tmem", id(acc)), TCGEN05})
        return s

    def interpret(self, interp, ins, env):
        acc, ta, tb = ins[0], ins[1], ins[2]
        s = self.advance(interp, ins)
        a2 = np.concatenate(list(ta.data[s]), axis=1).astype(np.float32)
        b2 = np.concatenate(list(tb.data[s]), axis=1).astype(np.float32)
        before = acc.data if bool(ins[4]) else np.zeros_like(acc.data)
        acc.data = (before + a2 @ b2).astype(np.float32)
        return None


@define_op("gpu.tcgen05_commit", traits={"writes_memory"}, operands=2, results=0)
class Tcgen05CommitOp(Op):
    def verify_(self) -> None:
        if not is_barrier_array(self.operands[0].type):
            raise self.error(f"arrives on an array of mbarriers, not {self.operands[0].type}")
        check_int_scalar(self, self.operands[1], "stage")

    def advance(self, machine, ins) -> None:
        """One arrival on bars[s]: its phase waits for every tcgen05.mma issued before."""
        yield_point(machine)
        bars = ins[0]
        bar = bars[stage_index(self, ins[1], len(bars))]
        bar.arrive(self)
        bar.retires.extend(tcgen05_groups_of(machine))

    def interpret(self, interp, ins, env):
        self.advance(interp, ins)
        return None


@define_op("gpu.tmem_load", traits={"reads_memory"}, operands=2, results=1)
class TmemLoadOp(Op):
    """Columns col .. col + C - 1 of the accumulator into a [128, C] #tmem_rows tile."""

    def verify_(self) -> None:
        acc = tensor_of(self, self.operands[0], "accumulator")
        if not _is_tmem(acc):
            raise self.error(f"loads from tensor memory, not {acc}")
        check_int_scalar(self, self.operands[1], "column")
        t = tensor_of(self, self.result, "result")
        if t.layout is None or t.layout.kind != layouts.TmemRows.KIND or t.dtype is not acc.dtype \
                or t.shape != (acc.shape[0], TMEM_LOAD_COLUMNS):
            raise self.error(f"its result is {acc.dtype}[{acc.shape[0]}, {TMEM_LOAD_COLUMNS}] #tmem_rows, not {t}")

    def advance(self, machine, ins) -> None:
        yield_point(machine)
        acc = ins[0]
        if any(("tmem", id(acc)) in g for g in tcgen05_groups_of(machine)):
            raise HazardError(f"{self.NAME}: reads {acc.name} while a tcgen05.mma writing it is in flight", self.loc,
                              "commit the MMAs to an mbarrier (gpu.tcgen05_commit) and wait on it first")

    def interpret(self, interp, ins, env):
        self.advance(interp, ins)
        col = int(np.asarray(ins[1]))
        return [ins[0].data[:, col:col + TMEM_LOAD_COLUMNS].copy()]

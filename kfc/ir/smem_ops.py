"""Shared memory, mbarriers and bulk asynchronous copies: the `gpu` dialect's memory ops.

    %s = gpu.smem_alloc : bf16[4096] @shared
        a buffer in the CTA's shared memory; until something is copied in it reads as poison
    %b = gpu.mbarrier_alloc {arrivals = 1} : i64[] @shared
        an mbarrier (a 64-bit shared-memory word): a phase completes when `arrivals` arrivals
        were counted and every byte they announced has landed
    gpu.expect_tx %b {bytes = 8192}
        one arrival that also announces `bytes` more bytes of transactions (arrive.expect_tx)
    gpu.copy_async %x, %s, %b, %m {index = [point, all]}
        copy x[m, :] into s in the background (cp.async.bulk); elements past the tensor's bounds
        land as zeros; the copy's bytes count against b's announced bytes; s holds the data only
        once b's phase completed
    gpu.copy_async_arrive %x, %s, %b, %m {index = [point, all]}
        the same copy made by the threads, each its share (cp.async); its landing is one of b's
        arrivals and announces no bytes
    gpu.mbarrier_wait %b
        wait for b's current phase to complete; the copies on it become visible

Each op carries its own semantics (`interpret`), run by kfc.ir.interpreter on a small machine
model (`SharedBuffer`, `MBarrier`): a wait that cannot complete is a deadlock at the wait, a
read of a buffer whose copy is still in flight and a copy over a buffer whose previous copy was
not waited for are hazards at the op that commits them. kfc.ir.barriers proves the same
statically, for every loop body, whenever the IR is verified.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import numpy as np

from ..diagnostics import InterpretError
from .core import Op, define_op
from .dtypes import DType, poison_value
from .tile_ops import IndexDim, indexed_shape
from .tile_ops.checks import check_results, tensor_of
from .tile_ops.memory import index_tuple, verify_index
from .types import MemSpace, TensorType

BARRIER_TYPE = TensorType(DType.I64, (), MemSpace.SHARED)


class HazardError(InterpretError):
    """A program that would read or overwrite shared memory at the wrong time, or wait forever."""


def is_barrier(t) -> bool:
    return t == BARRIER_TYPE


def is_shared_buffer(t) -> bool:
    return isinstance(t, TensorType) and t.space is MemSpace.SHARED and t.rank >= 1


def copy_bytes(t: TensorType) -> int:
    """The bytes a copy into buffer type t delivers (every element, zero-filled ones included)."""
    return t.numel() * t.dtype.itemsize


# --- the machine model the interpreter runs ----------------------------------------------------


@attrs.define(eq=False)
class SharedBuffer:
    """A shared-memory buffer: its contents and the barrier whose phase will deliver a copy."""

    name: str
    data: np.ndarray
    pending: "MBarrier | None" = None


@attrs.define(eq=False)
class MBarrier:
    name: str
    arrivals: int
    arrived: int = 0
    announced: int = 0      # bytes announced by expect_tx in this phase
    delivered: int = 0      # bytes the copies of this phase carry
    phase: int = 0
    copies: list = attrs.Factory(list)  # (buffer, data) landing when the phase completes
    # groups of asynchronous MMAs (sets of what they read and write) a tcgen05.commit made this
    # phase wait for: they are done once it completes, and their sets are emptied
    retires: list = attrs.Factory(list)

    def arrive(self, op: Op) -> None:
        """Count one arrival of `op` in the current phase."""
        if self.arrived == self.arrivals:
            raise HazardError(f"{op.NAME}: {overshoot(self.name, self.arrivals)}; this arrival belongs to no phase "
                              "anyone waits for", op.loc)
        self.arrived += 1

    def complete(self, op: Op) -> list:
        """End the current phase at `op`'s wait: every arrival counted and every announced byte
        delivered, else the wait never returns (a deadlock at it). Returns the phase's copies,
        for the caller to land."""
        blocked = self.blocker(op)
        if blocked is not None:
            raise blocked
        copies, self.copies = self.copies, []
        for group in self.retires:
            group.clear()
        self.retires = []
        self.arrived = self.announced = self.delivered = 0
        self.phase ^= 1
        return copies

    def blocker(self, op: Op) -> "HazardError | None":
        """Why a wait at `op` cannot end the current phase now (None when it can)."""
        if self.arrived < self.arrivals:
            return HazardError(f"{op.NAME}: {missing_arrivals(self.name, self.arrivals, self.arrived)}", op.loc,
                               HINT_ANNOUNCE)
        if self.delivered != self.announced:
            return HazardError(f"{op.NAME}: {wrong_bytes(self.name, self.announced, self.delivered)}", op.loc,
                               HINT_BYTES)
        return None

    def outstanding(self) -> str | None:
        """What keeps the current phase open, or None when nothing was started in it."""
        if self.copies or self.arrived or self.announced:
            return (f"{self.arrived} of {self.arrivals} arrival(s), {self.delivered} of {self.announced} "
                    f"announced byte(s) delivered")
        return None


def value_name(v) -> str:
    return f"%{v.name}" if v.name else "a buffer"


# The protocol's violations, said the same way by the interpreter (kfc.ir.smem_ops, at run time)
# and the barrier check (kfc.ir.barriers, statically); arguments are names as value_name gives.
def overshoot(bar: str, arrivals: int) -> str:
    return f"{bar} already counted its {arrivals} arrival(s) in this phase"


def copy_over_in_flight(buf: str, bar: str) -> str:
    return f"copies over {buf} while the copy into it before is in flight (nobody waited on {bar})"


def read_in_flight(buf: str, bar: str) -> str:
    return f"reads {buf} while the copy into it is in flight (nobody waited on {bar})"


def missing_arrivals(bar: str, arrivals: int, arrived: int) -> str:
    return f"deadlock: waits on {bar}, which counts {arrivals} arrival(s), but {arrived} arrive before the wait"


def wrong_bytes(bar: str, announced: int, delivered: int) -> str:
    return (f"deadlock: {bar} is announced {announced} byte(s) but its copies carry {delivered}; "
            "the phase never completes")


def never_waited(buf: str, bar: str) -> str:
    return f"the copy into {buf} is never waited for (its barrier {bar})"


HINT_WAIT_BEFORE_REUSE = "wait on the earlier copy's barrier before reusing the buffer"
HINT_WAIT_BEFORE_READ = "wait on the copy's barrier before reading"
HINT_ANNOUNCE = "announce the copies with gpu.expect_tx before waiting"
HINT_BYTES = "the expect_tx bytes must equal the bytes of the copies on the barrier"
HINT_WAIT_BEFORE_END = "wait on the barrier before the data is used or the iteration ends"


# --- ops ---------------------------------------------------------------------------------------


@define_op("gpu.smem_alloc", operands=0, results=1)
class SmemAllocOp(Op):
    def verify_(self) -> None:
        t = tensor_of(self, self.result, "result")
        if not is_shared_buffer(t) or t.optional or t.layout is not None:
            raise self.error(f"allocates a shared-memory buffer (dtype[shape] @shared), not {t}")

    def interpret(self, interp, ins, env):
        t = self.result.ttype
        data = np.full(interp.shape_of(t), poison_value(t.dtype), dtype=t.dtype.np)
        return [SharedBuffer(value_name(self.result), data)]


@define_op("gpu.mbarrier_alloc", operands=0, results=1)
class MbarrierAllocOp(Op):
    """An mbarrier for one iteration's copies. With `stages` = 2 the code generator issues the
    copies announced on it one row ahead, into a second set of their buffers, so that the next
    row's copy overlaps this row's work; each iteration's protocol (announce, copy, wait, read)
    is unchanged, and so are its semantics."""

    arrivals: int = 1
    stages: int = 1

    def verify_(self) -> None:
        if not is_barrier(self.result.type):
            raise self.error(f"its result is an mbarrier, {BARRIER_TYPE}, not {self.result.type}")
        if not 1 <= self.arrivals < 1 << 20:
            raise self.error(f"arrivals must be 1..2^20-1, not {self.arrivals}")
        if self.stages not in (1, 2):
            raise self.error(f"stages must be 1 or 2, not {self.stages}")

    def interpret(self, interp, ins, env):
        bar = MBarrier(value_name(self.result), self.arrivals)
        interp.barriers.append((bar, self))
        return [bar]


def copies_not_indexed_by_row(body) -> list:
    """The copies of a row loop's body whose row is not the loop's index itself: one issued a row
    ahead (a barrier of two stages) addresses the next row, which only the index tells."""
    row = body.args[0]
    return [op for op in body.ops if isinstance(op, CopyAsyncOp) and tuple(op.operands[3:]) != (row,)]


def _barrier_operand(op: Op, v) -> None:
    if not is_barrier(v.type):
        raise op.error(f"operand {value_name(v)} must be an mbarrier ({BARRIER_TYPE}), not {v.type}")


@define_op("gpu.expect_tx", traits={"writes_memory"}, operands=1, results=0)
class ExpectTxOp(Op):
    bytes: int = 0

    def verify_(self) -> None:
        _barrier_operand(self, self.operands[0])
        if not 0 <= self.bytes < 1 << 31:
            raise self.error(f"announces {self.bytes} bytes; a phase carries 0..2^31-1")

    def interpret(self, interp, ins, env):
        bar = ins[0]
        bar.arrive(self)
        bar.announced += self.bytes
        return None


@define_op("gpu.copy_async", traits={"writes_memory", "reads_memory"})
class CopyAsyncOp(Op):
    """Operands: the source tensor, the destination buffer, the barrier, the source's index
    operands. The indexed region of the source has the buffer's shape."""

    # whether the copy's landing is an arrival on its barrier (else its bytes complete announced ones)
    ARRIVES: ClassVar[bool] = False
    index: tuple[IndexDim, ...] = attrs.field(converter=index_tuple)

    def verify_(self) -> None:
        if len(self.operands) < 3:
            raise self.error("needs a source tensor, a shared-memory buffer and an mbarrier")
        check_results(self, 0)
        src = tensor_of(self, self.operands[0], "source")
        dst = tensor_of(self, self.operands[1], "destination")
        _barrier_operand(self, self.operands[2])
        if src.space is not MemSpace.GLOBAL:
            raise self.error(f"copies from global memory, not from {src}")
        if not is_shared_buffer(dst):
            raise self.error(f"copies into a shared-memory buffer, not {dst}")
        verify_index(self, src, self.index, self.operands[3:])
        region = tuple(indexed_shape(src, self.index))
        if region != dst.shape or src.dtype is not dst.dtype:
            raise self.error(f"the indexed region {src.dtype}{list(region)} of the source is not the buffer's "
                             f"type {dst}")

    def interpret(self, interp, ins, env):
        src, buf, bar = ins[0], ins[1], ins[2]
        if buf.pending is not None:
            raise HazardError(f"{self.NAME}: {copy_over_in_flight(buf.name, buf.pending.name)}", self.loc,
                              HINT_WAIT_BEFORE_REUSE)
        t = self.operands[1].ttype
        if src is None:
            data = np.zeros(buf.data.shape, dtype=t.dtype.np)
        else:
            data = interp.gather(self, self.operands[0].ttype, self.index, ins[3:], src, 0, buf.data.shape,
                                 t.dtype.np)
        if self.ARRIVES:
            bar.arrive(self)
        else:
            bar.delivered += copy_bytes(t.bind(interp.dims))
        buf.pending = bar
        bar.copies.append((buf, data))
        return None


@define_op("gpu.copy_async_arrive")
class CopyAsyncArriveOp(CopyAsyncOp):
    """gpu.copy_async made by the threads, each copying its share of the region (cp.async), and
    arriving on the barrier once its share landed: the whole copy counts as one arrival of the
    barrier's phase (the code generator initialises the barrier with an arrival per thread) and
    announces no bytes. No copy engine is involved and no thread issues the whole row."""

    ARRIVES: ClassVar[bool] = True


@define_op("gpu.mbarrier_wait", traits={"writes_memory"}, operands=1, results=0)
class MbarrierWaitOp(Op):
    def verify_(self) -> None:
        _barrier_operand(self, self.operands[0])

    def interpret(self, interp, ins, env):
        for buf, data in ins[0].complete(self):
            buf.data = data
            buf.pending = None
        return None


SMEM_OPS = (SmemAllocOp, MbarrierAllocOp, ExpectTxOp, CopyAsyncOp, CopyAsyncArriveOp, MbarrierWaitOp)

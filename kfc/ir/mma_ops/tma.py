"""The shared-stage protocol: TMA tensor maps and loads, staged shared-memory tiles, arrays of
mbarriers (announcing bytes, waiting on a phase's parity), the threads' plain copies into a
stage and the fence that makes them visible to wgmma."""

from __future__ import annotations

import attrs
import numpy as np

from .. import layouts
from ..core import Op, define_op
from ..dtypes import poison_value
from ..smem_ops import HINT_WAIT_BEFORE_REUSE, HazardError, MBarrier, value_name
from ..tile_ops.checks import check_int_scalar, tensor_of
from ..types import MemSpace
from .cluster import peer_values
from .schedule import scheduler_of, yield_point
from .grid import (TMA_BOX_LIMIT, StagedCopy, StagedTile, is_barrier_array, is_staged_tile, stage_index,
                   unfenced_of)

# --- TMA ------------------------------------------------------------------------------------------


@define_op("gpu.tensor_map", traits={"pure"}, operands=1, results=1)
class TensorMapOp(Op):
    box: tuple[int, ...] = attrs.field(converter=tuple)
    swizzle: int = 128

    def verify_(self) -> None:
        t = tensor_of(self, self.operands[0], "tensor")
        if t.space is not MemSpace.GLOBAL or t.rank != 2:
            raise self.error(f"describes a rank-2 global tensor, not {t}")
        if len(self.box) != 2 or any(not 1 <= b <= TMA_BOX_LIMIT for b in self.box):
            raise self.error(f"a box is [rows, cols] of 1..{TMA_BOX_LIMIT} elements, not {list(self.box)}")
        if self.swizzle not in layouts.SWIZZLES:
            raise self.error(f"swizzle is one of {layouts.SWIZZLES} bytes, not {self.swizzle}")
        if self.swizzle and self.box[1] * t.dtype.itemsize > self.swizzle:
            raise self.error(f"a box row of {self.box[1]} {t.dtype} is wider than the {self.swizzle}-byte swizzle")
        want = t.without_layout()
        if self.result.type != attrs.evolve(want, layout=self.layout()):
            raise self.error(f"its result is {attrs.evolve(want, layout=self.layout())}, not {self.result.type}")

    def layout(self):
        return layouts.TensorMapBox(self.box[0], self.box[1], self.swizzle).as_layout()

    @property
    def box_bytes(self) -> int:
        return self.box[0] * self.box[1] * self.operands[0].ttype.dtype.itemsize

    def interpret(self, interp, ins, env):
        return [ins[0]]


@define_op("gpu.smem_stages", operands=0, results=1)
class StagesAllocOp(Op):
    def verify_(self) -> None:
        t = tensor_of(self, self.result, "result")
        if not is_staged_tile(t):
            raise self.error(f"allocates stages of a tile, dtype[stages, chunks, rows, cols] @shared #shared<...>, "
                             f"not {t}")

    @property
    def nbytes(self) -> int:
        t = self.result.ttype
        return t.numel() * t.dtype.itemsize

    def interpret(self, interp, ins, env):
        t = self.result.ttype
        return [StagedTile(value_name(self.result), np.full(interp.shape_of(t), poison_value(t.dtype),
                                                            dtype=t.dtype.np))]


@define_op("gpu.mbarrier_array", operands=0, results=1)
class MbarrierArrayOp(Op):
    arrivals: int = 1

    def verify_(self) -> None:
        if not is_barrier_array(self.result.type):
            raise self.error(f"its result is an array of mbarriers, i64[stages] @shared, not {self.result.type}")
        if not 1 <= self.arrivals < 1 << 20:
            raise self.error(f"arrivals must be 1..2^20-1, not {self.arrivals}")

    def interpret(self, interp, ins, env):
        n = self.result.ttype.shape[0]
        bars = [MBarrier(f"{value_name(self.result)}[{s}]", self.arrivals) for s in range(n)]
        for bar in bars:
            interp.barriers.append((bar, self))
        return [bars]


def _barrier_array_operand(op: Op, v) -> int:
    if not is_barrier_array(v.type):
        raise op.error(f"operand {value_name(v)} must be an array of mbarriers (i64[stages] @shared), not {v.type}")
    return v.ttype.shape[0]


@define_op("gpu.expect_tx_at", traits={"writes_memory"}, operands=2, results=0)
class ExpectTxAtOp(Op):
    bytes: int = 0

    def verify_(self) -> None:
        _barrier_array_operand(self, self.operands[0])
        check_int_scalar(self, self.operands[1], "stage")
        if not 0 <= self.bytes < 1 << 20:
            raise self.error(f"announces {self.bytes} bytes; an mbarrier's transaction count holds 0..2^20-1")

    def advance(self, machine, ins) -> None:
        yield_point(machine)
        bar = ins[0][stage_index(self, ins[1], len(ins[0]))]
        bar.arrive(self)
        bar.announced += self.bytes

    def interpret(self, interp, ins, env):
        self.advance(interp, ins)
        return None


@define_op("gpu.tma_load", traits={"writes_memory", "reads_memory"}, operands=6, results=0)
class TmaLoadOp(Op):
    """Operands: the tensor map, the staged tile, the barrier array, the stage, the box's row and
    column in the tensor."""

    chunk: int = 0
    # the box lands in this chunk and stage of every CTA of the cluster, its bytes counted
    # against each CTA's barrier (kfc.ir.mma_ops.cluster)
    multicast: bool = False

    def verify_(self) -> None:
        tm = tensor_of(self, self.operands[0], "tensor map")
        dst = tensor_of(self, self.operands[1], "destination")
        if tm.layout is None or tm.layout.kind != layouts.TensorMapBox.KIND:
            raise self.error(f"loads through a tensor map (gpu.tensor_map), not {tm}")
        if not is_staged_tile(dst):
            raise self.error(f"loads into staged tiles (gpu.smem_stages), not {dst}")
        stages = _barrier_array_operand(self, self.operands[2])
        for v, what in zip(self.operands[3:], ("stage", "row", "column")):
            check_int_scalar(self, v, what)
        box = layouts.of(tm.layout)
        if (box.rows, box.cols) != tuple(dst.shape[2:]) or tm.dtype is not dst.dtype:
            raise self.error(f"a box of {tm.dtype}[{box.rows}, {box.cols}] does not fill a chunk of {dst}")
        if box.swizzle != dst.layout.get("swizzle"):
            raise self.error(f"the tensor map swizzles {box.swizzle} bytes, the tile {dst.layout.get('swizzle')}",
                             "a box lands as its map swizzles it: give both the same swizzle")
        if dst.shape[0] != stages:
            raise self.error(f"{dst.shape[0]} stages of tiles but {stages} barriers")
        if not 0 <= self.chunk < dst.shape[1]:
            raise self.error(f"chunk {self.chunk} is out of range for {dst.shape[1]} chunks")

    def advance(self, machine, ins, box: np.ndarray | None = None) -> None:
        """The copy is issued: its bytes count against the stage's barrier, and it lands (box)
        when that barrier's phase completes."""
        yield_point(machine)
        s = stage_index(self, ins[3], len(ins[2]))
        t = self.operands[1].ttype
        targets = zip(peer_values(machine, self, 1, ins[1]), peer_values(machine, self, 2, ins[2])) \
            if self.multicast else [(ins[1], ins[2])]
        for rank, (tile, bars) in enumerate(targets):
            where = f" of the cluster's CTA {rank}" if self.multicast else ""
            tile.refill(self, machine, s)
            if (s, self.chunk) in tile.pending:
                raise HazardError(f"{self.NAME}: copies over stage {s} of {tile.name}{where} while the copy into it "
                                  f"before is in flight (nobody waited on {tile.pending[(s, self.chunk)].name})",
                                  self.loc, HINT_WAIT_BEFORE_REUSE)
            bar = bars[s]
            bar.delivered += t.shape[2] * t.shape[3] * t.dtype.itemsize  # a box's bytes, zero-filled ones included
            tile.pending[(s, self.chunk)] = bar
            bar.copies.append((StagedCopy(tile, s, self.chunk), box))

    def interpret(self, interp, ins, env):
        src, tile = ins[0], ins[1]
        row, col = int(np.asarray(ins[4])), int(np.asarray(ins[5]))
        rows, cols = tile.data.shape[2:]
        box = np.zeros((rows, cols), dtype=tile.data.dtype)
        r1, c1 = min(src.shape[0], row + rows), min(src.shape[1], col + cols)
        if r1 > row >= 0 and c1 > col >= 0:
            box[:r1 - row, :c1 - col] = src[row:r1, col:c1]
        self.advance(interp, ins, box)
        return None


@define_op("gpu.copy_stage", traits={"writes_memory", "reads_memory"}, operands=5, results=0)
class CopyStageOp(Op):
    """Operands: the tensor, the staged tile, the stage, the tile's row and column in the operand.
    Every thread of the CTA copies its share, element by element: chunk j of the stage takes
    columns col + 64 j onwards; elements past the tensor's bounds are zeros. With `transpose`
    the tensor holds the operand transposed (dot's trans_a, trans_b): tile element (r, c) is
    tensor[col + c, row + r]."""

    transpose: bool = False

    def verify_(self) -> None:
        src = tensor_of(self, self.operands[0], "source")
        dst = tensor_of(self, self.operands[1], "destination")
        if src.space is not MemSpace.GLOBAL or src.rank != 2:
            raise self.error(f"copies from a rank-2 tensor in global memory, not {src}")
        if not is_staged_tile(dst):
            raise self.error(f"copies into staged tiles (gpu.smem_stages), not {dst}")
        if src.dtype is not dst.dtype:
            raise self.error(f"copies {src.dtype} into a tile of {dst.dtype}")
        for v, what in zip(self.operands[2:], ("stage", "row", "column")):
            check_int_scalar(self, v, what)

    def advance(self, machine, ins) -> int:
        """The threads write stage s (returned): no wgmma may still read it, and wgmma sees the
        writes only after a fence."""
        tile = ins[1]
        s = stage_index(self, ins[2], self.operands[1].ttype.shape[0])
        tile.refill(self, machine, s)
        unfenced_of(machine).add((id(tile), s))
        return s

    def interpret(self, interp, ins, env):
        src, tile = ins[0], ins[1]
        s = self.advance(interp, ins)
        row, col = int(np.asarray(ins[3])), int(np.asarray(ins[4]))
        chunks, rows, cols = tile.data.shape[1:]
        box = np.zeros((rows, chunks * cols), dtype=tile.data.dtype)
        src = np.asarray(src).T if self.transpose else src
        r1, c1 = min(src.shape[0], row + rows), min(src.shape[1], col + chunks * cols)
        if r1 > row >= 0 and c1 > col >= 0:
            box[:r1 - row, :c1 - col] = src[row:r1, col:c1]
        tile.data[s] = box.reshape(rows, chunks, cols).transpose(1, 0, 2)
        return None


@define_op("gpu.fence_proxy_async", traits={"writes_memory"}, operands=0, results=0)
class FenceProxyAsyncOp(Op):
    """This thread's writes to shared memory become visible to the async proxy (wgmma, TMA);
    with a gpu.cta_barrier after it, every thread's."""

    def advance(self, machine, ins) -> None:
        unfenced_of(machine).clear()

    def interpret(self, interp, ins, env):
        self.advance(interp, ins)
        return None


@define_op("gpu.mbarrier_wait_parity", traits={"writes_memory"}, operands=3, results=0)
class MbarrierWaitParityOp(Op):
    def verify_(self) -> None:
        _barrier_array_operand(self, self.operands[0])
        check_int_scalar(self, self.operands[1], "stage")
        check_int_scalar(self, self.operands[2], "parity")

    def advance(self, machine, ins) -> list:
        """Wait until the phase of this parity has completed; when this wait ends it, returns its
        copies (StagedCopy, box) for the caller to land. Inside gpu.roles the wait lets the other
        roles run until the phase can end; the phase before the current one (the other parity)
        has completed, and a wait for it returns at once, as on the GPU."""
        bars = ins[0]
        bar = bars[stage_index(self, ins[1], len(bars))]
        parity = int(np.asarray(ins[2]))
        sched = scheduler_of(machine)
        if sched is not None and parity == bar.phase:
            sched.switch(lambda: bar.phase != parity or bar.blocker(self) is None, lambda: bar.blocker(self))
        if parity != bar.phase:
            # the phase of this parity has completed and the wait returns at once; that is the
            # protocol's intent only while nothing of the next phase has begun
            if bar.outstanding():
                raise HazardError(f"{self.NAME}: waits for the phase of parity {parity} of {bar.name}, which is in a "
                                  f"phase of parity {bar.phase} with {bar.outstanding()}: the wait returns before this "
                                  "phase's copies land", self.loc,
                                  "wait with the parity of the barrier's current phase: (uses of the stage) % 2")
            return []
        copies = bar.complete(self)
        for copy, _ in copies:
            del copy.tile.pending[(copy.stage, copy.chunk)]
        return copies

    def interpret(self, interp, ins, env):
        for copy, box in self.advance(interp, ins):
            copy.tile.data[copy.stage, copy.chunk] = box
        return None

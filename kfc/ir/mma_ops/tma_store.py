"""The epilogue through shared memory: a fragment tile written column chunk by column chunk into
staging slots (gpu.stage_fragment), each slot stored to global memory by TMA
(gpu.tma_store), and the wait until a slot's store has read it (gpu.tma_store_wait).

A warpgroup stores its own 64 rows: its threads write their registers into the slot, fence the
writes for the async proxy, meet, and one of them issues the store and commits it as a bulk
group. The store reads the slot asynchronously; the slot may be written again only after a wait
has retired that group. Rows and columns past the tensor's bounds are not written (TMA clips
the box), so every M and N is exact."""

from __future__ import annotations

import numpy as np

from .. import layouts
from ..core import Op, define_op
from ..smem_ops import HazardError
from ..tile_ops.checks import check_int_scalar, tensor_of
from .grid import CHUNK_BYTES, GroupWait, StoreGroup, is_staged_tile, stage_index, store_groups_of, unfenced_of
from .schedule import yield_point

STORE_ROWS = 64  # a warpgroup's rows of a #wgmma_acc fragment: the box each of them stores


def _staging_problem(tile, rows: int | None = None) -> str | None:
    if not is_staged_tile(tile) or tile.shape[1] != 1:
        return f"the staging tile is gpu.smem_stages of one chunk per slot, dtype[slots, 1, rows, cols], not {tile}"
    if tile.shape[3] * tile.dtype.itemsize != CHUNK_BYTES or tile.layout.get("swizzle") != CHUNK_BYTES:
        return (f"a slot's row is one {CHUNK_BYTES}-byte swizzle span ({CHUNK_BYTES // tile.dtype.itemsize} "
                f"{tile.dtype}, #shared<swizzle = {CHUNK_BYTES}>), not {tile}")
    if tile.shape[2] % STORE_ROWS or rows is not None and tile.shape[2] != rows:
        return f"a slot holds the fragment's rows, whole warpgroups of {STORE_ROWS}: {rows or 'a multiple of 64'}, " \
               f"not {tile.shape[2]}"
    return None


@define_op("gpu.stage_fragment", traits={"writes_memory"}, operands=3, results=0)
class StageFragmentOp(Op):
    """Operands: the fragment tile, the staging tile, the slot. Every thread writes its registers
    in columns [column, column + cols) of the fragment into the slot, as the 128-byte swizzle
    places them."""

    column: int = 0

    def verify_(self) -> None:
        v = tensor_of(self, self.operands[0], "fragment")
        tile = tensor_of(self, self.operands[1], "staging tile")
        check_int_scalar(self, self.operands[2], "slot")
        if v.layout is None or v.layout.kind != layouts.WgmmaAccumulator.KIND or v.rank != 2:
            raise self.error(f"stages a [rows, cols] tile held in a #wgmma_acc layout, not {v}")
        problem = _staging_problem(tile, v.shape[0])
        if problem:
            raise self.error(problem)
        if v.dtype is not tile.dtype:
            raise self.error(f"writes {v.dtype} into a staging tile of {tile.dtype}", "cast the fragment first")
        width = tile.shape[3]
        if self.column % width or not 0 <= self.column < v.shape[1]:
            raise self.error(f"column {self.column} is not a chunk of {width} columns of the fragment's {v.shape[1]}")

    def advance(self, machine, ins) -> int:
        """The threads write the slot (returned): no store may still read it, and TMA sees the
        writes only after a fence."""
        tile = ins[1]
        slot = stage_index(self, ins[2], self.operands[1].ttype.shape[0])
        if any(g.tile is tile and g.slot == slot for g in store_groups_of(machine)):
            raise HazardError(f"{self.NAME}: writes slot {slot} of {tile.name} while a TMA store reading it is in "
                              "flight", self.loc, "retire the store first: gpu.tma_store_wait with fewer pending")
        unfenced_of(machine).add((id(tile), slot))
        return slot

    def interpret(self, interp, ins, env):
        value, tile = np.asarray(ins[0]), ins[1]
        slot = self.advance(interp, ins)
        width = tile.data.shape[3]
        tile.data[slot, 0] = value[:, self.column:self.column + width]
        return None


@define_op("gpu.tma_store", traits={"writes_memory", "reads_memory"}, operands=5, results=0)
class TmaStoreOp(Op):
    """Operands: the output's tensor map (boxes of [64, cols]), the staging tile, the slot, the
    row and column in the output where the slot lands. Each warpgroup meets, and one thread of it
    stores its rows of the slot (`pieces` boxes of 64 rows: a #wgmma_acc warpgroup's), one bulk
    group per store."""

    pieces: int = 1

    def verify_(self) -> None:
        if self.pieces < 1 or self.operands[1].ttype.rank == 4 and \
                self.operands[1].ttype.shape[2] % (STORE_ROWS * self.pieces):
            raise self.error(f"a warpgroup stores {self.pieces} box(es) of {STORE_ROWS} rows; the slot has "
                             f"{self.operands[1].ttype.shape[2]} rows")
        tm = tensor_of(self, self.operands[0], "tensor map")
        tile = tensor_of(self, self.operands[1], "staging tile")
        for v, what in zip(self.operands[2:], ("slot", "row", "column")):
            check_int_scalar(self, v, what)
        if tm.layout is None or tm.layout.kind != layouts.TensorMapBox.KIND:
            raise self.error(f"stores through a tensor map (gpu.tensor_map), not {tm}")
        problem = _staging_problem(tile)
        if problem:
            raise self.error(problem)
        box = layouts.of(tm.layout)
        if (box.rows, box.cols) != (STORE_ROWS, tile.shape[3]) or tm.dtype is not tile.dtype:
            raise self.error(f"a warpgroup stores {tile.dtype}[{STORE_ROWS}, {tile.shape[3]}] of the slot; the map's "
                             f"boxes are {tm.dtype}[{box.rows}, {box.cols}]")
        if box.swizzle != tile.layout.get("swizzle"):
            raise self.error(f"the tensor map swizzles {box.swizzle} bytes, the slot {tile.layout.get('swizzle')}")

    def advance(self, machine, ins) -> int:
        yield_point(machine)
        tile = ins[1]
        slot = stage_index(self, ins[2], self.operands[1].ttype.shape[0])
        if (id(tile), slot) in unfenced_of(machine):
            raise HazardError(f"{self.NAME}: stores slot {slot} of {tile.name}, which the threads wrote, before a "
                              "gpu.fence_proxy_async: TMA may not see those writes", self.loc,
                              "fence the threads' writes (gpu.fence_proxy_async) before the store")
        store_groups_of(machine).append(StoreGroup(tile, slot))
        return slot

    def interpret(self, interp, ins, env):
        out, tile = ins[0], ins[1]
        slot = self.advance(interp, ins)
        row, col = int(np.asarray(ins[3])), int(np.asarray(ins[4]))
        box = tile.data[slot, 0]
        r1, c1 = min(out.shape[0], row + box.shape[0]), min(out.shape[1], col + box.shape[1])
        if r1 > row >= 0 and c1 > col >= 0:
            out[row:r1, col:c1] = box[:r1 - row, :c1 - col]
            interp.record_write(self, (np.arange(row, r1), np.arange(col, c1)), out)
        return None


@define_op("gpu.tma_store_wait", traits={"writes_memory"}, operands=0, results=0)
class TmaStoreWaitOp(GroupWait, Op):
    """Each warpgroup's storing thread waits until at most `pending` of its stores still read
    shared memory, then the warpgroup meets: the slots of the retired stores may be written."""

    pending: int = 0
    GROUPS = "stores"

    def groups_of(self, machine) -> list:
        return store_groups_of(machine)

"""Warpgroup MMAs on staged tiles (gpu.wgmma, gpu.wgmma_wait) and the fragment-layout tiles
around them (gpu.load_columns, gpu.store_tile)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from .. import layouts
from ..core import Op, define_op
from ..dtypes import DType
from ..smem_ops import HazardError
from ..tile_ops import StoreOp
from ..tile_ops.checks import check_int_scalar, tensor_of
from ..types import MemSpace, TensorType
from .schedule import yield_point
from .grid import CHUNK_BYTES, GroupWait, is_staged_tile, stage_index, unfenced_of, wgmma_groups_of

# --- warpgroup MMA --------------------------------------------------------------------------------


def wgmma_operands(acc: TensorType, a: TensorType, b: TensorType) -> str | None:
    """What is wrong with acc[M, N] += A[stage] · B[stage] (None when they fit)."""
    if acc.layout is None or acc.layout.kind != layouts.WgmmaAccumulator.KIND:
        return f"the accumulator is held in a #wgmma_acc layout, not {acc}"
    if not (is_staged_tile(a) and is_staged_tile(b)):
        return "A and B are staged shared-memory tiles (gpu.smem_stages)"
    if a.dtype is not b.dtype or a.dtype not in (DType.BF16, DType.F16):
        return f"A and B are both bf16 or both f16, not {a.dtype} and {b.dtype}"
    if a.shape[0] != b.shape[0]:
        return f"A has {a.shape[0]} stages, B {b.shape[0]}"
    m, n = acc.shape
    bk = a.shape[1] * a.shape[3]
    if a.shape[2] != m or b.shape[1] * b.shape[3] != n or b.shape[2] != bk:
        return (f"A's stage is [{a.shape[2]}, {bk}] and B's [{b.shape[2]}, {b.shape[1] * b.shape[3]}]; the "
                f"accumulator is [{m}, {n}]")
    if bk % 16:
        return f"a wgmma takes K in steps of 16; a stage holds {bk}"
    for t in (a, b):
        if t.shape[3] * t.dtype.itemsize != CHUNK_BYTES or t.layout.get("swizzle") != CHUNK_BYTES:
            return f"a chunk's row is one {CHUNK_BYTES}-byte swizzle span: {CHUNK_BYTES // t.dtype.itemsize} " \
                   f"{t.dtype} with #shared<swizzle = {CHUNK_BYTES}>, not {t}"
    return None


@define_op("gpu.wgmma", traits={"reads_memory"}, operands=4, results=1)
class WgmmaOp(Op):
    """Operands: the accumulator, A's and B's staged tiles, the stage. A is K-major (a chunk is 64
    columns of K for all rows), B N-major (a chunk is 64 columns of N for all of K)."""

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[0]]

    def verify_(self) -> None:
        acc, a, b = (tensor_of(self, v, w) for v, w in zip(self.operands, ("accumulator", "A", "B")))
        check_int_scalar(self, self.operands[3], "stage")
        problem = wgmma_operands(acc, a, b)
        if problem:
            raise self.error(problem)
        if self.result.type != acc:
            raise self.error(f"its result is the accumulator's type {acc}, not {self.result.type}")

    def advance(self, machine, ins) -> int:
        """The group is issued reading stage s (returned) of A and B, which must have landed."""
        yield_point(machine)
        ta, tb = ins[1], ins[2]
        s = stage_index(self, ins[3], self.operands[1].ttype.shape[0])
        for t in (ta, tb):
            if (id(t), s) in unfenced_of(machine):
                raise HazardError(f"{self.NAME}: reads stage {s} of {t.name}, which the threads wrote, before a "
                                  "gpu.fence_proxy_async: wgmma may not see those writes", self.loc,
                                  "fence the threads' copies (gpu.fence_proxy_async), then meet at gpu.cta_barrier")
            t.stage_ready(self, s)
        wgmma_groups_of(machine).append({(id(ta), s), (id(tb), s)})
        return s

    def interpret(self, interp, ins, env):
        acc, ta, tb = ins[0], ins[1], ins[2]
        s = self.advance(interp, ins)
        a2 = np.concatenate(list(ta.data[s]), axis=1).astype(np.float32)  # chunks of K side by side: [M, BK]
        b2 = np.concatenate(list(tb.data[s]), axis=1).astype(np.float32)  # chunks of N side by side: [BK, BN]
        return [(np.asarray(acc, dtype=np.float32) + a2 @ b2).astype(np.float32)]


@define_op("gpu.wgmma_wait", traits={"writes_memory"}, operands=0, results=0)
class WgmmaWaitOp(GroupWait, Op):
    pending: int = 0

    def groups_of(self, machine) -> list:
        return wgmma_groups_of(machine)


@define_op("gpu.load_columns", traits={"reads_memory"}, operands=2, results=1)
class LoadColumnsOp(Op):
    """A vector spread down the rows of a fragment tile: element (r, c) of the [R, C] result is
    v[col + c], zero past v's end and where v is an optional input left out (a bias added to
    every row of a GEMM's output tile)."""

    def verify_(self) -> None:
        v = tensor_of(self, self.operands[0], "vector")
        check_int_scalar(self, self.operands[1], "column")
        t = tensor_of(self, self.result, "result")
        if v.space is not MemSpace.GLOBAL or v.rank != 1:
            raise self.error(f"reads a rank-1 global tensor, not {v}")
        if t.rank != 2 or t.dtype is not v.dtype or t.layout is None or t.layout.kind not in layouts.FRAGMENT_KINDS:
            raise self.error(f"its result is a {v.dtype}[rows, cols] tile in a #wgmma_acc or #tmem_rows layout, "
                             f"not {t}")

    def interpret(self, interp, ins, env):
        rows, cols = self.result.ttype.shape
        v, col = ins[0], int(np.asarray(ins[1]))
        out = np.zeros(cols, dtype=self.result.ttype.dtype.np)
        if v is None:  # an optional vector left out reads as zeros
            return [np.broadcast_to(out, (rows, cols)).copy()]
        end = min(len(v), col + cols)
        if end > col:
            out[:end - col] = v[col:end]
        return [np.broadcast_to(out, (rows, cols)).copy()]


@define_op("gpu.store_tile")
class StoreTileOp(StoreOp):
    """tile.store of a register tile that a fragment layout spreads over the CTA's threads."""

    REFINES: ClassVar[type[Op] | None] = StoreOp

    def verify_(self) -> None:
        super().verify_()
        t = self.operands[0].ttype
        if t.layout is None or t.layout.kind not in layouts.FRAGMENT_KINDS:
            raise self.error(f"stores a tile held in a #wgmma_acc or #tmem_rows layout, not {t}")
        if self.operands[1].ttype.rank != 2 or any(ix.kind != "slice" or ix.limit for ix in self.index):
            raise self.error("stores a [rows, cols] tile at a (row, column) of a rank-2 tensor")

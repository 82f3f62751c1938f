"""The `gpu` dialect's tile programs on tensor cores: a grid of program ids, TMA tensor maps,
staged shared-memory tiles, arrays of mbarriers, warpgroup MMAs (wgmma) and their waits.

    gpu.grid {grid = [GM, GN], threads = 256, group = 8} (%pm, %pn) { ... }
        one CTA per program id (pm, pn) of a GM x GN grid; `group` rows of programs are
        launched together (raster order: programs that share operand tiles run close in time)
    %ta = gpu.tensor_map %a {box = [128, 64], swizzle = 128}
        a's TMA descriptor: boxes of [128, 64] elements, landing swizzled in shared memory
    %sa = gpu.smem_stages : bf16[4, 1, 128, 64] @shared #shared<swizzle = 128>
        `stages` copies of a tile held as chunks of [rows, 64]: stage s, chunk j
    %bars = gpu.mbarrier_array {arrivals = 1} : i64[4] @shared
        one mbarrier per stage
    gpu.single_thread { ... }
        what one thread of the CTA does: announcing a stage's bytes and issuing its TMA loads
    gpu.expect_tx_at %bars, %s {bytes = 49152}
        one arrival on bars[s] that announces the bytes its copies will bring
    gpu.tma_load %ta, %sa, %bars, %s, %row, %col {chunk = 0}
        the box of a at (row, col) into chunk 0 of stage s; elements past a's bounds land as
        zeros; the box's bytes count against bars[s]'s announced ones
    gpu.copy_stage %a, %sa, %s, %row, %col {transpose = false}
        every thread copies its share of the tile at (row, col) of a into stage s (all its
        chunks), zeros past a's bounds, with plain loads and stores: for tensors TMA cannot
        take (a row pitch that is not a multiple of 16 bytes) and transposed operands
    gpu.fence_proxy_async
        the threads' writes to shared memory become visible to wgmma (the async proxy)
    gpu.mbarrier_wait_parity %bars, %s, %parity
        wait for the phase of bars[s] with this parity to complete; its copies become visible
    %acc1 = gpu.wgmma %acc, %sa, %sb, %s
        acc + A·B in f32 (A = stage s of sa, its chunks side by side along K; B = stage s of sb,
        its chunks side by side along N), issued asynchronously: stage s stays being read
        until a gpu.wgmma_wait retires it
    gpu.wgmma_wait {pending = 1}
        every warpgroup waits until at most `pending` of its wgmma groups are in flight, then
        the CTA meets at a barrier (so no thread refills a stage another warpgroup still reads)
    %bias_t = gpu.load_columns %bias, %k
        a vector spread down the rows of a fragment tile: (r, c) holds bias[k + c]
    gpu.store_tile %v, %c, %r, %k {index = [+128, +256]}
        tile.store of a register tile held in a fragment layout (#wgmma_acc)

The interpreter runs wgmma at once and keeps which stages each group still reads: a TMA load
into a stage an unretired wgmma reads, a wgmma reading a stage whose copy nobody waited for,
a wait with the wrong parity (it would return before the copies land), and a wgmma reading a
stage the threads wrote before a gpu.fence_proxy_async are hazards at the op that commits them.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import numpy as np

from ..diagnostics import InterpretError
from . import layouts
from .core import Op, register_op
from .gpu_ops import check_layouts
from .dtypes import DType, poison_value
from .smem_ops import HINT_WAIT_BEFORE_READ, HINT_WAIT_BEFORE_REUSE, HazardError, MBarrier, value_name
from .tile_ops import StoreOp, _check_operands, _check_results, _int_scalar, _tt
from .types import MemSpace, TensorType

TMA_BOX_LIMIT = 256     # elements along each dim of a TMA box
TMA_GRANULE = 16        # bytes: a tensor map's row pitch and base are multiples of it
CHUNK_BYTES = 128       # a staged chunk's row: one 128-byte swizzle span
GRID_THREADS = (128, 256, 384)


def barrier_array_type(stages: int) -> TensorType:
    return TensorType(DType.I64, (stages,), MemSpace.SHARED)


def is_barrier_array(t) -> bool:
    return isinstance(t, TensorType) and t.dtype is DType.I64 and t.space is MemSpace.SHARED and t.rank == 1 \
        and t.layout is None


def is_staged_tile(t) -> bool:
    return isinstance(t, TensorType) and t.space is MemSpace.SHARED and t.rank == 4 and t.layout is not None \
        and t.layout.kind == "shared"


# --- the machine model the interpreter runs ------------------------------------------------------


@attrs.define(eq=False)
class StagedTile:
    """A staged shared-memory tile: data [stages, chunks, rows, cols] (None when only the protocol
    is followed, kfc.ir.grid_protocol), and per (stage, chunk) the barrier whose phase will
    deliver a copy in flight."""

    name: str
    data: np.ndarray | None
    pending: dict = attrs.Factory(dict)  # (stage, chunk) -> MBarrier

    def stage_ready(self, op: Op, s: int) -> None:
        for (stage, _), bar in self.pending.items():
            if stage == s:
                raise HazardError(f"{op.NAME}: reads stage {s} of {self.name} while the copy into it is in flight "
                                  f"(nobody waited on {bar.name})", op.loc, HINT_WAIT_BEFORE_READ)

    def refill(self, op: Op, machine, s: int) -> None:
        """A copy into stage s begins: no wgmma in flight may still read it."""
        for group in _wgmma_groups(machine):
            if (id(self), s) in group:
                raise HazardError(f"{op.NAME}: overwrites stage {s} of {self.name} while a wgmma reading it is in "
                                  "flight", op.loc, "retire the wgmma with gpu.wgmma_wait before refilling its stage")


@attrs.frozen
class StagedCopy:
    """A copy into one chunk of one stage, landing when its barrier's phase completes."""

    tile: StagedTile
    stage: int
    chunk: int

    @property
    def name(self) -> str:
        return f"stage {self.stage} of {self.tile.name}"


# The protocol's state lives on the machine that runs it: the interpreter, or the static walk of
# kfc.ir.grid_protocol. Each protocol op's `advance` moves it; its `interpret` adds the data.
def _unfenced(machine) -> set:
    """The (staged tile, stage) pairs the threads wrote that no gpu.fence_proxy_async has yet
    made visible to the async proxy."""
    if not hasattr(machine, "unfenced"):
        machine.unfenced = set()
    return machine.unfenced


def _wgmma_groups(machine) -> list:
    """The wgmma groups in flight: each a set of (staged tile, stage) it reads."""
    if not hasattr(machine, "wgmma_groups"):
        machine.wgmma_groups = []
    return machine.wgmma_groups


def _stage(op: Op, value, stages: int) -> int:
    s = int(np.asarray(value))
    if not 0 <= s < stages:
        raise InterpretError(f"{op.NAME}: stage {s} is out of range for {stages} stages", op.loc)
    return s


# --- the grid -------------------------------------------------------------------------------------


@register_op
@attrs.frozen(eq=False, kw_only=True)
class GridOp(Op):
    """Independent programs over an N-D grid of program ids (the region's index arguments), one
    CTA of `threads` threads each."""

    NAME: ClassVar[str] = "gpu.grid"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"loop"})
    grid: tuple[int, ...] = attrs.field(converter=tuple)
    threads: int = 128
    group: int = 1  # raster order: program rows launched together along the first grid dim

    @property
    def body(self):
        return self.regions[0]

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 0)
        if len(self.regions) != 1 or len(self.body.args) != len(self.grid):
            raise self.error(f"needs one region with an index argument per grid dim ({len(self.grid)})")
        if not 1 <= len(self.grid) <= 3 or any(not isinstance(g, int) or g < 1 for g in self.grid):
            raise self.error(f"the grid has 1 to 3 dims of at least one program, not {list(self.grid)}")
        if any(a.type != TensorType(DType.INDEX) for a in self.body.args):
            raise self.error("program ids are index scalars")
        if self.threads not in GRID_THREADS:
            raise self.error(f"threads must be whole warpgroups ({', '.join(map(str, GRID_THREADS))}), "
                             f"not {self.threads}")
        if self.group < 1:
            raise self.error(f"group must be positive, not {self.group}")
        check_layouts(self.body, self.threads, 1, 1)

    def interpret(self, interp, ins, env):
        for pid in np.ndindex(*self.grid):
            for arg, i in zip(self.body.args, pid):
                env[arg] = np.asarray(i, dtype=np.int64)
            interp.wgmma_groups = []
            interp.exec_iteration(self.body, env)
            self.program_ends(interp)
        return None

    def program_ends(self, machine) -> None:
        if _wgmma_groups(machine):
            raise HazardError(f"{self.NAME}: a program ends with {len(machine.wgmma_groups)} wgmma group(s) in "
                              "flight", self.loc, "end the program's MMAs with gpu.wgmma_wait {pending = 0}")


@register_op
@attrs.frozen(eq=False, kw_only=True)
class CtaBarrierOp(Op):
    """Every thread of the CTA meets here (bar.sync): orders what warpgroups did to shared memory
    before it against what any thread does after."""

    NAME: ClassVar[str] = "gpu.cta_barrier"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"writes_memory"})

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 0)

    def advance(self, machine, ins) -> None:
        pass  # one thread of control runs the protocol: nothing to order

    def interpret(self, interp, ins, env):
        return None


@register_op
@attrs.frozen(eq=False, kw_only=True)
class SingleThreadOp(Op):
    """Its region runs in one thread of the CTA (thread 0): who announces a stage's bytes and
    issues its TMA loads. The interpreter runs it once per program, as that thread does."""

    NAME: ClassVar[str] = "gpu.single_thread"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"writes_memory"})

    @property
    def body(self):
        return self.regions[0]

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 0)
        if len(self.regions) != 1 or self.body.args:
            raise self.error("needs one region without arguments")

    def interpret(self, interp, ins, env):
        interp.exec_block(self.body, env)
        return None


# --- TMA ------------------------------------------------------------------------------------------


@register_op
@attrs.frozen(eq=False, kw_only=True)
class TensorMapOp(Op):
    NAME: ClassVar[str] = "gpu.tensor_map"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"pure"})
    box: tuple[int, ...] = attrs.field(converter=tuple)
    swizzle: int = 128

    def verify_(self) -> None:
        _check_operands(self, 1)
        _check_results(self, 1)
        t = _tt(self, self.operands[0], "tensor")
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


@register_op
@attrs.frozen(eq=False, kw_only=True)
class StagesAllocOp(Op):
    NAME: ClassVar[str] = "gpu.smem_stages"

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 1)
        t = _tt(self, self.result, "result")
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


@register_op
@attrs.frozen(eq=False, kw_only=True)
class MbarrierArrayOp(Op):
    NAME: ClassVar[str] = "gpu.mbarrier_array"
    arrivals: int = 1

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 1)
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


@register_op
@attrs.frozen(eq=False, kw_only=True)
class ExpectTxAtOp(Op):
    NAME: ClassVar[str] = "gpu.expect_tx_at"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"writes_memory"})
    bytes: int = 0

    def verify_(self) -> None:
        _check_operands(self, 2)
        _check_results(self, 0)
        _barrier_array_operand(self, self.operands[0])
        _int_scalar(self, self.operands[1], "stage")
        if not 0 <= self.bytes < 1 << 20:
            raise self.error(f"announces {self.bytes} bytes; an mbarrier's transaction count holds 0..2^20-1")

    def advance(self, machine, ins) -> None:
        bar = ins[0][_stage(self, ins[1], len(ins[0]))]
        bar.arrive(self)
        bar.announced += self.bytes

    def interpret(self, interp, ins, env):
        self.advance(interp, ins)
        return None


@register_op
@attrs.frozen(eq=False, kw_only=True)
class TmaLoadOp(Op):
    """Operands: the tensor map, the staged tile, the barrier array, the stage, the box's row and
    column in the tensor."""

    NAME: ClassVar[str] = "gpu.tma_load"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"writes_memory", "reads_memory"})
    chunk: int = 0

    def verify_(self) -> None:
        _check_operands(self, 6)
        _check_results(self, 0)
        tm = _tt(self, self.operands[0], "tensor map")
        dst = _tt(self, self.operands[1], "destination")
        if tm.layout is None or tm.layout.kind != layouts.TensorMapBox.KIND:
            raise self.error(f"loads through a tensor map (gpu.tensor_map), not {tm}")
        if not is_staged_tile(dst):
            raise self.error(f"loads into staged tiles (gpu.smem_stages), not {dst}")
        stages = _barrier_array_operand(self, self.operands[2])
        for v, what in zip(self.operands[3:], ("stage", "row", "column")):
            _int_scalar(self, v, what)
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
        tile, bars = ins[1], ins[2]
        s = _stage(self, ins[3], len(bars))
        tile.refill(self, machine, s)
        if (s, self.chunk) in tile.pending:
            raise HazardError(f"{self.NAME}: copies over stage {s} of {tile.name} while the copy into it before is in "
                              f"flight (nobody waited on {tile.pending[(s, self.chunk)].name})", self.loc,
                              HINT_WAIT_BEFORE_REUSE)
        t = self.operands[1].ttype
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


@register_op
@attrs.frozen(eq=False, kw_only=True)
class CopyStageOp(Op):
    """Operands: the tensor, the staged tile, the stage, the tile's row and column in the operand.
    Every thread of the CTA copies its share, element by element: chunk j of the stage takes
    columns col + 64 j onwards; elements past the tensor's bounds are zeros. With `transpose`
    the tensor holds the operand transposed (dot's trans_a, trans_b): tile element (r, c) is
    tensor[col + c, row + r]."""

    NAME: ClassVar[str] = "gpu.copy_stage"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"writes_memory", "reads_memory"})
    transpose: bool = False

    def verify_(self) -> None:
        _check_operands(self, 5)
        _check_results(self, 0)
        src = _tt(self, self.operands[0], "source")
        dst = _tt(self, self.operands[1], "destination")
        if src.space is not MemSpace.GLOBAL or src.rank != 2:
            raise self.error(f"copies from a rank-2 tensor in global memory, not {src}")
        if not is_staged_tile(dst):
            raise self.error(f"copies into staged tiles (gpu.smem_stages), not {dst}")
        if src.dtype is not dst.dtype:
            raise self.error(f"copies {src.dtype} into a tile of {dst.dtype}")
        for v, what in zip(self.operands[2:], ("stage", "row", "column")):
            _int_scalar(self, v, what)

    def advance(self, machine, ins) -> int:
        """The threads write stage s (returned): no wgmma may still read it, and wgmma sees the
        writes only after a fence."""
        tile = ins[1]
        s = _stage(self, ins[2], self.operands[1].ttype.shape[0])
        tile.refill(self, machine, s)
        _unfenced(machine).add((id(tile), s))
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


@register_op
@attrs.frozen(eq=False, kw_only=True)
class FenceProxyAsyncOp(Op):
    """This thread's writes to shared memory become visible to the async proxy (wgmma, TMA);
    with a gpu.cta_barrier after it, every thread's."""

    NAME: ClassVar[str] = "gpu.fence_proxy_async"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"writes_memory"})

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 0)

    def advance(self, machine, ins) -> None:
        _unfenced(machine).clear()

    def interpret(self, interp, ins, env):
        self.advance(interp, ins)
        return None


@register_op
@attrs.frozen(eq=False, kw_only=True)
class MbarrierWaitParityOp(Op):
    NAME: ClassVar[str] = "gpu.mbarrier_wait_parity"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"writes_memory"})

    def verify_(self) -> None:
        _check_operands(self, 3)
        _check_results(self, 0)
        _barrier_array_operand(self, self.operands[0])
        _int_scalar(self, self.operands[1], "stage")
        _int_scalar(self, self.operands[2], "parity")

    def advance(self, machine, ins) -> list:
        """The phase completes: returns its copies (StagedCopy, box) for the caller to land."""
        bars = ins[0]
        bar = bars[_stage(self, ins[1], len(bars))]
        parity = int(np.asarray(ins[2]))
        if parity != bar.phase:
            raise HazardError(f"{self.NAME}: waits for the phase of parity {parity} of {bar.name}, which is in a phase "
                              f"of parity {bar.phase}: the wait returns before this phase's copies land", self.loc,
                              "wait with the parity of the barrier's current phase: (uses of the stage) % 2")
        copies = bar.complete(self)
        for copy, _ in copies:
            del copy.tile.pending[(copy.stage, copy.chunk)]
        return copies

    def interpret(self, interp, ins, env):
        for copy, box in self.advance(interp, ins):
            copy.tile.data[copy.stage, copy.chunk] = box
        return None


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


@register_op
@attrs.frozen(eq=False, kw_only=True)
class WgmmaOp(Op):
    """Operands: the accumulator, A's and B's staged tiles, the stage. A is K-major (a chunk is 64
    columns of K for all rows), B N-major (a chunk is 64 columns of N for all of K)."""

    NAME: ClassVar[str] = "gpu.wgmma"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"reads_memory"})

    @classmethod
    def infer_result_types(cls, operand_types, attributes):
        return [operand_types[0]]

    def verify_(self) -> None:
        _check_operands(self, 4)
        _check_results(self, 1)
        acc, a, b = (_tt(self, v, w) for v, w in zip(self.operands, ("accumulator", "A", "B")))
        _int_scalar(self, self.operands[3], "stage")
        problem = wgmma_operands(acc, a, b)
        if problem:
            raise self.error(problem)
        if self.result.type != acc:
            raise self.error(f"its result is the accumulator's type {acc}, not {self.result.type}")

    def advance(self, machine, ins) -> int:
        """The group is issued reading stage s (returned) of A and B, which must have landed."""
        ta, tb = ins[1], ins[2]
        s = _stage(self, ins[3], self.operands[1].ttype.shape[0])
        for t in (ta, tb):
            if (id(t), s) in _unfenced(machine):
                raise HazardError(f"{self.NAME}: reads stage {s} of {t.name}, which the threads wrote, before a "
                                  "gpu.fence_proxy_async: wgmma may not see those writes", self.loc,
                                  "fence the threads' copies (gpu.fence_proxy_async), then meet at gpu.cta_barrier")
            t.stage_ready(self, s)
        _wgmma_groups(machine).append({(id(ta), s), (id(tb), s)})
        return s

    def interpret(self, interp, ins, env):
        acc, ta, tb = ins[0], ins[1], ins[2]
        s = self.advance(interp, ins)
        a2 = np.concatenate(list(ta.data[s]), axis=1).astype(np.float32)  # chunks of K side by side: [M, BK]
        b2 = np.concatenate(list(tb.data[s]), axis=1).astype(np.float32)  # chunks of N side by side: [BK, BN]
        return [(np.asarray(acc, dtype=np.float32) + a2 @ b2).astype(np.float32)]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class WgmmaWaitOp(Op):
    NAME: ClassVar[str] = "gpu.wgmma_wait"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"writes_memory"})
    pending: int = 0

    def verify_(self) -> None:
        _check_operands(self, 0)
        _check_results(self, 0)
        if not 0 <= self.pending <= 7:
            raise self.error(f"pending is 0..7 groups, not {self.pending}")

    def advance(self, machine, ins) -> None:
        groups = _wgmma_groups(machine)
        del groups[:max(0, len(groups) - self.pending)]

    def interpret(self, interp, ins, env):
        self.advance(interp, ins)
        return None


@register_op
@attrs.frozen(eq=False, kw_only=True)
class LoadColumnsOp(Op):
    """A vector spread down the rows of a fragment tile: element (r, c) of the [R, C] result is
    v[col + c], zero past v's end (a bias added to every row of a GEMM's output tile)."""

    NAME: ClassVar[str] = "gpu.load_columns"
    TRAITS: ClassVar[frozenset[str]] = frozenset({"reads_memory"})

    def verify_(self) -> None:
        _check_operands(self, 2)
        _check_results(self, 1)
        v = _tt(self, self.operands[0], "vector")
        _int_scalar(self, self.operands[1], "column")
        t = _tt(self, self.result, "result")
        if v.space is not MemSpace.GLOBAL or v.rank != 1:
            raise self.error(f"reads a rank-1 global tensor, not {v}")
        if t.rank != 2 or t.dtype is not v.dtype or t.layout is None \
                or t.layout.kind != layouts.WgmmaAccumulator.KIND:
            raise self.error(f"its result is a {v.dtype}[rows, cols] tile in a #wgmma_acc layout, not {t}")

    def interpret(self, interp, ins, env):
        rows, cols = self.result.ttype.shape
        v, col = ins[0], int(np.asarray(ins[1]))
        out = np.zeros(cols, dtype=v.dtype)
        end = min(len(v), col + cols)
        if end > col:
            out[:end - col] = v[col:end]
        return [np.broadcast_to(out, (rows, cols)).copy()]


@register_op
@attrs.frozen(eq=False, kw_only=True)
class StoreTileOp(StoreOp):
    """tile.store of a register tile that a fragment layout spreads over the CTA's threads."""

    NAME: ClassVar[str] = "gpu.store_tile"
    REFINES: ClassVar[type[Op] | None] = StoreOp

    def verify_(self) -> None:
        super().verify_()
        t = self.operands[0].ttype
        if t.layout is None or t.layout.kind != layouts.WgmmaAccumulator.KIND:
            raise self.error(f"stores a tile held in a #wgmma_acc layout, not {t}")
        if self.operands[1].ttype.rank != 2 or any(ix.kind != "slice" or ix.limit for ix in self.index):
            raise self.error("stores a [rows, cols] tile at a (row, column) of a rank-2 tensor")


"""The layout core: where each element of a tile lives, written once and used by the verifier
(a layout must fit its tile's type and agree with its launch), the interpreter (which thread
holds which elements, in what order) and codegen (the C index expressions).

A layout in the IR is data (`Layout(kind, params)` on a tensor type); `of(layout)` gives the
object that does its arithmetic. The kinds:

    #row<threads = T, vec = V, cluster = C>   a 1-D blocked layout: the row's P = T·C lanes
        (lane g = cluster rank · T + thread) take chunks of V consecutive elements in turn, so
        element j is register (j // V // P)·V + j % V of lane (j // V) % P
    #lanes<threads = T, cluster = C>          one value per lane: the slice a row reduction
        leaves (element g is lane g's)
    #shared<swizzle = S>                      a 2-D tile in shared memory, rows one after
        another; with S = 32, 64 or 128 the 16-byte chunks of each S-byte row are permuted by
        XOR with the address bits above 128 bytes (the swizzle modes of TMA and wgmma)
    #wgmma_acc<warpgroups = G[, pieces = P]>  the f32 accumulator [64·G·P, N] of a warpgroup MMA,
        in registers: each warp holds 16 rows of each of its warpgroup's P pieces of 64 rows,
        each thread 2 columns of 2 rows per 8 columns
    #wgmma_a<warpgroups = G>                  the A operand [64·G, K] of a warpgroup MMA taken
        from registers, 8 elements a thread per 16 columns
    #tmem_rows                                a [128, C] tile loaded from tensor memory into a
        warpgroup's registers: thread t row t, register r column r
    #tmem                                     a [128, N] 32-bit tile in tensor memory (tcgen05):
        row i is lane i, column j column j; warp w of a warpgroup reaches lanes 32·(w % 4) on

Each kind says what it asks of a tile's type (`against_type`) and of its launch
(`against_launch`); numpy arithmetic for the interpreter and the tests, C expressions for codegen.
"""

from __future__ import annotations

import math

import attrs
import numpy as np

from .dtypes import DType
from .types import Layout, MemSpace, TensorType


@attrs.frozen
class Blocked1D:
    """#row: a row spread over P = threads · cluster lanes, `vec` elements at a time."""

    threads: int
    vec: int
    cluster: int

    KIND = "row"

    @property
    def lanes(self) -> int:
        return self.threads * self.cluster

    def as_layout(self) -> Layout:
        return Layout(self.KIND, (("threads", self.threads), ("vec", self.vec), ("cluster", self.cluster)))

    def against_type(self, t: TensorType) -> str | None:
        return None  # any row tile: its length decides the chunks

    def against_launch(self, threads: int, vec: int, cluster: int) -> str | None:
        return _differs(self, {"threads": threads, "vec": vec, "cluster": cluster})

    def chunks(self, n: int) -> int:
        """Chunks of `vec` elements each lane holds for a row of n (at least 1)."""
        return max(1, math.ceil(n / (self.vec * self.lanes))) if n else 1

    def exact(self, n: int) -> bool:
        """Whether every lane's every chunk lies inside a row of n (no bounds test needed)."""
        return n % (self.vec * self.lanes) == 0

    def element(self, chunk, lane, k=0):
        """The row index of element k of a lane's chunk (ints or numpy arrays)."""
        return (chunk * self.lanes + lane) * self.vec + k

    # C expressions of the same arithmetic, for codegen (the lane is the variable `lane`)
    def chunk_start_c(self, chunk: str, lane: str) -> str:
        """The row index where chunk `chunk` of lane `lane` starts."""
        return f"(({chunk} * {self.lanes} + {lane}) * {self.vec})"

    def full_chunks(self, n: int) -> int:
        """Chunks that lie inside a row of n for every lane."""
        return n // (self.vec * self.lanes)

    def in_row_c(self, chunk: str, lane: str, n: int) -> str:
        """Whether that chunk starts inside a row of n. The chunks every lane holds whole pass
        by their number alone: once a chunk loop is unrolled only the last ones test the lane,
        so a thread does not keep a bounds predicate per chunk (long rows that do not split
        evenly spilled them)."""
        test = f"(({chunk}) * {self.lanes} + {lane}) * {self.vec} < {n}"
        full = self.full_chunks(n)
        return f"(({chunk}) < {full} || {test})" if full else test

    # A CTA's part of the row: for each chunk, the `threads · vec` consecutive elements its
    # threads hold (a contiguous span; shared-memory staging copies each span in one piece)
    @property
    def span(self) -> int:
        return self.threads * self.vec

    def cta_span_start_c(self, chunk: str, rank: str) -> str:
        """The row index where CTA `rank`'s span of chunk `chunk` starts."""
        return f"(({chunk} * {self.lanes} + {rank} * {self.threads}) * {self.vec})"

    def span_length_c(self, start: str, n: int) -> str:
        """Elements of a row of n in the span that starts at `start` (the last one may be short)."""
        return f"({n} - {start} < {self.span} ? {n} - {start} : {self.span})"

    def cta_offset_c(self, chunk: str, thread: str) -> str:
        """Where chunk `chunk` of thread `thread` sits in its CTA's part of the row, spans
        stored one after another."""
        return f"(({chunk} * {self.threads} + {thread}) * {self.vec})"

    def register_element_c(self, reg: str, lane: str) -> str:
        """The row index register `reg` of lane `lane` holds."""
        return f"(({reg} / {self.vec}) * {self.lanes} + {lane}) * {self.vec} + ({reg} % {self.vec})"

    def register_in_row_c(self, reg: str, lane: str, n: int) -> str:
        """Whether register `reg` of lane `lane` holds an element of a row of n (registers of
        whole chunks pass by their number alone, as in in_row_c)."""
        test = f"({self.register_element_c(reg, lane)} < {n})"
        full = self.full_chunks(n)
        return f"(({reg}) < {full * self.vec} || {test})" if full else test

    def per_lane(self, x: np.ndarray, fill) -> np.ndarray:
        """A row as [lane, its registers in order], padded with `fill` past the row's end."""
        n, e = x.shape[0], self.chunks(x.shape[0])
        pad = np.full(e * self.lanes * self.vec, fill, dtype=np.float32)
        pad[:n] = x.astype(np.float32)
        return pad.reshape(e, self.lanes, self.vec).transpose(1, 0, 2).reshape(self.lanes, e * self.vec)


@attrs.frozen
class Lanes:
    """#lanes: one value per lane of P = threads · cluster."""

    threads: int
    cluster: int

    KIND = "lanes"

    @property
    def lanes(self) -> int:
        return self.threads * self.cluster

    def as_layout(self) -> Layout:
        return Layout(self.KIND, (("threads", self.threads), ("cluster", self.cluster)))

    def against_type(self, t: TensorType) -> str | None:
        return None

    def against_launch(self, threads: int, vec: int, cluster: int) -> str | None:
        return _differs(self, {"threads": threads, "cluster": cluster})

    def per_cta(self, x: np.ndarray) -> np.ndarray:
        """The lanes' values as [cluster rank, thread]."""
        return x.reshape(self.cluster, self.threads)


def _differs(core, want: dict) -> str | None:
    for key, value in want.items():
        if getattr(core, key) != value:
            return f"{key} = {getattr(core, key)}, but the gpu.launch it is in has {key} = {value}"
    return None


def _matrix(t: TensorType, space: MemSpace, what: str) -> str | None:
    if t.space is not space:
        return f"{what} lives @{space}, not @{t.space}"
    if t.rank != 2 or not all(isinstance(d, int) for d in t.shape):
        return f"{what} is a 2-D tile of fixed sizes, not {list(map(str, t.shape))}"
    return None


# --- shared memory ------------------------------------------------------------------------------
SWIZZLES = (0, 32, 64, 128)
SWIZZLE_CHUNK = 16  # bytes: the unit the swizzle permutes


@attrs.frozen
class SharedTile:
    """#shared: a [rows, cols] tile in shared memory, row after row. With a swizzle of S bytes
    each row is S bytes, and byte address a holds what the plain layout puts at
    a ^ (((a >> 7) & (S/16 - 1)) << 4): the 16-byte chunks of a row trade places by the row's
    position in the 8·S-byte period, so the eight rows of a column of chunks fall in eight
    different banks. The tile's base is aligned to that period (`alignment`)."""

    swizzle: int

    KIND = "shared"

    def as_layout(self) -> Layout:
        return Layout(self.KIND, (("swizzle", self.swizzle),))

    @property
    def alignment(self) -> int:
        return max(128, 8 * self.swizzle)

    def against_type(self, t: TensorType) -> str | None:
        if self.swizzle not in SWIZZLES:
            return f"swizzle = {self.swizzle}; the modes are {', '.join(map(str, SWIZZLES))} bytes"
        # leading dims (stages, chunks) index whole [rows, cols] tiles, each aligned on its own
        t = t.with_shape(t.shape[-2:]) if t.rank > 2 else t
        problem = _matrix(t, MemSpace.SHARED, "a #shared tile")
        if problem or not self.swizzle:
            return problem
        row_bytes = t.shape[1] * t.dtype.bits // 8
        if row_bytes != self.swizzle:
            return (f"a row of {t.shape[1]} {t.dtype} is {row_bytes} bytes; a {self.swizzle}-byte swizzle takes rows "
                    f"of {self.swizzle} bytes ({self.swizzle * 8 // t.dtype.bits} elements): split wider tiles")
        return None

    def against_launch(self, threads: int, vec: int, cluster: int) -> str | None:
        return None  # a memory layout: no thread holds it

    def _mask(self) -> int:
        return self.swizzle // SWIZZLE_CHUNK - 1 if self.swizzle else 0

    def offset(self, r, c, cols: int, itemsize: int):
        """The byte offset of element (r, c) from the tile's base (ints or numpy arrays)."""
        a = r * (cols * itemsize) + c * itemsize
        return a ^ (((a >> 7) & self._mask()) << 4)

    def offset_c(self, r: str, c: str, cols: int, itemsize: int) -> str:
        a = f"(({r}) * {cols * itemsize} + ({c}) * {itemsize})"
        if not self.swizzle:
            return a
        return f"({a} ^ ((({a} >> 7) & {self._mask()}) << 4))"


# --- TMA tensor maps ---------------------------------------------------------------------------
@attrs.frozen
class TensorMapBox:
    """#tensor_map: a global tensor seen through a TMA descriptor that moves boxes of [rows, cols]
    elements, landing in shared memory with a swizzle of `swizzle` bytes (#shared's)."""

    rows: int
    cols: int
    swizzle: int

    KIND = "tensor_map"

    def as_layout(self) -> Layout:
        return Layout(self.KIND, (("rows", self.rows), ("cols", self.cols), ("swizzle", self.swizzle)))

    def against_type(self, t: TensorType) -> str | None:
        if t.space is not MemSpace.GLOBAL or t.rank != 2:
            return f"a #tensor_map describes a rank-2 global tensor, not {t}"
        if self.swizzle not in SWIZZLES:
            return f"swizzle = {self.swizzle}; the modes are {', '.join(map(str, SWIZZLES))} bytes"
        return None

    def against_launch(self, threads: int, vec: int, cluster: int) -> str | None:
        return None  # a descriptor: no thread holds it


# --- warpgroup MMA (Hopper wgmma) -------------------------------------------------------------
WARPGROUP = 128
WGMMA_M = 64


@attrs.frozen
class _WarpgroupFragment:
    """What the fragments of a warpgroup MMA share: G warpgroups of 128 threads, each warp 16
    rows (a thread rows l // 4 and 8 below), a thread two adjacent columns at a time."""

    warpgroups: int

    def as_layout(self) -> Layout:
        return Layout(self.KIND, (("warpgroups", self.warpgroups),))

    @property
    def threads(self) -> int:
        return WARPGROUP * self.warpgroups

    @property
    def rows(self) -> int:
        """The rows a warpgroup holds."""
        return WGMMA_M

    def against_type(self, t: TensorType) -> str | None:
        problem = _matrix(t, MemSpace.REG, f"a #{self.KIND} tile")
        if problem:
            return problem
        if self.DTYPES and t.dtype not in self.DTYPES:
            return f"{self.ROLE} in {' or '.join(map(str, self.DTYPES))}, not {t.dtype}"
        if t.shape[0] != self.rows * self.warpgroups:
            return f"{self.warpgroups} warpgroup(s) hold {self.rows * self.warpgroups} rows, not {t.shape[0]}"
        return self.columns_problem(t.shape[1])

    def against_launch(self, threads: int, vec: int, cluster: int) -> str | None:
        if threads % WARPGROUP or threads < self.threads:
            return (f"{self.warpgroups} warpgroup(s) need {self.threads} threads in whole warpgroups; "
                    f"the gpu.launch it is in has {threads}")
        return None

    def registers(self, cols: int) -> int:
        return cols // 2

    def _row(self, thread, reg):
        q, t = thread // WARPGROUP, thread % WARPGROUP
        return q * WGMMA_M + (t // 32) * 16 + ((reg // 2) % 2) * 8 + (t % 32) // 4

    def _thread(self, row, col):
        r = row % WGMMA_M
        return (row // WGMMA_M) * WARPGROUP + (r // 16) * 32 + (r % 8) * 4 + (col % 8) // 2

    def per_thread(self, x: np.ndarray) -> np.ndarray:
        """A [64·G, cols] tile as [thread, register]."""
        threads, regs = np.meshgrid(np.arange(self.threads), np.arange(self.registers(x.shape[1])), indexing="ij")
        rows, cols = self.element(threads, regs)
        return x[rows, cols]

    def row_c(self, reg: str, thread: str) -> str:
        return f"((({thread}) / {WARPGROUP}) * {WGMMA_M} + ((({thread}) % {WARPGROUP}) / 32) * 16 + " \
               f"((({reg}) / 2) % 2) * 8 + (({thread}) % 32) / 4)"


@attrs.frozen
class WgmmaAccumulator(_WarpgroupFragment):
    """#wgmma_acc: the accumulator [64·G·P, N] of G warpgroups' wgmma, f32 in registers, each
    warpgroup holding P pieces of 64 rows (one wgmma.m64 a piece). Thread t of warpgroup q (warp
    w = t // 32 of it, lane l) holds in piece p rows 64(Pq + p) + 16w + l // 4 and 8 below it,
    columns 8k + 2·(l % 4) and the next, for every k < N / 8: register 4(Pk + p) + 2h + b holds
    (64(Pq + p) + 16w + 8h + l // 4, 8k + 2·(l % 4) + b). With P = 1 (the default, not
    printed) register 4k + 2h + b."""

    KIND = "wgmma_acc"
    # any dtype: an epilogue's values (a bf16 cast of the accumulator) keep its layout; gpu.wgmma
    # itself checks that it accumulates in f32
    DTYPES = ()
    ROLE = "a wgmma accumulates"
    pieces: int = 1

    def as_layout(self) -> Layout:
        extra = (("pieces", self.pieces),) if self.pieces != 1 else ()
        return Layout(self.KIND, (("warpgroups", self.warpgroups),) + extra)

    @property
    def rows(self) -> int:
        """The rows a warpgroup holds."""
        return WGMMA_M * self.pieces

    def against_type(self, t: TensorType) -> str | None:
        if self.pieces < 1:
            return f"a warpgroup holds one or more pieces of {WGMMA_M} rows, not {self.pieces}"
        return super().against_type(t)

    def columns_problem(self, n: int) -> str | None:
        if n % 8 or not 8 <= n <= 256:
            return f"a wgmma's N is a multiple of 8 from 8 to 256, not {n}"
        return None

    def registers(self, cols: int) -> int:
        return cols // 2 * self.pieces

    def element(self, thread, reg):
        """(row, column) of register `reg` of thread `thread` (ints or numpy arrays)."""
        P = self.pieces
        q, t = thread // WARPGROUP, thread % WARPGROUP
        row = (q * P + (reg // 4) % P) * WGMMA_M + (t // 32) * 16 + ((reg // 2) % 2) * 8 + (t % 32) // 4
        return row, (reg // (4 * P)) * 8 + (thread % 4) * 2 + reg % 2

    def owner(self, row, col):
        """(thread, register) holding element (row, col)."""
        P = self.pieces
        piece, r = row // WGMMA_M, row % WGMMA_M
        thread = (piece // P) * WARPGROUP + (r // 16) * 32 + (r % 8) * 4 + (col % 8) // 2
        return thread, ((col // 8) * P + piece % P) * 4 + ((r % 16) // 8) * 2 + col % 2

    def row_c(self, reg: str, thread: str) -> str:
        if self.pieces == 1:
            return super().row_c(reg, thread)
        P = self.pieces
        return f"(((({thread}) / {WARPGROUP}) * {P} + (({reg}) / 4) % {P}) * {WGMMA_M} + " \
               f"((({thread}) % {WARPGROUP}) / 32) * 16 + ((({reg}) / 2) % 2) * 8 + (({thread}) % 32) / 4)"

    def col_c(self, reg: str, thread: str) -> str:
        return f"((({reg}) / {4 * self.pieces}) * 8 + ((({thread}) % 32) % 4) * 2 + ({reg}) % 2)"


@attrs.frozen
class WgmmaOperandA(_WarpgroupFragment):
    """#wgmma_a: the A operand [64·G, K] of G warpgroups' wgmma from registers (16-bit types),
    K in steps of 16. In each step thread t (warp w, lane l) holds rows 16w + l // 4 and 8 below
    it, columns 2·(l % 4), the next and the two 8 further: register 8s + 4c + 2h + b holds
    (64q + 16w + 8h + l // 4, 16s + 8c + 2·(l % 4) + b)."""

    KIND = "wgmma_a"
    DTYPES = (DType.BF16, DType.F16)
    ROLE = "a wgmma takes A from registers"

    def columns_problem(self, k: int) -> str | None:
        if k % 16 or k <= 0:
            return f"a wgmma's A comes 16 columns at a time; {k} is not a multiple of 16"
        return None

    def element(self, thread, reg):
        col = (reg // 8) * 16 + ((reg // 4) % 2) * 8 + (thread % 4) * 2 + reg % 2
        return self._row(thread, reg), col

    def owner(self, row, col):
        return self._thread(row, col), (col // 16) * 8 + ((col % 16) // 8) * 4 + ((row % 16) // 8) * 2 + col % 2

    def col_c(self, reg: str, thread: str) -> str:
        return f"((({reg}) / 8) * 16 + ((({reg}) / 4) % 2) * 8 + ((({thread}) % 32) % 4) * 2 + ({reg}) % 2)"


# --- tensor memory (Blackwell tcgen05) --------------------------------------------------------
TMEM_LANES = 128
TMEM_COLUMNS = 512


@attrs.frozen
class TensorMemory:
    """#tmem: a [128, N] tile of 32-bit cells in tensor memory, the accumulator of a tcgen05 MMA
    with M = 128 on one CTA: row i is lane i, column j column j of the allocation, at address
    base + (i << 16) + j. A warp reaches only its quarter of the lanes: warp w of a warpgroup
    loads lanes 32·(w % 4) to 32·(w % 4) + 31 (tcgen05.ld .32x32b), thread l of it lane
    32·(w % 4) + l, register r of an .xR load the column the load starts at plus r."""

    KIND = "tmem"

    def as_layout(self) -> Layout:
        return Layout(self.KIND, ())

    def against_type(self, t: TensorType) -> str | None:
        problem = _matrix(t, MemSpace.TMEM, "a #tmem tile")
        if problem:
            return problem
        if t.dtype.bits != 32:
            return f"#tmem holds 32-bit cells (an f32 or i32 accumulator), not {t.dtype}"
        rows, cols = t.shape
        if rows != TMEM_LANES:
            return f"tensor memory has {TMEM_LANES} lanes; a tile of {rows} rows does not map one row to a lane"
        if not 0 < cols <= TMEM_COLUMNS:
            return f"tensor memory has {TMEM_COLUMNS} columns a CTA, not {cols}"
        return None

    def against_launch(self, threads: int, vec: int, cluster: int) -> str | None:
        if threads % WARPGROUP:
            return f"tensor memory is read by whole warpgroups; the gpu.launch it is in has {threads} threads"
        return None

    def address(self, row, col, base=0):
        return base + (row << 16) + col

    def address_c(self, row: str, col: str, base: str) -> str:
        return f"(({base}) + ((unsigned)({row}) << 16) + (unsigned)({col}))"

    def reader(self, row):
        """(warp of the warpgroup, lane) that loads lane `row`."""
        return row // 32, row % 32

    def lane_c(self, warp: str, lane: str) -> str:
        """The tensor-memory lane thread `lane` of warp `warp` loads."""
        return f"((({warp}) % 4) * 32 + ({lane}))"


@attrs.frozen
class TmemRows:
    """#tmem_rows: a [128, C] tile loaded from tensor memory into one warpgroup's registers
    (tcgen05.ld .32x32b.xC): thread t holds row t, register r column r."""

    KIND = "tmem_rows"
    DTYPES = ()

    def as_layout(self) -> Layout:
        return Layout(self.KIND, ())

    @property
    def threads(self) -> int:
        return WARPGROUP

    def against_type(self, t: TensorType) -> str | None:
        problem = _matrix(t, MemSpace.REG, "a #tmem_rows tile")
        if problem:
            return problem
        if t.shape[0] != TMEM_LANES:
            return f"a warpgroup holds the {TMEM_LANES} lanes of tensor memory, a row each, not {t.shape[0]} rows"
        return None

    def against_launch(self, threads: int, vec: int, cluster: int) -> str | None:
        if threads % WARPGROUP:
            return f"a #tmem_rows tile is held by whole warpgroups; the gpu.launch it is in has {threads} threads"
        return None

    def registers(self, cols: int) -> int:
        return cols

    def element(self, thread, reg):
        return thread, reg

    def owner(self, row, col):
        return row, col

    def row_c(self, reg: str, thread: str) -> str:
        return f"({thread})"

    def col_c(self, reg: str, thread: str) -> str:
        return f"({reg})"


KINDS = {cls.KIND: cls for cls in (Blocked1D, Lanes, SharedTile, TensorMapBox, WgmmaAccumulator, WgmmaOperandA,
                                   TensorMemory, TmemRows)}
# the layouts of register tiles the grid emitter holds as per-thread arrays
FRAGMENT_KINDS = (WgmmaAccumulator.KIND, TmemRows.KIND)


def of(layout: Layout | None):
    """The arithmetic of a layout (None for a type without one)."""
    if layout is None:
        return None
    cls = KINDS.get(layout.kind)
    if cls is None:
        raise ValueError(f"no layout kind #{layout.kind}; the kinds are {', '.join('#' + k for k in KINDS)}")
    fields = [f.name for f in attrs.fields(cls)]
    required = {f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING}
    params = dict(layout.params)
    if not required <= set(params) <= set(fields):
        raise ValueError(f"#{layout.kind} takes {', '.join(fields)}, not {', '.join(params) or 'nothing'}")
    return cls(**params)


def disagreement(layout: Layout, launch_threads: int, launch_vec: int, launch_cluster: int) -> str | None:
    """What a layout asks of its launch that the launch does not give (None when they agree)."""
    return of(layout).against_launch(launch_threads, launch_vec, launch_cluster)


def misfit(t: TensorType) -> str | None:
    """What a tile's layout asks of its type that the type does not give (None when it fits, or
    when the layout is not one of the kinds above: passes may carry their own annotations)."""
    if t.layout is None or t.layout.kind not in KINDS:
        return None
    return of(t.layout).against_type(t)

"""Where the tiles of a shared-memory tile kernel (kfc.codegen.tile_emitter) live.

A tile is written where it is read (an expression of its element's indices) unless it is costly
to compute and read more than once per element: then it is materialised once into a shared
buffer. `TilePlan` says which; `SharedArena` places the buffers in the kernel's dynamic shared
memory, two buffers sharing bytes only when their live steps (the CTA-wide phases that write or
read them, each ended by a barrier) do not overlap.
"""

from __future__ import annotations

import attrs

from ..ir.core import Op, Value
from ..ir.tile_ops import (BinaryOp, BitcastOp, BroadcastOp, CastOp, CmpOp, DotOp, ExpandDimsOp, LoadOp,
                           ReduceOp, ReshapeOp, ScanOp, TransposeOp, TriInvOp, UnaryOp, WhereOp)
from ..ir.mma_ops.roles import REGISTER_FILE
from ..model.target import SM_THREADS, SMEM_PER_CTA_RESERVED, SMEM_PER_SM
from . import float16
from .c_names import C_TYPES

VIEW_OPS = (BroadcastOp, ExpandDimsOp, ReshapeOp, TransposeOp)  # index maps: never a buffer of their own
POINTWISE_OPS = (UnaryOp, BinaryOp, CmpOp, WhereOp, CastOp, BitcastOp)
CHEAP_UNARY = {"neg", "abs", "not"}
# readers that read each element of an operand many times (a row of a product, a substitution)
REPEAT_READERS = (DotOp, TriInvOp)
MAX_BUFFER_RANK = 2  # a rank-3 tile (KDA's [C, C, K] decay) is only ever written where it is read
ALIGN = 128
THREADS = 256  # a tile kernel's CTA (kfc.codegen.tile_emitter), eight warps
WARP = 32
BANKS = 32
# the fewest registers a thread is held to for occupancy: ptxas fits KDA's prepare kernel in 48
# without spills, in 40 only by spilling
MIN_THREAD_REGISTERS = 48


def ctas_per_sm(smem: int) -> int:
    """The CTAs an SM holds by the kernel's shared memory (its __launch_bounds__ minimum, so
    ptxas keeps the registers to what they allow), while that leaves each thread
    MIN_THREAD_REGISTERS."""
    by_smem = SMEM_PER_SM // (smem + SMEM_PER_CTA_RESERVED)
    by_registers = REGISTER_FILE // (THREADS * MIN_THREAD_REGISTERS)
    return max(1, min(by_smem, by_registers, SM_THREADS // THREADS))


def strided_loop(var: str, first: str, count: int, stride: int) -> str:
    """The opening line of `for (int var = first; var < count; var += stride) {`, where first lies
    in [0, stride) (a thread's, warp's or lane group's index): where count <= stride each thread
    runs it at most once, so an `if` (a plain block where every first is below count). Same
    iterations; no back edge, and no unrolled copies with a remainder for the compiler to build
    around a trip count it cannot see (KDA's prepare kernel: 3008 SASS instructions to 2336)."""
    if count > stride:
        return f"for (int {var} = {first}; {var} < {count}; {var} += {stride}) {{"
    if count == stride:
        return f"{{ const int {var} = {first};"
    return f"if (({first}) < {count}) {{ const int {var} = {first};"


def row_major(idx, dims) -> str:
    """The row-major offset (a C expression) of element idx in a block of these dims."""
    text = ""
    for i, d in zip(idx, dims):
        text = f"({i})" if not text else f"({text} * {d} + ({i}))"
    return text or "0"


def warp_reduction(op: Op) -> bool:
    """Whether a reduction is written a warp an output (kfc.codegen.tile_loops): fewer outputs
    than the CTA has threads, each over at least a warp's width of elements (KDA's row norms: 16
    outputs of 128 terms, 16 threads busy otherwise). Such a reduction always has a buffer."""
    if not isinstance(op, ReduceOp) or op.operands[0].ttype.dtype.is_bool:
        return False
    count = reduced_count(op)
    return isinstance(count, int) and op.result.ttype.numel() < THREADS and count >= WARP and op.result.ttype.rank > 0


def reduced_count(op: ReduceOp):
    """How many elements each output of a reduction combines (symbolic where a reduced dim is)."""
    count = 1
    for k in op.axes:
        count *= op.operands[0].ttype.shape[k]
    return count


class TilePlan:
    """Which tiles of a tile.parallel's body become shared buffers."""

    def __init__(self, root: Op) -> None:
        self.uses: dict[Value, list[Op]] = {}
        self.owner: dict[Value, Op] = {}
        self.order = {op: i for i, op in enumerate(root.walk())}  # program order
        self.block_of: dict[Op, object] = {}
        for op in root.walk():
            for v in op.operands:
                self.uses.setdefault(v, []).append(op)
            for r in op.results:
                self.owner[r] = op
            for region in op.regions:
                for o in region.ops:
                    self.block_of[o] = region
        self.costly: set[Value] = set()  # values written inline whose expression is costly to repeat

    def is_costly(self, op: Op) -> bool:
        """A global read, a loop (reduction, product) or a transcendental, or anything built on
        one that is written inline."""
        if isinstance(op, (LoadOp, DotOp, ReduceOp, ScanOp, TriInvOp)):
            return True
        if isinstance(op, UnaryOp) and op.NAME.split(".")[1] not in CHEAP_UNARY:
            return True
        return any(v in self.costly for v in op.operands)

    @staticmethod
    def storable(v: Value) -> bool:
        t = v.ttype
        return 1 <= t.rank <= MAX_BUFFER_RANK and all(isinstance(d, int) for d in t.shape)

    def reread(self, v: Value) -> bool:
        """Whether v's elements would be computed more than once were v written where read."""
        users = self.uses.get(v, [])
        if len(users) > 1:
            # two pointwise readers each stored where they stand: each element computed twice,
            # cheaper than a buffer for it beside theirs
            return not (len(users) == 2 and all(
                isinstance(u, POINTWISE_OPS) and u.operands.count(v) == 1 and self.storable(u.result)
                and self.block_of.get(u) is self.block_of.get(self.owner.get(v)) and self.reread(u.result)
                for u in users))
        if not users:
            return False
        u = users[0]
        if v in self.owner and self.block_of.get(u) is not self.block_of.get(self.owner[v]):
            return True  # read inside a loop nested in v's block: once per iteration
        if isinstance(u, REPEAT_READERS):
            return True
        if isinstance(u, BroadcastOp):
            return u.result.ttype.numel() != v.ttype.numel() or self.reread(u.result)
        if isinstance(u, VIEW_OPS):
            return self.reread(u.result)
        if isinstance(u, POINTWISE_OPS):
            # better to store the reader's result, which holds v, where it can be stored
            return self.reread(u.result) and not self.storable(u.result)
        return False  # a reduction, a scan, a store or a yield reads each element once

    def narrow_source(self, op: Op, inline) -> list[Value]:
        """For a value to be stored that is cheap pointwise work on one costly operand chain
        ending at a tile load narrower than it: that load, then the inline values from it up to
        op's operand. Else []."""
        r, path = op.result, []
        while isinstance(op, POINTWISE_OPS) and not (isinstance(op, UnaryOp) and
                                                     op.NAME.split(".")[1] not in CHEAP_UNARY):
            costly = [v for v in op.operands if v in self.costly]
            if len(costly) != 1 or costly[0] not in inline or len(self.uses.get(costly[0], ())) != 1:
                return []
            path.insert(0, costly[0])
            op = self.owner[costly[0]]
            if isinstance(op, LoadOp):
                return path if path[0].ttype.dtype.itemsize < r.ttype.dtype.itemsize else []
        return []

    def wants_buffer(self, op: Op) -> bool:
        r = op.result
        return self.storable(r) and (warp_reduction(op) or self.is_costly(op) and self.reread(r))


@attrs.define(eq=False)
class Buffer:
    """A tile in shared memory: live from the phase `first` that writes it to the phase `last`
    that reads it."""

    name: str
    ctype: str
    shape: tuple[int, ...]
    first: int
    last: int
    offset: int = -1
    what: str = ""  # the tile it holds, as a message names it: "G f32[64, 128]"
    skew: int | None = None  # rows this many words past a multiple of the 32 banks (kfc.codegen.tile_mma)
    tf32: bool = False  # holds its values rounded to TF32: only tensor-core products read it
    rows: str | None = None  # how it is read, where only along rows (kfc.codegen.tile_mma.read_along_rows)
    halves: int = 1  # 2: two copies, its name a pointer to the one in use (kfc.codegen.tile_columns)

    @property
    def pitch(self) -> int:
        """Elements between rows: one 4-byte word more than the row where the row is an even
        number of words, so that a column's elements fall in distinct banks (a product or a
        sum over the last axis reads a column across a warp); a tensor-core operand's rows at its
        fragments' skew. A tile read only along its rows, in rows of whole 16-byte groups, keeps
        them whole: a warp's group accesses (TileWrites) are then each one conflict-free access.
        Where a product reads its fragments, rows four words past a multiple of eight apart put
        a fragment's 8 rows in distinct banks."""
        size, last = C_SIZES[self.ctype], self.shape[-1]
        if self.skew is not None and size == 4 and len(self.shape) == 2:
            return last + (self.skew - last) % BANKS
        if self.rows and len(self.shape) >= 2 and last * size % 16 == 0:
            words = last * size // 4
            return (words + 4 if words % 8 == 0 and self.rows == "fragments" else words) * 4 // size
        if len(self.shape) >= 2 and size <= 4 and last * size % 4 == 0 and last * size // 4 % 2 == 0:
            return last + 4 // size
        return last

    @property
    def elements(self) -> int:
        """The elements from one copy to the next: rows `pitch` apart, 16-byte aligned."""
        n = self.pitch
        for d in self.shape[:-1]:
            n *= d
        size = C_SIZES[self.ctype]
        return n if self.halves == 1 else -(-n * size // 16) * 16 // size

    @property
    def nbytes(self) -> int:
        return self.elements * C_SIZES[self.ctype] * self.halves

    def at(self, idx) -> str:
        """The element at these indices (C expressions), rows `pitch` apart."""
        return f"{self.name}[{row_major(idx, self.shape[:-1] + (self.pitch,))}]"


C_SIZES = {"float": 4, "double": 8, **{t: 2 for t in float16.TYPE.values()}, "unsigned char": 1, "signed char": 1,
           "int": 4, "long long": 8, "bool": 1}
assert set(C_TYPES.values()) <= set(C_SIZES)


class SharedArena:
    """The buffers of one kernel and their places in its dynamic shared memory."""

    def __init__(self) -> None:
        self.buffers: list[Buffer] = []

    def new(self, name: str, ctype: str, shape: tuple[int, ...], step: int, what: str = "",
            skew: int | None = None) -> Buffer:
        b = Buffer(name, ctype, shape, step, step, what=what, skew=skew)
        self.buffers.append(b)
        return b

    @staticmethod
    def touch(b: Buffer, step: int) -> None:
        b.last = max(b.last, step)

    def close_loop(self, start: int, end: int) -> None:
        """A loop spanned phases start..end: a buffer written before it and read inside it is
        read again by the next iteration, so it lives to the loop's end."""
        for b in self.buffers:
            if b.first < start <= b.last:
                b.last = max(b.last, end)

    def busiest(self) -> list[Buffer]:
        """The buffers live together at the phase where they take the most bytes, largest first."""
        steps = {s for b in self.buffers for s in (b.first, b.last)}
        live = lambda s: [b for b in self.buffers if b.first <= s <= b.last]
        peak = max(steps, key=lambda s: sum(b.nbytes for b in live(s)), default=None)
        return sorted(live(peak), key=lambda b: -b.nbytes) if peak is not None else []

    def place(self) -> int:
        """Give every buffer an offset, the lowest free place among the buffers already placed
        that live beside it; of three orders of placing them (largest first, earliest first,
        longest-lived first) the one that needs the fewest bytes. The bytes needed in all."""
        orders = [lambda b: (-b.nbytes, b.first), lambda b: (b.first, -b.nbytes),
                  lambda b: (b.first - b.last, -b.nbytes)]
        best = None
        for key in orders:
            offsets = self._first_fit(sorted(self.buffers, key=key))
            total = max((offsets[id(b)] + b.nbytes for b in self.buffers), default=0)
            if best is None or total < best[0]:
                best = (total, offsets)
        for b in self.buffers:
            b.offset = best[1][id(b)]
        return best[0]

    @staticmethod
    def _first_fit(order: list[Buffer]) -> dict[int, int]:
        offsets: dict[int, int] = {}
        placed: list[Buffer] = []
        for b in order:
            beside = sorted((p for p in placed if p.first <= b.last and b.first <= p.last), key=lambda p: offsets[id(p)])
            offset = 0
            for p in beside:
                if offset + b.nbytes <= offsets[id(p)]:
                    break
                offset = max(offset, -(-(offsets[id(p)] + p.nbytes) // ALIGN) * ALIGN)
            offsets[id(b)] = offset
            placed.append(b)
        return offsets

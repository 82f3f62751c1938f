"""The tile emitter's products on tensor cores (kfc.codegen.tile_emitter): a tile.dot of
precision tf32 (the tf32-dots pass) made of whole m16n8k8 tiles is one CTA-wide phase in which
each warp takes blocks of 16 x 8 result tiles in turn, sums them over the contraction eight at a
time with `mma.sync.m16n8k8.f32.tf32`, and writes them into a shared buffer.

Fragments, from the PTX ISA (g = lane / 4, t = lane % 4): A's four registers hold rows g, g + 8
at column t, then at column t + 4; B's two hold rows t and t + 4 at column g; the accumulator's
four hold row g at columns 2t, 2t + 1, then row g + 8 at the same. Operands are rounded to TF32
as the interpreter rounds them (kfc_tf32_bits; kfc.ir.tile_ops.matmul.round_tf32), so the GPU and
the final IR agree up to the order of the f32 sums.

A buffer that a product reads as A or as a transposed B (its rows across a fragment's groups g,
its columns across t) is padded to a pitch of 4 words past a multiple of 32, one read as B or as
a transposed A (rows across t, columns across g) to 8 past: the 32 lanes of a fragment load then
fall in 32 distinct banks.

Each warp takes a block of result tiles at a time (mma_block): the A fragments of the block's
rows and the B fragments of its columns are loaded once a step of the contraction and each used
by every product of the block, not loaded again per tile. A tile that only products read is
stored rounded to TF32 (rounded_buffer, stored) and its fragments loaded as they are: rounding
twice gives the bits rounding once does. Products of one block reading the same B (sharing_b),
or with TILE_SHARE_A the same A (sharing_a), are written in one phase, the shared operand's
fragments loaded once a step for all of them.

A product is written where it is first needed. Where that is the next value of a carried tile
that reads it only at the element it writes (S = exp(Gend) * S + dot(...), KDA's state update),
and it reads no changing carried tile itself, each accumulator goes straight into the carried
buffer through that value's expression: no buffer for the product, no second phase. Where it is
one tile to be stored that alone reads it, elementwise at its shape (U = u - w S), that tile's
buffer is written from the accumulators the same way (tile_of_product).
"""

from __future__ import annotations

from ..ir.core import Value
from ..ir.dtypes import DType
from ..ir.tile_ops import (BinaryOp, BitcastOp, BroadcastOp, CastOp, CmpOp, DotOp, ExpandDimsOp, LoadOp, ReduceOp,
                           ScanOp, StoreOp, TriInvOp, UnaryOp, WhereOp)
from ..passes.bf16_dots import MMA_K_BF16
from ..passes.tf32_dots import MMA_K, MMA_M, MMA_N, fits_mma
from .c_names import as_float
from .errors import CodegenError
from .tile_plan import POINTWISE_OPS, THREADS, WARP, strided_loop, warp_reduction

WARPS = THREADS // WARP
MAX_BLOCK_TILES = 16  # result tiles a warp holds at once: 64 accumulator registers
DEFERRED_MMA = object()  # a pending product: written where it is first read (TileKernelEmitter.flush_for)


MMA_STEPS = {"tf32": MMA_K, "tf32x3": MMA_K, "bf16": MMA_K_BF16, "f16": MMA_K_BF16}  # one mma.sync's contraction
TF32_KINDS = ("tf32", "tf32x3")  # products of m16n8k8 in TF32, a register an element
MMA_CALL = {"tf32x3": "tf32"}  # the instruction each kind's products issue where it is not the kind's own


def tf32x3_terms() -> tuple[tuple[str, str], ...]:
    """3xTF32's products a step, as (A's part, B's part), "" the high and "l" the low: the small
    terms first, as kfc.ir.tile_ops.matmul.tf32x3_product sums them."""
    return (("l", ""), ("", "l"), ("", ""))


def mma_kind(op) -> str | None:
    """The operands' type in the mma.sync the tile emitter writes this product with, or None
    where it keeps the product off tensor cores: "tf32" or "bf16" for f32 operands that
    tf32-dots or bf16-dots marked (a user's pipeline may mark any f32 product), and "bf16" or
    "f16" for products of bf16 or f16 tiles, exact on m16n8k16 as they are; always whole
    m16n8k8 (m16n8k16) tiles."""
    if not isinstance(op, DotOp):
        return None
    if op.precision in ("tf32", "tf32x3", "bf16"):
        return op.precision if fits_mma(op, MMA_STEPS[op.precision]) else None
    for kind, dtype in (("bf16", DType.BF16), ("f16", DType.F16)):
        if fits_mma(op, MMA_K_BF16, dtype):
            return kind
    return None


def mma_dot(op) -> bool:
    """Whether the tile emitter writes this product on tensor cores (mma_kind)."""
    return mma_kind(op) is not None


def mma_block(tiles_m: int, tiles_n: int) -> tuple[int, int]:
    """The bm x bn result tiles a warp takes at once: as many as keep every warp busy (tiles /
    WARPS of them), at most MAX_BLOCK_TILES (their accumulators are 4 registers a tile), shaped
    to load the fewest fragment registers a step (4 bm for A, 2 bn for B). bm and bn divide the
    tile counts."""
    cap = min(max(1, (tiles_m * tiles_n) // WARPS), MAX_BLOCK_TILES)
    shapes = [(bm, bn) for bm in range(1, tiles_m + 1) if tiles_m % bm == 0
              for bn in range(1, tiles_n + 1) if tiles_n % bn == 0 and bm * bn <= cap]
    return max(shapes, key=lambda s: (s[0] * s[1], -(4 * s[0] + 2 * s[1])))


def read_by_tf32_products_only(v: Value, readers) -> bool:
    """Whether every op that reads v is a product on tensor cores taking it as an operand: a
    buffer of v may then hold it rounded to TF32 (rounding twice gives the same bits)."""
    return (v.ttype.dtype.itemsize == 4 and v.ttype.dtype.is_float and bool(readers)
            and all(mma_kind(op) == "tf32" and v in op.operands for op in readers))


def fragment_skew(v: Value, readers) -> int | None:
    """The pitch (in 4-byte words, modulo the banks) at which the tensor-core products among
    `readers` load v's fragments without bank conflicts: in TF32, 4 where every one reads it as A
    or as a transposed B (a row across the groups g, a column across t), 8 where every one reads
    it as B or as a transposed A; in bf16, whose lanes read pairs of adjacent columns (2t, 2t + 1)
    of A, or rows 2t and 2t + 1 of B, the other way round. None where none reads it or they
    disagree."""
    skews = set()
    for op in readers:
        if not mma_dot(op):
            continue
        for pos, x in enumerate(op.operands):
            if x is v:
                # rows across the lane groups g, columns across t: A as it is, B transposed
                a_like = (pos == 0 and not op.trans_a) or (pos == 1 and op.trans_b)
                skews.add(4 if a_like == (mma_kind(op) in TF32_KINDS) else 8)
    return skews.pop() if len(skews) == 1 and v.ttype.dtype.itemsize == 4 else None


ELEMENTWISE = (UnaryOp, BinaryOp, CmpOp, WhereOp, CastOp, BitcastOp, BroadcastOp, ExpandDimsOp)


def read_along_rows(v: Value, uses: dict, lanes_invert: bool = True) -> str | None:
    """How tile v is read where every read (through elementwise ops and broadcasts) takes a
    row's consecutive elements across a warp's lanes or is a product on tensor cores: "rows", or
    "fragments" where a product reads it. Its rows may then be a whole number of 16-byte groups
    apart (Buffer.pitch) instead of a word past one. None where some read goes down a column
    across a warp: a reduction or scan along the last axis a thread a line, a reduction over
    another axis a warp an output, a triangular inverse a lane a row (where `lanes_invert`), a
    transpose, a product off tensor cores."""
    last, how = v.ttype.rank - 1, "rows"
    for op in uses.get(v, ()):
        if isinstance(op, ELEMENTWISE):
            for r in op.results:
                inner = read_along_rows(r, uses, lanes_invert)
                if inner is None:
                    return None
                how = "fragments" if inner == "fragments" else how
        elif isinstance(op, ReduceOp):
            # a warp an output: its lanes over the reduced elements; else a thread an output
            if (last in op.axes) != warp_reduction(op):
                return None
        elif isinstance(op, ScanOp):
            if op.axis == last:
                return None
        elif mma_dot(op):
            how = "fragments"
        elif isinstance(op, TriInvOp):
            if op.operands[0].ttype.shape[0] <= WARP and lanes_invert:  # a lane a row (TileLoops.emit_tri_inv)
                return None
        elif not isinstance(op, StoreOp):
            return None
    return how


class TileMma:
    """Mixed into TileKernelEmitter: written through its elem, fresh, emit, new_buffer and
    phases; its stores through `stored`."""

    def rounded_buffer(self, v: Value):
        """A new buffer for op result v, written through `stored`: it holds v rounded to TF32
        where only tensor-core products read v."""
        buf = self.new_buffer(v)
        buf.tf32 = v in self.plan.owner and read_by_tf32_products_only(v, self.plan.uses.get(v, ()))
        return buf

    @staticmethod
    def stored(buf, expr: str) -> str:
        """What a phase writes into buf: the value, rounded to TF32 once here where only
        tensor-core products read it (they would round it at every fragment load)."""
        return f"kfc_round_tf32({expr})" if buf.tf32 else expr

    def mma_into_carried(self, yield_op, args, carried) -> dict:
        """The carried tiles whose next value is written in place from a pending product's
        accumulators: {carried tile: product}."""
        changing = {a for a, y in zip(args, yield_op.operands) if a in carried and y is not a}
        fused = {}
        for a, y in zip(args, yield_op.operands):
            if a not in changing or not self.in_place(y, a, changing):
                continue
            for d, expr in self.pending.items():
                if (expr is DEFERRED_MMA and d.ttype.shape == a.ttype.shape and self.touches(y, d)
                        and self.pointwise(y, d) and self.feeds_only(d, y) and d not in fused.values()
                        and not any(self.touches(x, b) for x in self.plan.owner[d].operands for b in changing)):
                    fused[a] = d
                    break
        return fused

    def tile_of_product(self, d: Value, todo) -> Value | None:
        """The tile, of the pending ones about to be stored (todo), that alone reads product d,
        elementwise at d's shape, and reads no other pending tile: written from d's
        accumulators through its expression (emit_mma_dot's into), d needs no buffer and the
        tile no phase of its own. None where there is none."""
        for v in todo:
            op, expr = self.plan.owner.get(v), self.pending.get(v)
            if expr is not None and expr is not DEFERRED_MMA and self.alone_reads_product(op, d) \
                    and not any(x in self.pending for x in self.reached(op.operands) - {d}):
                return v
        return None

    def alone_reads_product(self, op, d: Value) -> bool:
        """Whether op's tile is the one reader of pending product d, elementwise at its shape."""
        return (self.product_epilogues and isinstance(op, POINTWISE_OPS) and len(op.results) == 1
                and op.result.ttype.shape == d.ttype.shape and self.feeds_only(d, op.result)
                and all(self.pointwise(x, d) for x in op.operands))

    def store_from_product(self, op, expr_of_idx) -> bool:
        """Store op's tile (to be stored now) from the accumulators of the one pending product
        it alone reads (tile_of_product), the tiles it reads besides stored first. Whether it
        was."""
        found = [d for d in self.pending_read(op)
                 if self.pending[d] is DEFERRED_MMA and self.alone_reads_product(op, d)]
        if not found:
            return False
        d = found[0]
        self.flush_for(op.operands, keep=[d])
        del self.pending[d]
        self.emit_product_into(d, op.result, expr_of_idx)
        return True

    def emit_product_into(self, d: Value, tile: Value, expr_of_idx) -> None:
        """Product d written into a new buffer of the tile that alone reads it, through that
        tile's expression at each accumulator (tile_of_product, store_from_product)."""
        buf = self.rounded_buffer(tile)
        self.emit_mma_dot(self.plan.owner[d], (buf, expr_of_idx, False))
        self.buffers[tile] = buf

    def feeds_only(self, v: Value, y: Value) -> bool:
        """Whether every reader of v is y's inline expression (v is read nowhere else)."""
        users = self.plan.uses.get(v, [])
        return bool(users) and all(
            u.result is y or (u.results and u.result in self.inline and self.feeds_only(u.result, y)) for u in users)

    def sharing_b(self, op: DotOp) -> list[DotOp]:
        """The other products of op's block, later in it or pending, that read the same B the
        same way at the same shapes, with an A already stored: written in op's phase, B's
        fragments loaded once for all (KDA's w S and qg S), as many as a warp holds the
        accumulators of."""
        return self.sharing_operand(op, 1)

    def sharing_a(self, op: DotOp) -> list[DotOp]:
        """As sharing_b for products reading op's A (the prepare kernel's w and u, both
        Ainv times a tile), each B already stored or written where read from stored tiles."""
        return self.sharing_operand(op, 0) if self.share_a else []

    def sharing_operand(self, op: DotOp, shared: int) -> list[DotOp]:
        """The products of sharing_b (shared = 1) or sharing_a (shared = 0)."""
        x = op.operands[shared]
        other = op.operands[1 - shared]
        m, n, _, _ = DotOp.mnk(op.operands[0].ttype, op.operands[1].ttype, op.trans_a, op.trans_b)
        bm, bn = mma_block(m // MMA_M, n // MMA_N)
        block = self.plan.block_of.get(op) if self.share_b else None
        found = []
        for q in (block.ops if block is not None else ()):
            if (len(found) + 2) * bm * bn > MAX_BLOCK_TILES:  # a warp's accumulators for them all
                break
            if q is op or mma_kind(q) != mma_kind(op) or q in self.early \
                    or q.operands[shared] is not x:
                continue
            if self.plan.order[q] < self.plan.order[op] and self.pending.get(q.result) is not DEFERRED_MMA:
                continue
            y = q.operands[1 - shared]
            same = (q.trans_a, q.trans_b, y.ttype.shape) == (op.trans_a, op.trans_b, other.ttype.shape)
            if same and (y in self.buffers or shared == 0 and self.written_from_buffers(y, op)):
                found.append(q)
        return found

    def written_from_buffers(self, v: Value, op: DotOp) -> bool:
        """Whether tile v, written where read, reads only stored tiles, scalars and tensors the
        kernel never writes (not op's own product, nor a tile still to be stored, whose
        elements do not exist yet)."""
        for x in self.reached([v]):
            if x in self.buffers or self.kind(x) != "row":
                continue
            made = self.plan.owner.get(x)
            if x is op.result or x not in self.inline or made is None or \
                    isinstance(made, LoadOp) and not self.reads_fixed_memory(made):
                return False
        return True

    def emit_mma_dot(self, op: DotOp, into=None) -> None:
        """The product into a new shared buffer, or `into` = (a buffer, its tile's expression,
        whether the buffer is a carried tile's, written in place), that expression reading the
        product at each accumulator. Each warp takes blocks of bm x bn result tiles
        (mma_block): per step of the contraction it loads bm A fragments and bn B fragments and
        issues bm * bn products. The products sharing its B (sharing_b) are written in the same
        phase from the same B fragments, each into a buffer of its own; else those sharing its A
        (sharing_a) from the same A fragments."""
        in_place = bool(into) and into[2]
        ops = [op] + ([] if in_place else self.sharing_b(op))
        shared_a = False  # which operand the products share: said by the search that found them
        if len(ops) == 1 and not in_place:
            ops += self.sharing_a(op)
            shared_a = len(ops) > 1
        for q in ops[1:]:
            self.early.add(q)
            self.pending.pop(q.result, None)
        a, b = op.operands
        m, n, k, _ = DotOp.mnk(a.ttype, b.ttype, op.trans_a, op.trans_b)
        bufs = [into[0] if into else self.rounded_buffer(op.result)] + [self.rounded_buffer(q.result) for q in ops[1:]]
        self.begin_phase()
        for buf in bufs:
            self.arena.touch(buf, self.step)
        g, t, blk, kk, acc, fa, fb = (self.fresh(h) for h in ("kfc_g", "kfc_t", "kfc_m", "kfc_k", "kfc_c", "kfc_a",
                                                               "kfc_b"))
        i0, j0 = self.fresh("kfc_i"), self.fresh("kfc_j")
        bm, bn = mma_block(m // MMA_M, n // MMA_N)
        blocks_n = n // MMA_N // bn
        tiles = bm * bn
        self.emit(f"const int {g} = (threadIdx.x & 31) >> 2, {t} = threadIdx.x & 3;")
        self.emit(strided_loop(blk, "threadIdx.x >> 5", (m // MMA_M // bm) * blocks_n, WARPS))
        self.indent += 1
        self.emit(f"const int {i0} = {blk} / {blocks_n} * {bm * MMA_M}, {j0} = {blk} % {blocks_n} * {bn * MMA_N};")
        self.emit(f"float {acc}[{len(ops) * tiles}][4] = {{}};")
        self.emit("#pragma unroll 4")
        kind = mma_kind(op)
        self.emit(f"for (int {kk} = 0; {kk} < {k}; {kk} += {MMA_STEPS[kind]}) {{")
        self.indent += 1

        pairs = kind not in TF32_KINDS
        # 3xTF32: each fragment also as its low part ("l"), three products a step (tf32x3_terms)
        parts = ("", "l") if kind == "tf32x3" else ("",)
        # the contraction at A's registers 0, 1 and 2, 3 (at B's 0 and 1): in 16 bits each holds two
        cols = (f"{kk} + 2 * {t}", f"{kk} + 2 * {t} + 8") if pairs else (f"{kk} + {t}", f"{kk} + {t} + 4")
        for p, q in enumerate(ops[:1] if shared_a else ops):
            x = q.operands[0]
            for part in parts:
                # A's register at (row i, contraction c)
                at_a = lambda i, c, x=x, part=part: self.operand_bits(  # noqa: E731
                    x, lambda c: (c, i) if op.trans_a else (i, c), c, kind, low=bool(part))
                for u in range(bm):
                    rows = (f"{i0} + {u * MMA_M} + {g}", f"{i0} + {u * MMA_M} + {g} + 8")
                    frag = [at_a(rows[0], cols[0]), at_a(rows[1], cols[0]), at_a(rows[0], cols[1]),
                            at_a(rows[1], cols[1])]
                    self.emit(f"const unsigned {fa}{part}{p * bm + u}[4] = {{{', '.join(frag)}}};")
        for p, q in enumerate(ops if shared_a else ops[:1]):
            y = q.operands[1]
            for part in parts:
                # B's register at (contraction c, column j)
                at_b = lambda c, j, y=y, part=part: self.operand_bits(  # noqa: E731
                    y, lambda c: (j, c) if op.trans_b else (c, j), c, kind, low=bool(part))
                for v in range(bn):
                    col = f"{j0} + {v * MMA_N} + {g}"
                    regs = f"{at_b(cols[0], col)}, {at_b(cols[1], col)}"
                    self.emit(f"const unsigned {fb}{part}{p * bn + v}[2] = {{{regs}}};")
        for p in range(len(ops)):
            pa, pb = (0, p) if shared_a else (p, 0)
            for u in range(bm):
                for v in range(bn):
                    for fp, hp in tf32x3_terms() if kind == "tf32x3" else (("", ""),):
                        f, h = f"{fa}{fp}{pa * bm + u}", f"{fb}{hp}{pb * bn + v}"
                        self.emit(f"kfc_mma_{MMA_CALL.get(kind, kind)}({acc}[{p * tiles + u * bn + v}], {f}[0], "
                                  f"{f}[1], {f}[2], {f}[3], {h}[0], {h}[1]);")
        self.indent -= 1
        self.emit("}")
        for p, (q, buf) in enumerate(zip(ops, bufs)):
            self.write_accumulators(q.result, buf, acc, p * tiles, (bm, bn, i0, j0, g, t), into if p == 0 else None)
        self.indent -= 1
        self.emit("}")
        self.end_phase(reopenable=not in_place)  # wrote new buffers only, where not into a carried tile
        for p, (q, buf) in enumerate(zip(ops, bufs)):
            if p or not into:  # else the caller's tile's buffer
                self.buffers[q.result] = buf

    def operand_bits(self, v: Value, at, c: str, kind: str, low: bool = False) -> str:
        """A fragment register's 32 bits: v's element at index at(c) as TF32 (`low`: what rounding
        it to TF32 left, itself rounded, 3xTF32's low part), or in bf16 (f16) its elements at
        contractions c and c + 1 packed, c's in the low half (cvt.rn.bf16x2.f32 rounds an f32
        value as kfc.ir.tile_ops.matmul.round_bf16 does, a bf16 one not at all)."""
        if low:
            return f"kfc_tf32_lo({self.elem(v, at(c))})"
        if kind in TF32_KINDS:
            return self.tf32_bits(v, at(c))
        d, lo_at = v.ttype.dtype, at(c)
        buf = self.buffers.get(v) if v not in self.inline else None
        if d.name.lower() == kind and lo_at[-1] == c and buf is not None and buf.pitch % 2 == 0:
            lo = self.elem(v, lo_at)
            if lo == buf.at(lo_at):  # both elements adjacent in shared memory, c even: one 4-byte load
                return f"*reinterpret_cast<const unsigned*>(&{lo})"
        hi, lo = (as_float(self.elem(v, at(x)), d) for x in (f"{c} + 1", c))
        return f"kfc_cvt_pack_{kind}({hi}, {lo})"

    def tf32_bits(self, v: Value, idx) -> str:
        """An operand's element as TF32 bits: rounded here unless its buffer holds it so."""
        held = v not in self.inline and v in self.buffers and self.buffers[v].tf32
        return f"__float_as_uint({self.elem(v, idx)})" if held else f"kfc_tf32_bits({self.elem(v, idx)})"

    def write_accumulators(self, r: Value, buf, acc: str, first: int, block, into) -> None:
        """A warp's accumulators acc[first:] of product r into buf, or through into's expression.
        Every value first, then the stores: the loads the values make (a carried tile, its
        decay) are not ordered after stores the compiler must assume alias them."""
        bm, bn, i0, j0, g, t = block
        pairs = []
        for u in range(bm):
            for v in range(bn):
                i_lo, i_hi = f"{i0} + {u * MMA_M} + {g}", f"{i0} + {u * MMA_M} + {g} + 8"
                j = f"{j0} + {v * MMA_N} + 2 * {t}"
                for q, i in ((0, i_lo), (2, i_hi)):
                    values = []
                    for jj, held in ((j, f"{acc}[{first + u * bn + v}][{q}]"), (f"{j} + 1", f"{acc}[{first + u * bn + v}][{q + 1}]")):
                        if into:
                            self.inline[r] = (lambda idx, held=held, at=(i, jj):
                                              held if tuple(idx) == at else self.misread(r))
                        value = self.stored(buf, into[1]((i, jj)) if into else held)
                        if value != held:
                            x = self.fresh("kfc_x")
                            self.emit(f"const {buf.ctype} {x} = {value};")
                            value = x
                        values.append(value)
                    pairs.append(((i, j), (i, f"{j} + 1"), values))
        self.inline.pop(r, None)
        for first_at, second_at, (x0, x1) in pairs:
            if buf.ctype == "float" and buf.pitch % 2 == 0:  # the pair's columns 2t, 2t + 1: 8 bytes, aligned
                self.emit(f"*reinterpret_cast<float2*>(&{buf.at(first_at)}) = make_float2({x0}, {x1});")
            else:
                self.emit(f"{buf.at(first_at)} = {x0};")
                self.emit(f"{buf.at(second_at)} = {x1};")

    @staticmethod
    def misread(r: Value):
        raise CodegenError(f"internal: a product written into its reader is read at another element: {r}", None)

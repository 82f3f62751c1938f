"""A loop's carried tile in registers, a warp to each 16 of its columns (kfc.codegen.tile_emitter).

A tile.for carrying one f32 tile S [R, V] whose columns never mix (KDA's recurrence: U = u - w S,
o = qg S + aqk U, S = e^Gend * S + kg^T U) is written with S, and every tile computed from it in
the loop (its "column tiles"), in registers: warp w holds columns 16 w to 16 w + 15 of each. A
column tile X [rows, V] is held transposed, as the accumulators of m16n8 products: slot (j, e) of
a lane (g = lane / 4, t = lane % 4) is X[8 j + 2 t + e % 2, 16 w + g + 8 (e / 2)].

Where the columns never mix, every product reads a column tile only as its B: dot(A, X) [M, V]
is computed transposed, X^T A^T, on `mma.sync.m16n8k8` with X^T's accumulators as the A
fragments. A's four registers are rows g, g + 8 at contraction t and t + 4 (the PTX ISA's
fragment layout); the accumulator holds columns 2 t and 2 t + 1. So the contraction is
permuted, t -> 2 t and t + 4 -> 2 t + 1 within each step of eight, B's rows alike: a sum is the
same under any order of its terms, up to f32 rounding, as the interpreter's tf32 product is. The
products, the elementwise work and the state's update then need no shared memory and no barrier:
a chunk waits only for its loads. A product summed onto an earlier column tile (o's second term,
the state's decay) starts its accumulators from that tile.

The tiles the products read beside (w, qg, kg, aqk) are in shared memory as the emitter stores
them; one read as A's rows is padded to 8 words past the banks and read two words at a time,
one read transposed to 4 past (column_skew): conflict-free either way.
"""

from __future__ import annotations

import attrs

from ..ir.core import Op, Value
from ..ir.dtypes import DType
from ..ir.multiples import known_multiple
from ..ir.mma_ops.roles import REGISTER_FILE
from ..ir.tile_ops import BinaryOp, CastOp, DotOp, ForOp, StoreOp, index_operands
from . import float16
from .c_names import C_TYPES
from .tile_mma import TF32_KINDS, mma_kind, tf32x3_terms
from .tile_plan import POINTWISE_OPS, THREADS, VIEW_OPS, WARP
from .tile_prefetch import PREFETCH_REGISTERS

WARPS = THREADS // WARP
COLUMNS = 16  # a warp's columns: the M of a product computed transposed
STAGED = 8    # 16-bit columns a lane stores at once through its warp's rows (emit_staged_store)
STEP = 8      # a slot group's rows: the N and the K of m16n8k8
A_FROM_SLOTS = (0, 2, 1, 3)  # A's registers a0..a3 from a slot group's accumulators, contraction permuted


def slot_row(j: int, e: int, t: int) -> int:
    """The row of a column tile that slot (j, e) of lane group t holds."""
    return STEP * j + 2 * t + (e & 1)


def slot_column(e: int, g: int) -> int:
    """The column, within its warp's 16, that slot e of lane group g holds."""
    return g + 8 * (e >> 1)


@attrs.frozen
class ColumnLoop:
    """A loop whose carried tile lives in registers: its column tiles, and the products summed
    onto an earlier column tile (product -> (that tile, the sum))."""

    loop: ForOp
    carried: Value
    columns: int
    values: frozenset
    sums: dict

    @property
    def warps(self) -> int:
        return self.columns // COLUMNS

    @property
    def summed(self) -> dict:
        """sum -> the product whose accumulators hold it."""
        return {s: d for d, (_, s) in self.sums.items()}

    def reads(self, op: Op) -> bool:
        return any(x in self.values for x in op.operands)


def column_loop(loop: ForOp) -> ColumnLoop | None:
    """The loop's plan where it carries one f32 tile, and nothing else, whose columns never mix
    in its body; else None."""
    args = loop.body.args[1:]
    if len(args) != 1 or args[0].ttype.rank != 2:
        return None
    s = args[0]
    shape = s.ttype.shape
    if s.ttype.dtype is not DType.F32 or not all(isinstance(d, int) for d in shape):
        return None
    rows, columns = shape
    if rows % STEP or columns % COLUMNS or columns > COLUMNS * WARPS:
        return None
    body = loop.body.ops
    values = {s}
    for op in body[:-1]:
        if op.regions:
            return None
        read = [x for x in op.operands if x in values]
        if not read:
            continue
        if not column_op(op, values, columns):
            return None
        values.update(op.results)
    if body[-1].operands[0] not in values:
        return None
    return ColumnLoop(loop, s, columns, frozenset(values), summed_products(body, values))


def column_op(op: Op, values: set, columns: int) -> bool:
    """Whether op, reading a column tile, keeps the columns apart: a tensor-core product reading
    one as its B only, an elementwise op at its shape, or a store of one."""
    if isinstance(op, StoreOp):
        return op.operands[0] in values and not any(x in values for x in op.operands[1:])
    if not op.results or op.result.ttype.rank != 2:
        return False
    rows, cols = op.result.ttype.shape
    if cols != columns or rows % STEP:
        return False
    if isinstance(op, DotOp):
        a, b = op.operands
        # the accumulators as A's fragments are TF32's m16n8k8 layout
        return mma_kind(op) in TF32_KINDS and b in values and a not in values and not op.trans_b
    if isinstance(op, POINTWISE_OPS):
        return all(x in values or x.ttype.rank == 0 or x.ttype.shape == op.result.ttype.shape for x in op.operands)
    return False


def summed_products(body, values) -> dict:
    """The products a column tile's sum alone reads, with an addend computed before them:
    product -> (addend, sum)."""
    order = {op: i for i, op in enumerate(body)}
    owner = {r: op for op in body for r in op.results}
    readers: dict[Value, list[Op]] = {}
    for op in body:
        for x in op.operands:
            readers.setdefault(x, []).append(op)
    sums = {}
    for op in body:
        if not (isinstance(op, BinaryOp) and op.NAME == "tile.add" and op.result in values):
            continue
        for d, addend in ((op.operands[1], op.operands[0]), (op.operands[0], op.operands[1])):
            made = owner.get(d)
            if (isinstance(made, DotOp) and d in values and addend in values and readers.get(d) == [op]
                    and order.get(owner.get(addend), -1) < order[made] and d not in sums):
                sums[d] = (addend, op.result)
                break
    return sums


def column_skew(v: Value, plan: ColumnLoop | None) -> int | None:
    """The pitch (in words, modulo the banks) for a buffer of v that the loop's products read
    beside a column tile: 8 read along its rows two words at a time, 4 read transposed; None
    where none reads it or they disagree."""
    if plan is None:
        return None
    skews = {4 if op.trans_a else 8 for op in plan.loop.body.ops
             if isinstance(op, DotOp) and op.result in plan.values and op.operands[0] is v}
    return skews.pop() if len(skews) == 1 else None


class TileColumns:
    """Mixed into TileKernelEmitter: a ColumnLoop written through its elem, flush_for, phases,
    prefetch, access and rules."""

    column_registers: bool
    double_buffer: bool  # two copies of a column loop's loads, one barrier an iteration
    columns = None  # the ColumnLoop being written
    column_ctas = REGISTER_FILE  # the CTAs an SM the column tiles' registers allow (no bound where none)
    register_columns = 0  # the columns of the last loop written so
    column_capture = None  # op result -> its expression, where define would write it

    def emit_column_for(self, op: ForOp, plan: ColumnLoop) -> None:
        self.columns, self.column_regs, self.column_slots, self.columns_written = plan, {}, {}, set()
        self.register_columns = plan.columns
        # about three column tiles of the carried one's size live at once (the state, its decay
        # and the sum), besides the prefetched loads and the fragments
        words = 3 * plan.carried.ttype.shape[0] // STEP * 4 + PREFETCH_REGISTERS + 16
        self.column_ctas = max(1, min(self.column_ctas, REGISTER_FILE // (THREADS * words)))
        w, g, t = self.fresh("kfc_w"), self.fresh("kfc_g"), self.fresh("kfc_t")
        self.column_lanes = (w, g, t)
        self.emit(f"const int {w} = threadIdx.x >> 5, {g} = (threadIdx.x & 31) >> 2, {t} = threadIdx.x & 3;")
        init = op.inits[0]
        self.flush_for([init])
        regs = self.declare_column(plan.carried)
        self.for_slots(plan.carried, lambda j, e, idx: f"{regs}[{j}][{e}] = {self.elem(init, idx)};")
        self.end_unsynced_step()  # the initial tile's buffer, if any, is free for the loop's
        lo, hi, step = (self.name(v) for v in op.operands[:3])
        iv = self.name(op.body.args[0])
        loads, prefetch_regs = self.begin_prefetched_loop(op)
        self.prefetched.update(loads)
        halves = self.fresh("kfc_h")
        if self.double_buffer and loads:
            self.emit(f"int {halves} = 0;")
        self.emit(f"for (long long {iv} = {lo}; {iv} < {hi}; {iv} += {step}) {{")
        self.indent += 1
        start = self.step + 1
        self.head_of_prefetched_iteration(op, loads, prefetch_regs)
        for inner in op.body.ops[:-1]:
            if plan.reads(inner):
                self.emit_column_op(inner)
            else:
                self.emit_body_op(inner)
        y = op.body.ops[-1].operands[0]
        if y is not plan.carried:
            self.for_slots(plan.carried, lambda j, e, idx: f"{regs}[{j}][{e}] = {self.column_regs[y]}[{j}][{e}];")
        doubled = self.doubled_loads(op, loads)
        if doubled:
            # the next iteration's loads go to the other copies: no barrier before they are
            # stored, only the one after (two iterations apart, every warp has passed it)
            self.emit(f"{halves} ^= 1;")
            for b in doubled:
                b.halves = 2
            for b in doubled:
                self.emit(f"{b.name} = {b.name}_base + {halves} * {b.elements};")
            self.unsynced_reads = False
        self.end_unsynced_step()  # else the next iteration's loads overwrite what this one's products read
        self.indent -= 1
        self.emit("}")
        self.arena.close_loop(start, self.step)
        if doubled:  # what follows may take their bytes once every warp is done with them
            for b in doubled:  # and a later run of the loop starts from the first copies again
                self.emit(f"{b.name} = {b.name}_base;")
            self.unsynced_reads = True
            self.end_unsynced_step()
        # the final state into shared memory, for what reads it after the loop
        res = op.results[0]
        buf = self.new_buffer(res)
        self.begin_phase()
        self.arena.touch(buf, self.step)
        self.for_slots(plan.carried, lambda j, e, idx: f"{buf.at(idx)} = {regs}[{j}][{e}];")
        self.end_phase()
        self.buffers[res] = buf
        self.columns = None

    def doubled_loads(self, loop: ForOp, loads) -> list:
        """The buffers of the loop's prefetched loads, to keep two copies of, where they are all
        its body writes into shared memory (every other op a column op, a view or a scalar's):
        each iteration then stores into the copy the last did not read. [] otherwise."""
        if not (self.double_buffer and loads):
            return []
        stored = {(self.widened_for_products(o) or o) for o in loads} | set(loads)
        for o in loop.body.ops[:-1]:
            if not (o in stored or self.columns.reads(o) or isinstance(o, VIEW_OPS)
                    or all(x.ttype.rank == 0 for x in (*o.operands, *o.results))):
                return []
        return [self.buffers[(self.widened_for_products(o) or o).result] for o in loads]

    def end_unsynced_step(self) -> None:
        """A barrier after reads of shared buffers outside a phase, counted as a step of its own:
        the buffers those reads kept live end there, before what follows may reuse their bytes."""
        if self.unsynced_reads:
            self.sync_scalar_reads()
            self.step += 1

    def declare_column(self, v: Value) -> str:
        """A column tile's registers: a lane's slots, row group j by slot e."""
        name = self.fresh("kfc_x")
        self.emit(f"{C_TYPES[v.ttype.dtype]} {name}[{v.ttype.shape[0] // STEP}][4];")
        self.column_regs[v] = name
        self.inline[v] = lambda idx, v=v: f"{self.column_regs[v]}[{self.column_slots[tuple(idx)]}]"
        return name

    def slot_index(self, j: int, e: int) -> tuple[str, str]:
        """Slot (j, e)'s element indices, as C expressions of the lane; known to elem."""
        w, g, t = self.column_lanes
        idx = (f"{STEP * j + (e & 1)} + 2 * {t}", f"{w} * {COLUMNS} + {g} + {8 * (e >> 1)}")
        self.column_slots[idx] = f"{j}][{e}"
        return idx

    def for_slots(self, v: Value, line_of) -> None:
        """line_of(j, e, indices) for each of a lane's slots of column tile v, in the warps that
        hold columns."""
        self.in_column_warps([line_of(j, e, self.slot_index(j, e))
                              for j in range(v.ttype.shape[0] // STEP) for e in range(4)])

    def in_column_warps(self, lines: list[str]) -> None:
        """The lines, run by the warps that hold columns (all eight where V is 128)."""
        guarded = self.columns.warps < WARPS
        if guarded:
            self.emit(f"if ({self.column_lanes[0]} < {self.columns.warps}) {{")
            self.indent += 1
        for line in lines:
            self.emit(line)
        if guarded:
            self.indent -= 1
            self.emit("}")

    def emit_column_op(self, op: Op) -> None:
        plan = self.columns
        if op in self.columns_written:  # beside a product sharing its column tile
            return
        self.flush_for([x for x in op.operands if x not in plan.values])
        if isinstance(op, StoreOp):
            value, tensor = op.operands[:2]
            if self.staged_stores and self.emit_staged_store(op, value, tensor):
                return self.after_column_op()

            def store(j, e, idx):
                offset, conds = self.access(op, tensor, op.operands[2:], idx)
                write = f"{self.name(tensor)}[{offset}] = {self.column_regs[value]}[{j}][{e}];"
                return f"if ({' && '.join(conds)}) {write}" if conds else write

            self.for_slots(value, store)
        elif isinstance(op, DotOp):
            self.emit_column_dot(op)
        elif op.result in plan.summed:  # written by the product it sums (emit_column_dot)
            product = plan.summed[op.result]
            self.column_regs[op.result], self.inline[op.result] = self.column_regs[product], self.inline[product]
        else:
            self.column_capture = {}
            self.emit_op(op)  # its rule's define hands the expression over (column_capture)
            expr = self.column_capture.pop(op.result)
            self.column_capture = None
            regs = self.declare_column(op.result)
            self.for_slots(op.result, lambda j, e, idx: f"{regs}[{j}][{e}] = {expr(idx)};")
        self.after_column_op()

    def after_column_op(self) -> None:
        self.reopenable = None  # no later write continues a phase from before these reads
        self.last_store = None

    def stages_rows(self, op: StoreOp, value: Value, tensor: Value) -> bool:
        """Whether a store of a 16-bit column tile can go out a row's 16 bytes at a time: the
        tensor's last axis is the tile's columns, whole groups of STAGED (its extent a multiple,
        a slice of it from a start and up to a limit known to be multiples), and the tile's rows
        whole warps' reads."""
        last, t = op.index[-1], tensor.ttype
        if value.ttype.dtype not in (DType.BF16, DType.F16) or value.ttype.shape[0] * COLUMNS // STAGED % WARP:
            return False
        if not (isinstance(t.shape[-1], int) and t.shape[-1] % STAGED == 0 and last.kind in ("all", "slice")):
            return False
        return last.kind == "all" or all(known_multiple(v, self.index_facts.owner) % STAGED == 0
                                         for v in index_operands(op)[-1][1])

    def emit_staged_store(self, op: StoreOp, value: Value, tensor: Value) -> bool:
        """A 16-bit column tile stored through its warp's rows in shared memory: each lane writes
        its slots there, and after __syncwarp each lane stores 16 bytes of one row (STAGED
        columns) with one address and one bounds test, not a 2-byte store, an address and tests
        a slot (KDA's o: 8 stores a lane a chunk to 1). False where it does not apply."""
        if not self.stages_rows(op, value, tensor):
            return False
        w, g, t = self.column_lanes
        rows = value.ttype.shape[0]
        first = self.step if self.in_phase else self.step + 1
        buf = self.arena.new(self.fresh("kfc_s"), C_TYPES[value.ttype.dtype], (WARPS * rows, COLUMNS), first,
                             f"{value.type} a warp's rows")
        buf.rows = "groups"  # read along its rows: no padding, each row's 16-byte groups aligned
        at = lambda row, col: f"{buf.name}[({w} * {rows} + {row}) * {buf.pitch} + {col}]"  # noqa: E731
        regs = self.column_regs[value]
        lines = [f"{at(f'{STEP * j + (e & 1)} + 2 * {t}', f'{g} + {8 * (e >> 1)}')} = {regs}[{j}][{e}];"
                 for j in range(rows // STEP) for e in range(4)]
        lines.append("__syncwarp();")
        lane = "(threadIdx.x & 31)"
        for r in range(rows * COLUMNS // STAGED // WARP):
            row, col = f"({lane} >> 1) + {r * WARP * STAGED // COLUMNS}", f"{STAGED} * ({lane} & 1)"
            offset, conds = self.access(op, tensor, op.operands[2:], (row, f"{w} * {COLUMNS} + {col}"))
            write = (f"*reinterpret_cast<uint4*>(&{self.name(tensor)}[{offset}]) = "
                     f"*reinterpret_cast<const uint4*>(&{at(row, col)});")
            lines.append(f"if ({' && '.join(conds)}) {write}" if conds else write)
        lines.append("__syncwarp();  // the rows are written again only after every lane's reads")
        self.in_column_warps(lines)
        return True

    def sharing_column(self, op: DotOp) -> list[DotOp]:
        """op and the later products of the loop reading the same column tile as their B whose A
        and first term are computed already (KDA's w S and qg S): written together, each step's
        A fragments made once for all and their sums in flight together."""
        x, body = op.operands[1], self.columns.loop.body.ops
        order = {o: i for i, o in enumerate(body)}
        owner = {r: o for o in body for r in o.results}
        found = [op]
        for q in body[order[op] + 1:]:
            if (not isinstance(q, DotOp) or q.operands[1] is not x or q.result not in self.columns.values
                    or mma_kind(q) != mma_kind(op)):  # one kind of product a group (3xTF32 or TF32)
                continue
            start = self.columns.sums.get(q.result)
            ready = order.get(owner.get(q.operands[0]), -1) < order[op]
            if ready and (start is None or start[0] in self.column_regs):
                found.append(q)
        return found

    def pair_source(self, a: Value) -> tuple:
        """(The shared buffer, the C type of two adjacent elements) where a product's A, read
        along its rows, is a buffer of f32, or an f32 cast of one of bf16 or f16, at an even
        pitch: B's two registers read in one access (their elements adjacent, the first at an
        even column). A 16-bit float widened is TF32 already. (None, None) otherwise."""
        owner = self.plan.owner.get(a)
        if a in self.inline and isinstance(owner, CastOp) and a.ttype.dtype is DType.F32:
            a = owner.operands[0]
        buf = self.buffers.get(a) if a not in self.inline else None
        pair = {"float": "float2", **{C_TYPES[d]: p for d, p in float16.PAIR.items()}}.get(buf and buf.ctype)
        return (buf, pair) if pair and buf.pitch % 2 == 0 else (None, None)

    def emit_column_dot(self, op: DotOp) -> None:
        """dot(A, X) with X a column tile, transposed: X^T's accumulators as the A fragments,
        A's elements as B's, the contraction permuted alike (the module's docstring); beside it
        the products sharing X (sharing_column)."""
        group = self.sharing_column(op)
        self.columns_written.update(group[1:])
        self.flush_for([q.operands[0] for q in group[1:]])
        x = op.operands[1]
        k = x.ttype.shape[0]
        _, g, t = self.column_lanes
        xs, lines, products = self.column_regs[x], [], []
        for q in group:
            a = q.operands[0]
            start = self.columns.sums.get(q.result)
            regs = self.declare_column(q.result)
            buf, pair = self.pair_source(a) if not q.trans_a else (None, None)
            products.append((q, a, regs, buf, pair))
            for j in range(q.result.ttype.shape[0] // STEP):
                for e in range(4):
                    first = f"{self.column_regs[start[0]]}[{j}][{e}]" if start else "0.0f"
                    lines.append(f"{regs}[{j}][{e}] = {first};")
        split = mma_kind(op) == "tf32x3"  # 3xTF32: each operand also as its low part, three products
        for kk in range(k // STEP):
            fa = {"": self.fresh("kfc_a")}
            frag = ", ".join(f"kfc_tf32_bits({xs}[{kk}][{s}])" for s in A_FROM_SLOTS)
            lines.append(f"const unsigned {fa['']}[4] = {{{frag}}};")
            if split:
                fa["l"] = self.fresh("kfc_a")
                frag = ", ".join(f"kfc_tf32_lo({xs}[{kk}][{s}])" for s in A_FROM_SLOTS)
                lines.append(f"const unsigned {fa['l']}[4] = {{{frag}}};")
            c0 = f"{STEP * kk} + 2 * {t}"
            for q, a, regs, buf, pair in products:
                for j in range(q.result.ttype.shape[0] // STEP):
                    row = f"{STEP * j} + {g}"
                    if pair:
                        self.elem(a, (row, c0))  # marks the buffer read in this step
                        p = self.fresh("kfc_p")
                        lines.append(f"const {pair} {p} = *reinterpret_cast<const {pair}*>(&{buf.at((row, c0))});")
                        bits = "kfc_tf32_bits" if buf.ctype == "float" and not buf.tf32 else "__float_as_uint"
                        b = {"": [f"{bits}({p}.x)", f"{bits}({p}.y)"]}
                        if split:
                            b["l"] = [f"kfc_tf32_lo({p}.{e})" for e in "xy"]
                    else:
                        at = [(c, row) if q.trans_a else (row, c) for c in (c0, f"{c0} + 1")]
                        b = {"": [self.tf32_bits(a, i) for i in at]}
                        if split:
                            b["l"] = [f"kfc_tf32_lo({self.elem(a, i)})" for i in at]
                    for fp, bp in tf32x3_terms() if split else (("", ""),):
                        f, h = fa[fp], b[bp]
                        lines.append(f"kfc_mma_tf32({regs}[{j}], {f}[0], {f}[1], {f}[2], {f}[3], {h[0]}, {h[1]});")
        self.in_column_warps(lines)

"""How a phase of a tile kernel (kfc.codegen.tile_emitter) writes a tile: a CTA-wide loop over
its elements, into a shared buffer or a tensor.

Where a tile's last axis splits into groups of LANES elements, a thread takes a group at a time:
each load of a tensor at those elements is one access of up to 16 bytes (its bounds tested and
its address computed once for the group, not once an element), the group goes into shared
memory in one store, and a store into a tensor is one access too. The runtime passes every
tensor contiguous and 16-byte aligned (kfc.runtime.calls), so a group along a tensor's whole
last axis, of a static extent that LANES divides, is aligned; so is one in a block of that axis
whose start and limit are known multiples of LANES. A shared buffer whose rows are whole groups
is read at a group's own elements in one access too (lane_read).
"""

from __future__ import annotations

import functools

from ..ir.bounds import IndexFacts
from ..ir.core import Op, Value
from ..ir.multiples import known_multiple, power_of_two
from ..ir.tile_ops import DotOp, ReduceOp, ScanOp, TriInvOp, index_operands
from .c_names import C_TYPES
from .tile_fusion import CtaLoop, fuse_loops
from .tile_mma import mma_dot
from .tile_plan import C_SIZES, THREADS, Buffer, strided_loop, warp_reduction

UNROLL = 8  # iterations of a CTA-wide loop unrolled at most (a [16, 128] tile: 8 a thread)
LANES = 4  # consecutive elements a thread takes at once along a tile's last axis
ACCESS_TYPES = {4: "unsigned", 8: "uint2", 16: "uint4"}  # one access of this many bytes


def lane_bytes(ctype: str) -> str | None:
    """The C type of one access to LANES elements of this C type, or None."""
    return ACCESS_TYPES.get(C_SIZES.get(ctype, 0) * LANES)


def groups_of_rows(tensor: Value) -> bool:
    """Whether the tensor's rows are whole groups: a static last extent LANES divides, in
    elements a group makes one access of (every row then starts aligned)."""
    t = tensor.ttype
    return (t.rank > 0 and isinstance(t.shape[-1], int) and t.shape[-1] % LANES == 0
            and lane_bytes(C_TYPES[t.dtype]) is not None)


class TileWrites:
    """Mixed into TileKernelEmitter: written through its fresh, emit, elem, access, stored,
    arena and phases."""

    lanes: dict        # the lane index tuples of the group being written -> lane number
    lane_loads: dict   # load op or buffer -> the C array its group's access filled
    whole_groups: bool

    def grouped_last_axis(self, op: Op, tensor: Value) -> bool:
        """Whether a load or store takes its tensor's last axis in whole groups, each then
        aligned and wholly inside the tensor (and a slice's limit) or wholly outside: the
        tensor's rows are whole groups (groups_of_rows), and it takes the whole axis or, with
        whole groups on, a slice of a size LANES divides from a start and up to a limit known
        to be multiples of LANES (a block of columns: c0:c0+64 with c0 = b * 64)."""
        last = op.index[-1]
        if not groups_of_rows(tensor):
            return False
        if last.kind == "all":
            return True
        if not (self.whole_groups and last.kind == "slice" and last.size % LANES == 0):
            return False
        return all(known_multiple(v, self.index_facts.owner) % LANES == 0 for v in index_operands(op)[-1][1])

    @functools.cached_property
    def index_facts(self) -> IndexFacts:
        """What the IR makes true of the loop's index scalars; its `owner` finds the op that
        defines a value, inside the loop or before it."""
        top = self.top_level_owner
        return IndexFacts(self.loop, lambda v: self.plan.owner.get(v) or top.get(v))

    def bounds_tests(self, v: Value, p: str, extent, ext: str) -> list[str]:
        """The tests that position p (index v, or a slice from v where extent is None) lies in
        [0, ext), less those the IR already makes true (kfc.ir.bounds)."""
        facts = self.index_facts
        tests = [] if facts.nonnegative(v) else [f"{p} >= 0"]
        return tests + ([] if extent is not None and facts.below(v, extent) else [f"{p} < {ext}"])

    def unflatten(self, e: str, shape) -> tuple[str, ...]:
        """Declare the indices of flat element e (nonnegative) of a tile of this shape; their
        names. Powers of two are a shift and a mask: the compiler cannot see e's sign."""
        idx, stride = [], 1
        for d in reversed(shape):
            n = self.fresh("kfc_i")
            shift = power_of_two(stride)
            if power_of_two(d) is not None and shift is not None:
                self.emit(f"const int {n} = ({e} >> {shift}) & {d - 1};")
            else:
                self.emit(f"const int {n} = ({e} / {stride}) % {d};" if stride > 1 else f"const int {n} = {e} % {d};")
            idx.append(n)
            stride *= d
        return tuple(reversed(idx))

    def cta_loop(self, count: int, body, unroll: int = UNROLL) -> None:
        """body(element indices...) for each of `count` elements, spread over the CTA's threads.
        The stride is the launch's THREADS, a constant, so that the compiler unrolls the few
        iterations a thread has (`unroll` at most) and issues their loads together."""
        e = self.fresh("kfc_e")
        if count % THREADS == 0 and count // THREADS <= unroll:
            # every thread the same few iterations: a count the compiler knows, no remainder
            j = self.fresh("kfc_j")
            record = self.begin_cta_loop()
            self.emit("#pragma unroll")
            self.emit(f"for (int {j} = 0; {j} < {count // THREADS}; ++{j}) {{")
            self.indent += 1
            self.emit(f"const int {e} = threadIdx.x + {j} * {THREADS};")
            body(e)
            self.indent -= 1
            self.emit("}")
            self.end_cta_loop(record)
            return
        if count > THREADS:
            self.emit(f"#pragma unroll {min(-(-count // THREADS), unroll)}")
        self.emit(strided_loop(e, "threadIdx.x", count, THREADS))
        self.indent += 1
        body(e)
        self.indent -= 1
        self.emit("}")

    def begin_cta_loop(self) -> tuple[int, list | None]:
        """Before a CTA-wide loop of a fixed count of iterations is written: where it begins, and
        the writes of a loop around it."""
        record = (len(self.lines), self.loop_writes)
        self.loop_writes = []
        return record

    def end_cta_loop(self, record: tuple[int, list | None], reads_only: bool = False) -> None:
        """After it: kept for tile_fusion where the statements it ends with are all its writes
        (emit_write), or where it writes nothing to memory (`reads_only`: into registers)."""
        (start, outer), writes = record, self.loop_writes
        self.loop_writes = outer
        end = len(self.lines)
        if outer is not None:
            outer.extend(writes)
        elif (writes or reads_only) and writes == list(range(end - 1 - len(writes), end - 1)):
            self.cta_loops.append(CtaLoop(start, end, len(writes)))

    def emit_write(self, line: str) -> None:
        """A statement writing shared memory or a tensor, as the last statements of a CTA-wide
        loop's body (tile_fusion)."""
        if self.loop_writes is not None:
            self.loop_writes.append(len(self.lines))
        self.emit(line)

    def fused_lines(self) -> list[str]:
        """The kernel's lines with each phase's CTA-wide loops of one count as one (tile_fusion)."""
        return fuse_loops(self.lines, self.cta_loops) if self.fuse_loops else self.lines

    def loops_inline(self, v: Value, top: bool = True) -> bool:
        """Whether tile v's expression holds a loop (a reduction, a product off tensor cores),
        itself or in the tiles it reads written inline: four side by side take the registers of
        four, so such a tile goes one element at a time."""
        op = self.plan.owner.get(v)
        if op is None or (not top and v not in self.inline):
            return False
        if isinstance(op, (ReduceOp, ScanOp, TriInvOp)) or (isinstance(op, DotOp) and not mma_dot(op)):
            return True
        return any(self.loops_inline(x, False) for x in op.operands)

    def cta_groups(self, shape, body, grouped: bool = True) -> None:
        """body(index tuples) for every element of a tile of this shape, spread over the CTA's
        threads: LANES consecutive elements along the last axis at a time where they divide it
        and `grouped` (their loads of tensors then one access each, lane_load), else one."""
        shape = tuple(shape)
        if not shape:
            body([()])
            return
        n = LANES if shape[-1] % LANES == 0 and grouped else 1
        count = 1
        for d in shape:
            count *= d

        def group(e):
            idx = self.unflatten(e, shape[:-1] + (shape[-1] // n,))
            if n == 1:
                body([idx])
                return
            c = self.fresh("kfc_l")
            self.emit(f"const int {c} = {idx[-1]} * {n};")
            lanes = [idx[:-1] + (c if k == 0 else f"({c} + {k})",) for k in range(n)]
            self.lanes, self.lane_loads = {lane: k for k, lane in enumerate(lanes)}, {}
            try:
                body(lanes)
            finally:
                self.lanes, self.lane_loads = {}, {}

        # as many elements unrolled a thread as one at a time: registers and code stay as they were
        self.cta_loop(count // n, group, max(1, UNROLL // n))

    def lane_load(self, op: Op, tensor: Value, idx, other: str) -> str | None:
        """Element idx of a load as one lane of its group's access, or None where idx is no lane
        of the group being written or the access does not take whole groups (grouped_last_axis)."""
        def fill(name, first):
            load, conds = self.group_load(op, tensor, first, name)
            self.emit(f"alignas(16) {C_TYPES[tensor.ttype.dtype]} {name}[{LANES}] = {{{', '.join([other] * LANES)}}};")
            self.emit(f"if ({' && '.join(conds)}) {load}" if conds else load)

        return self.group_lane(op, idx, "kfc_v", fill, lambda: self.grouped_last_axis(op, tensor))

    def lane_read(self, buf: Buffer, idx) -> str | None:
        """Element idx of a shared buffer as one lane of its group's read (a buffer of whole
        groups read at the group's own indices: one access for the group, conflict-free), or None."""
        access = lane_bytes(buf.ctype)

        def fill(name, first):
            self.emit(f"alignas(16) {buf.ctype} {name}[{LANES}];")
            self.emit(f"*reinterpret_cast<{access}*>({name}) = *reinterpret_cast<const {access}*>(&{buf.at(first)});")

        return self.group_lane(buf, idx, "kfc_r", fill, lambda: self.whole_groups and not (
            buf.pitch % LANES or buf.shape[-1] % LANES or access is None))

    def group_lane(self, key, idx, prefix: str, fill, applies) -> str | None:
        """Element idx as its lane in a C array that fill(name, the first lane's indices) fills
        with the group being written, once a group for `key`; None where idx is no lane of that
        group or not applies()."""
        lane = self.lanes.get(tuple(idx)) if idx else None
        if lane is None or not applies():
            return None
        name = self.lane_loads.get(key)
        if name is None:
            name = self.fresh(prefix)
            fill(name, next(x for x, k in self.lanes.items() if k == 0))
            self.lane_loads[key] = name
        return f"{name}[{lane}]"

    def group_load(self, op: Op, tensor: Value, first, dest: str) -> tuple[str, list[str]]:
        """The statement reading the group of LANES elements from `first` on (grouped_last_axis)
        into the C array `dest` as one access, and the conditions under which the group lies
        inside the tensor (every lane alike)."""
        access = lane_bytes(C_TYPES[tensor.ttype.dtype])
        offset, conds = self.access(op, tensor, op.operands[1:], first)
        return (f"*reinterpret_cast<{access}*>({dest}) = *reinterpret_cast<const {access}*>"
                f"({self.name(tensor)} + {offset});", conds)

    def group_store(self, target: str, ctype: str, values, aligned: bool) -> str | None:
        """The statement writing a group's values from C lvalue `target` (its first element) on
        as one access, or None where the group is not `aligned` or its bytes make no access."""
        access = lane_bytes(ctype)
        if len(values) == LANES and aligned and access:
            tmp = self.fresh("kfc_w")
            self.emit(f"alignas(16) {ctype} {tmp}[{LANES}] = {{{', '.join(values)}}};")
            return f"*reinterpret_cast<{access}*>(&{target}) = *reinterpret_cast<const {access}*>({tmp});"
        return None

    def store_tiles(self, exprs: dict) -> None:
        """Materialise several tiles that read no shared memory into new buffers, in one phase."""
        self.reopen_for([x for v in exprs for x in self.plan.owner[v].operands])
        bufs = {v: self.rounded_buffer(v) for v in exprs}
        self.begin_phase()
        for v, expr_of_idx in exprs.items():
            self.arena.touch(bufs[v], self.step)
            self.write_buffer(bufs[v], expr_of_idx, v)
            self.buffers[v] = bufs[v]
        self.end_phase(reopenable=True)

    def store_tile(self, v: Value, expr_of_idx, buf: Buffer | None = None, source: Value | None = None) -> Buffer:
        """Materialise v (its elements from expr_of_idx, the expression of tile `source`, else
        of v) into buf, else a new buffer (a reduction with few outputs a warp an output)."""
        op = self.plan.owner.get(v)
        new = buf is None
        if new and (source is not None or op is not None):  # what it reads known: it may continue the last phase
            self.reopen_for([source] if source is not None else op.operands)
        if new and op is not None and op.results == (v,) and warp_reduction(op):
            return self.emit_warp_reduce(op)
        buf = buf or self.rounded_buffer(v)
        self.begin_phase()
        self.arena.touch(buf, self.step)
        self.write_buffer(buf, expr_of_idx, source or v)
        self.end_phase(reopenable=new)
        self.buffers[v] = buf
        return buf

    def write_buffer(self, buf: Buffer, expr_of_idx, v: Value) -> None:
        """A CTA-wide loop writing every element of buf with tile v, from expr_of_idx (inside a
        phase)."""
        self.cta_groups(buf.shape, lambda lanes: self.write_group(buf, lanes, [expr_of_idx(idx) for idx in lanes]),
                        not self.loops_inline(v))

    def write_group(self, buf: Buffer, lanes, values) -> None:
        """Values (as `stored` writes them) into buf at these lanes' indices: one access where
        the group is aligned, else an element at a time."""
        values = [self.stored(buf, x) for x in values]
        group = self.group_store(buf.at(lanes[0]), buf.ctype, values, buf.pitch % LANES == 0)
        if group:
            self.emit_write(group)
            return
        for idx, value in zip(lanes, values):
            self.emit_write(f"{buf.at(idx)} = {value};")

    def write_tensor(self, op: Op, tensor: Value, value: Value) -> None:
        """A CTA-wide loop storing every element of tile `value` into the tensor (inside a
        phase; an optional tensor's pointer tested around it)."""
        ptr = self.name(tensor)
        t = tensor.ttype
        whole_rows = bool(value.ttype.rank) and self.grouped_last_axis(op, tensor)

        def at(idx):  # the element's offset, and its bounds but the pointer's (tested around the loop)
            offset, conds = self.access(op, tensor, op.operands[2:], idx)
            conds = [c for c in conds if c != f"{ptr} != nullptr"]
            return offset, (f"if ({' && '.join(conds)}) " if conds else "")

        def body(lanes):
            values = [self.elem(value, idx) for idx in lanes]
            if whole_rows and len(lanes) == LANES:  # one bounds test for the group: its last axis is whole
                offset, guard = at(lanes[0])
                self.emit_write(guard + self.group_store(f"{ptr}[{offset}]", C_TYPES[t.dtype], values, True))
                return
            for idx, v in zip(lanes, values):
                offset, guard = at(idx)
                self.emit_write(f"{guard}{ptr}[{offset}] = {v};")

        if value.ttype.rank:
            self.cta_groups(value.ttype.shape, body, not self.loops_inline(value))
        else:
            self.emit("if (threadIdx.x == 0) {")
            body([()])
            self.emit("}")

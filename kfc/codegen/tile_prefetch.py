"""Loads of the next loop iteration issued before this one's work (kfc.codegen.tile_emitter).

A `tile.for` whose iteration begins by loading tiles of tensors the kernel never writes, at
indices that are the induction variable or values from outside the loop (KDA's recurrence:
w, qg, aqk, gend and kg of chunk t), waits on memory at each iteration's start: the loads are
stored into shared memory in one phase, and every thread waits there for its global reads.
Here each such load of chunk t + step goes into registers right after chunk t's tiles are
stored, before chunk t's products; the next iteration stores those registers. The reads are
then in flight during the whole iteration's work.

    before the loop:  registers <- the loads at t = lo
    each iteration:   shared buffers <- registers (one phase)
                      if t + step < hi: registers <- the loads at t + step
                      ... the iteration's work reads the shared buffers

The loads read the same elements as before (a tensor the kernel never writes reads alike at
any time), so the kernel computes what it did; only loads whose groups of LANES elements make
one access (a tensor's whole last axis, or a block of it known aligned) are taken, each thread
a fixed set of groups, while their registers stay within PREFETCH_REGISTERS a thread. A load
otherwise read where it is used (never stored) is stored beside the others when registers
allow: its read is then not waited on in the middle of the iteration.
"""

from __future__ import annotations

from ..ir.core import Op, Value
from ..ir.dtypes import DType
from ..ir.tile_ops import CastOp, ForOp, LoadOp
from .c_names import C_TYPES, literal
from .tile_mma import read_by_tf32_products_only
from .tile_plan import C_SIZES, THREADS
from .tile_writes import LANES

PREFETCH_REGISTERS = 64  # 4-byte registers a thread may hold for the next iteration's tiles


class TilePrefetch:
    """Mixed into TileKernelEmitter: written through its plan, written, names, access, stored,
    arena and phases."""

    prefetch: bool
    widen_prefetched: bool

    def prefetched_loads(self, loop: ForOp) -> list[LoadOp]:
        """The loads at the head of the loop's body to issue an iteration early. Those stored
        into shared memory all, or none where one cannot be or their registers do not fit in
        PREFETCH_REGISTERS (those left would be stored in a phase of their own, a barrier
        more); then, as registers allow, those read where they are used, which then are stored
        beside them (u in KDA's recurrence: read once, by U = u - w S, a global read waited on
        in the middle of the iteration otherwise)."""
        if not (self.prefetch and self.group_loads):
            return []
        heads = []
        for op in loop.body.ops:
            if not isinstance(op, LoadOp):
                break  # hoist-loads puts an iteration's loads first; what follows waits on others
            if op.result.ttype.rank:
                heads.append(op)
        stored = [op for op in heads if self.plan.wants_buffer(op)]
        if not all(self.can_prefetch(loop, op) for op in stored):
            return []
        words = sum(self.prefetch_words(op) for op in stored)
        if words > PREFETCH_REGISTERS:
            return []
        taken = list(stored)
        for op in heads:
            if op not in stored and self.can_prefetch(loop, op) and words + self.prefetch_words(op) <= PREFETCH_REGISTERS:
                taken.append(op)
                words += self.prefetch_words(op)
        return sorted(taken, key=heads.index)

    def can_prefetch(self, loop: ForOp, op: LoadOp) -> bool:
        """Whether a load reads a tensor the kernel never writes, in whole groups along its last
        axis (TileWrites.grouped_last_axis), at indices that are the loop's induction variable
        or values from outside the loop."""
        iv, tensor = loop.body.args[0], op.operands[0]
        inside = {r for o in loop.body.ops for r in o.results} | set(loop.body.args)
        return (not op.regions and tensor not in self.written and self.grouped_last_axis(op, tensor)
                and all(x.ttype.rank == 0 and (x is iv or x not in inside) for x in op.operands[1:]))

    def prefetch_words(self, op: LoadOp) -> int:
        r = op.result
        return self.groups_per_thread(r) * LANES * C_SIZES[C_TYPES[r.ttype.dtype]] // 4

    @staticmethod
    def group_count(v: Value) -> int:
        n = 1
        for d in v.ttype.shape:
            n *= d
        return n // LANES

    def groups_per_thread(self, v: Value) -> int:
        return -(-self.group_count(v) // THREADS)

    def thread_groups(self, v: Value, body, reads_only: bool = False) -> None:
        """body(j, first element's indices) for each group of LANES elements along tile v's
        last axis this thread takes: its j-th, at element group threadIdx.x + j * THREADS. The
        loop is unrolled whole, so that an array indexed by j stays in registers. `reads_only`:
        body writes only registers."""
        count, per = self.group_count(v), self.groups_per_thread(v)
        shape = tuple(v.ttype.shape)
        j = self.fresh("kfc_j")
        record = self.begin_cta_loop()
        self.emit("#pragma unroll")
        self.emit(f"for (int {j} = 0; {j} < {per}; ++{j}) {{")
        self.indent += 1
        e = self.fresh("kfc_e")
        self.emit(f"const int {e} = threadIdx.x + {j} * {THREADS};")
        if count % THREADS:
            self.emit(f"if ({e} < {count}) {{")
            self.indent += 1
        idx = self.unflatten(e, shape[:-1] + (shape[-1] // LANES,))
        c = self.fresh("kfc_l")
        self.emit(f"const int {c} = {idx[-1]} * {LANES};")
        body(j, idx[:-1] + (c,))
        if count % THREADS:
            self.indent -= 1
            self.emit("}")
        self.indent -= 1
        self.emit("}")
        self.end_cta_loop(record, reads_only)

    def declare_prefetch(self, loads: list[LoadOp]) -> dict[LoadOp, str]:
        """Each load's registers: an array of its groups a thread, LANES elements each."""
        regs = {}
        for op in loads:
            r = op.result
            regs[op] = self.fresh("kfc_pf")
            self.emit(f"alignas(16) {C_TYPES[r.ttype.dtype]} {regs[op]}[{self.groups_per_thread(r)}][{LANES}];")
        return regs

    def issue_prefetch(self, loads: list[LoadOp], regs: dict[LoadOp, str], iv: Value, at: str) -> None:
        """Each load's groups into its registers, with the induction variable iv read as `at`;
        an element outside the tensor or past a slice's limit is the load's `other`."""
        saved = self.names.get(iv)
        self.names[iv] = at
        try:
            for op in loads:
                tensor, r = op.operands[0], op.result
                other = literal(op.other, r.ttype.dtype)
                reg = regs[op]

                def body(j, first, op=op, tensor=tensor, other=other, reg=reg):
                    load, conds = self.group_load(op, tensor, first, f"{reg}[{j}]")
                    if not conds:
                        self.emit(load)
                        return
                    self.emit(f"if ({' && '.join(conds)}) {load}")
                    fill = " ".join(f"{reg}[{j}][{k}] = {other};" for k in range(LANES))
                    self.emit(f"else {{ {fill} }}")

                self.thread_groups(r, body, reads_only=True)
        finally:
            if saved is None:
                del self.names[iv]
            else:
                self.names[iv] = saved

    def widened_for_products(self, op: LoadOp) -> CastOp | None:
        """The cast to f32 that alone reads the load, where only tensor-core products read the
        cast (a bf16 workspace read by TF32 products): stored from the registers, widened and
        rounded, in the loads' phase, instead of in a phase of its own from the stored load."""
        users = self.plan.uses.get(op.result, ())
        cast = users[0] if len(users) == 1 else None
        if not (self.widen_prefetched and isinstance(cast, CastOp) and cast.result.ttype.dtype is DType.F32):
            return None
        return cast if read_by_tf32_products_only(cast.result, self.plan.uses.get(cast.result, ())) else None

    def store_prefetched(self, loads: list[LoadOp], regs: dict[LoadOp, str]) -> None:
        """The registers into new shared buffers, one phase for all (as the loads would have
        been stored); a load only products read through a cast to f32 stored as the cast."""
        stored = {op: self.widened_for_products(op) or op for op in loads}
        bufs = {op: self.rounded_buffer(stored[op].result) for op in loads}
        self.begin_phase()
        for op in loads:
            buf, reg, held = bufs[op], regs[op], op.result.ttype.dtype
            self.arena.touch(buf, self.step)
            widen = stored[op] is not op

            def body(j, first, buf=buf, reg=reg, widen=widen, held=held):
                lanes = [first[:-1] + (first[-1] if k == 0 else f"({first[-1]} + {k})",) for k in range(LANES)]
                values = [f"{reg}[{j}][{k}]" for k in range(LANES)]
                self.write_group(buf, lanes, [self.as_float(x, held) for x in values] if widen else values)

            self.thread_groups(op.result, body)
            self.buffers[stored[op].result] = buf
            if widen:
                self.prefetched.add(stored[op])  # its tile is in shared memory already
                continue
            if not self.plan.wants_buffer(op):
                # read where used, it would have been a global read: what reads it stays stored
                # as it was (U = u - w S), not recomputed from two buffers at each of its reads
                self.plan.costly.add(op.result)
        self.end_phase()

    def begin_prefetched_loop(self, loop: ForOp) -> tuple[list[Op], dict]:
        """Before the loop's header: the registers, filled at the first iteration's index
        (where the loop runs at all). The loads taken and their registers."""
        loads = self.prefetched_loads(loop)
        if not loads:
            return [], {}
        regs = self.declare_prefetch(loads)
        lo, hi = (self.name(v) for v in loop.operands[:2])
        self.emit(f"if ({lo} < {hi}) {{")
        self.indent += 1
        self.issue_prefetch(loads, regs, loop.body.args[0], lo)
        self.indent -= 1
        self.emit("}")
        return loads, regs

    def head_of_prefetched_iteration(self, loop: ForOp, loads, regs) -> None:
        """At an iteration's start: store this iteration's registers, then issue the next's."""
        if not loads:
            return
        self.store_prefetched(loads, regs)
        iv, hi, step = (self.name(v) for v in (loop.body.args[0], loop.operands[1], loop.operands[2]))
        self.emit(f"if ({iv} + {step} < {hi}) {{")
        self.indent += 1
        self.issue_prefetch(loads, regs, loop.body.args[0], f"({iv} + {step})")
        self.indent -= 1
        self.emit("}")

"""The kernel emitter of tile programs that are neither row programs nor a matched matrix
product: one CTA per point of the top-level tile.parallel, its tiles in shared memory, any
rank, any op of the tile dialect's core (loads and stores with slices and limits, elementwise
ops, broadcasts and views, reductions, scans, tile.dot, tile.tri_inv, tile.for carrying tiles).

A tile is an expression of its element's indices, written where it is read, unless
kfc.codegen.tile_plan stores it: then a CTA-wide loop over its elements writes it into a
shared buffer, and a barrier ends that phase. Reductions and products are loops in a lambda
(fp32 accumulation), scans and triangular inverses a loop per line or column. Scalars are
variables every thread computes alike, and every loop bound is such a scalar, so every thread
reaches every barrier. Products the tf32-dots pass marks run on tensor cores
(kfc.codegen.tile_mma). A program of several such loops is a kernel each (tile_kernels)."""

from __future__ import annotations

from ..ir.core import Op, Value
from ..ir.func import FuncOp
from ..ir.tile_ops import (BinaryOp, BroadcastOp, CastOp, ConstOp, DimOp, DotOp, ExpandDimsOp, ForOp, IfOp,
                           IotaOp, LoadOp, ParallelOp, ReduceOp, ScanOp, StoreOp, TransposeOp, TriInvOp,
                           ScratchOp, TriOp, YieldOp)
from ..ir.types import MemSpace
from ..passes.hoist_loads import written_tensors
from . import elementwise_rules  # noqa: F401  (registers the rules RULE_OPS are written by)
from .c_names import C_TYPES, argument_params, as_float, c_extent, c_param, dim_params, from_float, literal
from .errors import CodegenError
from .grid_emitter import GridPlan
from .tile_columns import TileColumns, column_loop, column_skew
from .tile_loops import TileLoops
from .tile_mma import DEFERRED_MMA, TileMma, fragment_skew, mma_dot, read_along_rows
from .tile_plan import POINTWISE_OPS, THREADS, VIEW_OPS, Buffer, SharedArena, TilePlan, ctas_per_sm, row_major
from .tile_phases import TilePhases
from .tile_prefetch import TilePrefetch
from .tile_writes import TileWrites
from .writer import CodeWriter

RULE_OPS = (ConstOp, DimOp) + POINTWISE_OPS  # written by their registered rules (elementwise_rules)
BODY_OPS = RULE_OPS + VIEW_OPS + (IotaOp, TriOp, LoadOp, StoreOp, ReduceOp, ScanOp, DotOp, TriInvOp, ForOp, IfOp, YieldOp)
GRID_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "//", "rem": "%"}


def tile_program_problem(func: FuncOp) -> str | None:
    """Why the tile emitter cannot take this program, or None: it takes top-level tile.parallel
    loops (scalars around them; a kernel each, launched in order: kfc.codegen.tile_kernels) whose
    bodies hold only ops it writes, on tiles of fixed shape."""
    parallels = [op for op in func.body.ops if isinstance(op, ParallelOp)]
    if not parallels:
        return "it has no top-level parallel loop"
    if any(loop.results for loop in parallels):
        return "its parallel loop sums across iterations (`+=` into a tensor)"
    for op in (op for op in func.body.ops if op not in parallels and not isinstance(op, ScratchOp)):
        if not isinstance(op, RULE_OPS) or any(r.ttype.rank for r in op.results):
            return f"{op.NAME} outside its parallel loop"
    for loop in parallels:
        stored = {op.operands[1] for op in loop.walk() if isinstance(op, StoreOp)}
        for op in list(loop.walk())[1:]:
            if isinstance(op, LoadOp) and op.operands[0] in stored:
                # written where it is read, perhaps after (a later loop, a later kernel, may read it)
                return f"one parallel loop both loads and stores {op.operands[0].name}, which its kernel cannot"
            if not isinstance(op, BODY_OPS):
                return f"{op.NAME} has no rule in the tile emitter"
            for r in op.results:
                if r.ttype.space is MemSpace.REG and not all(isinstance(d, int) for d in r.ttype.shape):
                    return f"{op.NAME} makes a tile of symbolic shape {r.type}"
    return None


class TileKernelEmitter(TileColumns, TileLoops, TileMma, TileWrites, TilePrefetch, TilePhases, CodeWriter):
    """Writes one tile program's kernel: `generate()` gives its CUDA C++ and launch plan."""

    as_float = staticmethod(as_float)
    from_float = staticmethod(from_float)
    chunk_local = None

    def __init__(self, func: FuncOp, kernel_name: str, group_loads: bool = True, share_b: bool = True,
                 prefetch: bool = True, ctas: int | None = None, join_phases: bool = True, reopen_phases: bool = True,
                 whole_groups: bool = True, tri_inv_lanes: bool = True,
                 product_epilogues: bool = True, early_loads: bool = False, widen_prefetched: bool = False,
                 column_registers: bool = False, double_buffer: bool = False, share_a: bool = False,
                 fuse_loops: bool = True, staged_stores: bool = True) -> None:
        problem = tile_program_problem(func) or (sum(isinstance(op, ParallelOp) for op in func.body.ops) > 1
                                                 and "a kernel is one parallel loop (kfc.codegen.tile_kernels)")
        if problem:
            raise CodegenError(f"the tile emitter cannot take {func.sym_name}: {problem}", func.loc)
        self.func, self.kernel_name = func, kernel_name
        self.loop = next(op for op in func.body.ops if isinstance(op, ParallelOp))
        self.names: dict[Value, str] = {v: c_param(v.name) for v in func.args}
        self.int_constants: dict[Value, int] = {}
        self.lines: list[str] = []
        self.indent, self.counter = 1, 0
        self.inline: dict[Value, object] = {}  # tile -> f(index tuple) -> C expression
        self.buffers: dict[Value, Buffer] = {}
        self.pending: dict[Value, object] = {}  # tiles to store, not yet stored: tile -> f(index tuple)
        self.plan, self.arena = TilePlan(self.loop), SharedArena()
        self.step = 0          # the CTA-wide phases written so far
        self.in_phase = False  # inside one: its reads are of this step; between two, of the next
        self.unsynced_reads = False  # a scalar read a shared tile since the last barrier
        self.group_loads = group_loads  # store the pending loads together (flush_for)
        self.ctas = ctas  # CTAs an SM for __launch_bounds__; None: as many as shared memory allows
        self.join_phases = join_phases  # independent writes share a phase (TilePhases)
        self.reopen_phases = reopen_phases  # a write continues the last phase where it may (reopen_for)
        self.tri_inv_lanes = tri_inv_lanes  # a triangular inverse a lane a row (TileLoops)
        self.product_epilogues = product_epilogues  # a tile alone reading a product written from it (TileMma)
        self.whole_groups = whole_groups  # rows read along them whole groups, read so (lane_read)
        self.early_loads = early_loads  # the CTA's loads all stored in its first phase of loads
        self.column_registers = column_registers  # a carried tile whose columns never mix in registers
        self.double_buffer, self.staged_stores = double_buffer, staged_stores  # its loads twice; stores by rows
        self.last_store = None  # (len(lines) after it, its tensors): the last store's phase (TilePhases)
        self.reopenable = None  # (len(lines) after it, its step, what it read): a phase a later write may continue
        self.reopened = False   # the last phase was taken back up: the next begin_phase continues it (TilePhases)
        self.phase_reads: set[str] = set()  # the buffers the phase being written reads
        self.written = written_tensors(func)
        self.share_b = share_b  # write products sharing a B in one phase (TileMma.sharing_b)
        self.share_a = share_a  # or sharing an A (TileMma.sharing_a)
        self.prefetch = prefetch  # a loop's next loads issued before its work (TilePrefetch)
        self.prefetched: set[Op] = set()  # loads (and casts of them) stored from registers at their loop's head
        self.widen_prefetched = widen_prefetched  # a prefetched load only products read through f32() stored so
        self.early: set[Op] = set()  # products written so, beside an earlier one
        self.lanes: dict = {}       # the lane index tuples of the group being written -> lane (TileWrites)
        self.lane_loads: dict = {}  # load op -> the C array its group's access filled
        self.fuse_loops, self.cta_loops, self.loop_writes = fuse_loops, [], None  # a phase's loops as one (TileWrites)

    # --- what the elementwise rules write through -----------------------------------------------
    def kind(self, v: Value) -> str:
        t = v.ttype
        if t.space is not MemSpace.REG:
            return "tensor"
        return "scalar" if t.rank == 0 else "row"

    @property
    def span(self) -> int:
        raise CodegenError("a tile kernel has no per-thread row span")

    def elem(self, v: Value, idx) -> str:
        if self.kind(v) == "scalar":
            return self.name(v)
        if v in self.inline:
            return self.inline[v](idx)
        buf = self.buffers.get(v)
        if buf is None:
            raise CodegenError(f"the tile kernel reads {v} before writing it", None)
        self.arena.touch(buf, self.step if self.in_phase else self.step + 1)
        if self.in_phase:
            self.phase_reads.add(buf.name)
        else:
            self.unsynced_reads = True
        return self.lane_read(buf, idx) or buf.at(idx)

    def operand(self, v: Value, i):
        return self.elem(v, i) if i is not None else self.name(v)

    def assign(self, op: Op, expr_of_i) -> None:
        r = op.result
        if self.kind(r) == "scalar":
            self.emit(f"const {C_TYPES[r.ttype.dtype]} {self.name(r)} = {expr_of_i(None)};")
        else:
            self.define(op, expr_of_i)

    # --- tiles: written where read, or stored ---------------------------------------------------
    def define(self, op: Op, expr_of_idx) -> None:
        """A tile written where it is read, or one to store: stored just before the first op
        that reads it (flush_for), so that its buffer lives no longer than it must."""
        r = op.result
        if self.column_capture is not None and self.columns and r in self.columns.values:
            self.column_capture[r] = expr_of_idx  # a column tile: into registers (TileColumns)
            return
        if self.plan.wants_buffer(op):
            path = self.plan.narrow_source(op, self.inline)
            if not path:
                if self.last_reader_of_a_buffer(op):
                    if not (self.store_in_reduction(op, expr_of_idx) or self.store_from_product(op, expr_of_idx)):
                        self.flush_for(op.operands)
                        self.store_tile(r, expr_of_idx)  # now, so that buffer may go
                else:
                    self.pending[r] = expr_of_idx
                return
            # store the narrow load the value is a cheap function of (bf16 k, not f32(k) * s)
            # and keep the value inline: half the bytes of shared memory, the same reads
            self.pending[path[0]] = self.inline.pop(path[0])
            for v in path:
                self.plan.costly.discard(v)
                if v is not path[0] and self.plan.is_costly(self.plan.owner[v]):
                    self.plan.costly.add(v)
        self.inline[r] = expr_of_idx
        if self.plan.is_costly(op):
            self.plan.costly.add(r)

    def last_read(self, v: Value) -> int:
        """The place in program order of the last op that reads v, through tiles written inline."""
        end = -1
        for u in self.plan.uses.get(v, ()):
            inline = len(u.results) == 1 and u.result in self.inline
            end = max(end, self.last_read(u.result) if inline else self.plan.order[u])
        return end

    def last_reader_of_a_buffer(self, op: Op) -> bool:
        """Whether op reads the last of a stored or pending tile (through tiles written inline)."""
        return any((v in self.buffers or v in self.pending) and self.last_read(v) <= self.plan.order[op]
                   for v in self.reached(op.operands))

    def reached(self, values) -> set[Value]:
        """These values and those their elements read through tiles written where they are
        read (a stored or pending tile ends the path)."""
        seen, stack = set(), list(values)
        while stack:
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            if v not in self.buffers and v not in self.pending and v in self.inline and v in self.plan.owner:
                stack.extend(self.plan.owner[v].operands)
        return seen

    def flush_for(self, values, keep=()) -> None:
        """Store the pending tiles these values read (through tiles written inline), in the
        order they were defined, so that each is stored after the tiles it reads; those in
        `keep` stay pending."""
        needed, stack = set(), list(values)
        while stack:
            v = stack.pop()
            if v in needed or (v not in self.pending and v not in self.inline) or v not in self.plan.owner:
                continue
            needed.add(v)
            stack.extend(self.plan.owner[v].operands)
        todo = [v for v in self.pending if v in needed and v not in keep]
        if todo and self.group_loads:
            # every load waiting to be stored, needed now or later, in this one phase: one wait
            # for memory and one barrier for them all (hoist-loads puts an iteration's loads first)
            loads = [v for v in self.pending if self.plain_load(v) and v not in keep]
            if len(loads) > 1:
                self.store_tiles({v: self.pending.pop(v) for v in loads})
                todo = [v for v in todo if v not in loads]
        for group in self.independent_groups(todo):
            if len(group) > 1:
                self.store_group(group)
                continue
            v = group[0]
            if v not in self.pending:  # written already, beside a product sharing its B
                continue
            expr = self.pending.pop(v)
            if expr is DEFERRED_MMA:
                tile = self.tile_of_product(v, todo)
                if tile is None:
                    self.emit_mma_dot(self.plan.owner[v])
                else:
                    self.emit_product_into(v, tile, self.pending.pop(tile))
            else:
                self.store_tile(v, expr)

    def plain_load(self, v: Value) -> bool:
        """Whether pending tile v is a load of a tensor the kernel never writes, at indices that
        are scalars: storing it reads no shared memory and depends on no other phase."""
        op = self.plan.owner.get(v)
        return isinstance(op, LoadOp) and self.pending.get(v) is not DEFERRED_MMA and self.reads_fixed_memory(op)

    def reads_fixed_memory(self, op: LoadOp) -> bool:
        """Whether a load reads a tensor the kernel never writes, at scalar indices."""
        return op.operands[0] not in self.written and all(x.ttype.rank == 0 for x in op.operands[1:])

    def new_buffer(self, v: Value) -> Buffer:
        owner = self.plan.owner.get(v)
        label = v.name or (f"{owner.operands[0].name}[...]" if isinstance(owner, LoadOp) else "")
        first = self.step if self.in_phase else self.step + 1  # the phase that writes it
        skew = column_skew(v, self.columns) or fragment_skew(v, self.plan.uses.get(v, ()))
        buf = self.arena.new(self.fresh("kfc_s"), C_TYPES[v.ttype.dtype], tuple(v.ttype.shape), first,
                             f"{label + ' ' if label else ''}{v.type}", skew)
        buf.rows = read_along_rows(v, self.plan.uses, self.tri_inv_lanes) if self.whole_groups else None
        return buf

    def begin_phase(self) -> None:
        if self.reopened:  # continuing the last phase (TilePhases.reopen_for)
            self.reopened = False
            return
        self.sync_scalar_reads()
        self.step += 1
        self.in_phase = True
        self.phase_reads = set()

    def end_phase(self, reopenable: bool = False) -> None:
        """The barrier after a phase; `reopenable` where it wrote only buffers new in it and
        tensors, so that a later write reading none of them may continue it (TilePhases)."""
        self.emit("__syncthreads();")
        self.in_phase = False
        self.unsynced_reads = False
        self.reopenable = (len(self.lines), self.step, frozenset(self.phase_reads)) if reopenable else None

    def sync_scalar_reads(self) -> None:
        """A barrier after scalars that read shared tiles outside a phase, before anything may
        write them (the next phase, a carried tile updated in place, the next iteration)."""
        if self.unsynced_reads:
            self.emit("__syncthreads();")
            self.unsynced_reads = False

    # --- the kernel -----------------------------------------------------------------------------
    def generate(self) -> tuple[str, GridPlan]:
        params = argument_params(self.func) + dim_params(self.func)
        for op in self.func.body.ops:
            if op is self.loop:
                self.emit_parallel(op)
            else:
                self.emit_op(op)
        while self.lines and self.lines[-1].strip() == "__syncthreads();":
            self.lines.pop()  # the CTA's last barrier guards nothing: after it its threads only exit
        self.lines = self.fused_lines()
        smem = self.arena.place()
        decls = ["  extern __shared__ __align__(128) unsigned char kfc_smem[];"] if self.arena.buffers else []
        decls += [f"  {b.ctype}* const {b.name}{'_base' if b.halves > 1 else ''} = "
                  f"reinterpret_cast<{b.ctype}*>(kfc_smem + {b.offset});" for b in self.arena.buffers]
        decls += [f"  {b.ctype}* {b.name} = {b.name}_base;" for b in self.arena.buffers if b.halves > 1]
        sig = ", ".join(p.decl() for p in params)
        ctas = self.ctas or min(ctas_per_sm(smem), self.column_ctas)
        code = (f'extern "C" __global__ void __launch_bounds__({THREADS}, {ctas}) {self.kernel_name}({sig}) {{\n'
                + "\n".join(decls + self.lines) + "\n}\n")
        peak = ", ".join(f"{b.what} ({b.nbytes} B)" for b in self.arena.busiest()[:6])
        return code, GridPlan(self.kernel_name, tuple(params), self.programs(), THREADS, 0, smem,
                              min_ctas_per_sm=ctas, shared_tiles=f"at the busiest phase: {peak}",
                              register_columns=self.register_columns)

    def grid_expr(self, v: Value) -> str:
        """A top-level scalar as an expression of the dims (the launch contract's grid)."""
        op = self.top_level_owner.get(v)
        if isinstance(op, DimOp):
            return op.sym
        if isinstance(op, ConstOp):
            return str(int(op.value))
        if isinstance(op, CastOp):
            return self.grid_expr(op.operands[0])
        if isinstance(op, BinaryOp) and op.NAME.split(".")[1] in GRID_OPS:
            a, b = (self.grid_expr(x) for x in op.operands)
            return f"({a} {GRID_OPS[op.NAME.split('.')[1]]} {b})"
        raise CodegenError("the parallel loop's bounds must be expressions of the dims", self.loop.loc)

    @property
    def top_level_owner(self) -> dict[Value, Op]:
        """The op outside the parallel loop that defines each of its scalars."""
        return {r: op for op in self.func.body.ops for r in op.results}

    def programs(self) -> str:
        extents = []
        for lo, hi in zip(self.loop.lowers, self.loop.uppers):
            a, b = self.grid_expr(hi), self.grid_expr(lo)
            extents.append(a if b == "0" else f"({a} - {b})")
        return " * ".join(extents)

    def emit_parallel(self, op: ParallelOp) -> None:
        """One CTA per point of the loop's box (the grid: programs), the last index fastest."""
        self.emit("long long kfc_p = blockIdx.x;")
        for i, (arg, lo, hi) in reversed(list(enumerate(zip(op.body.args, op.lowers, op.uppers)))):
            n, ext = self.name(arg), self.fresh("kfc_n")
            if i == 0:  # what is left of the CTA's index is below the first extent: no remainder
                self.emit(f"const long long {n} = {self.name(lo)} + kfc_p;")
                continue
            self.emit(f"const long long {ext} = {self.name(hi)} - {self.name(lo)};")
            self.emit(f"const long long {n} = {self.name(lo)} + kfc_p % {ext};")
            self.emit(f"kfc_p /= {ext};")
        self.emit_block(op.body)

    def emit_block(self, block) -> None:
        for op in block.ops:
            self.emit_body_op(op)

    def emit_body_op(self, op: Op) -> None:
        if op in self.prefetched:  # its tile is in shared memory already, from registers
            return
        # a loop or branch may read a pending tile in any of its phases: store those it reads
        # first; a pending product read elementwise stays pending (its reader may take its
        # accumulators)
        keep = [v for v in op.operands if self.pending.get(v) is DEFERRED_MMA] \
            if isinstance(op, POINTWISE_OPS + VIEW_OPS) else []
        keep += self.reductions_kept_for(op)  # perhaps stored by the tile they feed (TilePhases)
        reads = ([x for inner in op.walk() for x in inner.operands] if self.join_phases else list(self.pending)) \
            if op.regions else op.operands
        self.flush_for(reads, keep)
        if isinstance(op, ForOp):
            self.emit_for(op)
        elif isinstance(op, IfOp):
            self.emit_if(op)
        elif isinstance(op, LoadOp):
            self.emit_load(op)
        elif isinstance(op, StoreOp):
            self.emit_store(op)
        elif isinstance(op, VIEW_OPS):
            self.emit_view(op)
        elif isinstance(op, TriOp):
            k, cmp = op.k, "<=" if op.lower else ">="
            self.inline[op.result] = lambda idx: f"(({idx[1]}) {cmp} ({idx[0]}) + ({k}))"
        elif isinstance(op, IotaOp):
            ct = C_TYPES[op.result.ttype.dtype]
            self.inline[op.result] = lambda idx: f"(({ct})({idx[0]}))"
        elif isinstance(op, ReduceOp):
            self.assign(op, lambda idx: self.reduce_expr(op, idx))
        elif mma_dot(op):
            if op not in self.early:  # else written already, beside a product sharing its B
                self.pending[op.result] = DEFERRED_MMA  # written where first read, perhaps into its reader's store
        elif isinstance(op, DotOp):
            self.define(op, lambda idx: self.dot_expr(op, idx))
        elif isinstance(op, ScanOp):
            self.emit_scan(op)
        elif isinstance(op, TriInvOp):
            self.emit_tri_inv(op)
        else:
            self.emit_op(op)

    # --- views --------------------------------------------------------------------------------
    def emit_view(self, op: Op) -> None:
        x, r = op.operands[0], op.result
        xs, rs = x.ttype.shape, r.ttype.shape
        if isinstance(op, BroadcastOp):
            lead = len(rs) - len(xs)
            f = lambda idx: self.elem(x, tuple("0" if xs[j] == 1 else idx[lead + j] for j in range(len(xs))))
        elif isinstance(op, ExpandDimsOp):
            axes = set(op.axes)
            f = lambda idx: self.elem(x, tuple(i for k, i in enumerate(idx) if k not in axes))
        elif isinstance(op, TransposeOp):
            def f(idx):
                src = [None] * len(idx)
                for j, p in enumerate(op.perm):
                    src[p] = idx[j]
                return self.elem(x, tuple(src))
        else:  # reshape: through the flat offset
            def f(idx):
                flat, src, stride = row_major(idx, rs), [], 1
                for d in reversed(xs):
                    src.append(f"(({flat}) / {stride}) % {d}")
                    stride *= d
                return self.elem(x, tuple(reversed(src)))
        if r.ttype.rank == 0:  # a view of one element: a scalar like any other
            self.emit(f"const {C_TYPES[r.ttype.dtype]} {self.name(r)} = {f(())};")
            return
        self.inline[r] = f
        if x in self.plan.costly:
            self.plan.costly.add(r)

    # --- memory ---------------------------------------------------------------------------------
    def access(self, op: Op, tensor: Value, idx_operands, idx) -> tuple[str, list[str]]:
        """The element offset of a load or store at tile element idx, and the conditions under
        which it lies inside the tensor (and before a slice's limit)."""
        t = tensor.ttype
        ops, pos_of_tile = iter(idx_operands), iter(idx or ())
        positions, conds = [], []
        for ix, d in zip(op.index, t.shape):
            ext = c_extent(d)
            if ix.kind == "point":
                v = next(ops)
                p = f"(long long)({self.name(v)})"
                conds += self.bounds_tests(v, p, d, ext)
            elif ix.kind == "all":
                p = f"(long long)({next(pos_of_tile)})"
            else:  # a slice from v: its lower bound as v's (a tile position is nonnegative)
                v = next(ops)
                p = f"((long long)({self.name(v)}) + {next(pos_of_tile)})"
                conds += self.bounds_tests(v, p, None, ext)
                if ix.limit:
                    conds.append(f"{p} < (long long)({self.name(next(ops))})")
            positions.append(p)
        offset = ""
        for p, d in zip(positions, t.shape):
            offset = p if not offset else f"({offset} * {c_extent(d)} + {p})"
        if t.optional:
            conds.insert(0, f"{self.name(tensor)} != nullptr")
        return offset or "0", conds

    def emit_load(self, op: LoadOp) -> None:
        tensor, r = op.operands[0], op.result
        other = literal(op.other, r.ttype.dtype)

        def expr(idx):
            lane = self.lane_load(op, tensor, idx, other)
            if lane:
                return lane
            offset, conds = self.access(op, tensor, op.operands[1:], idx)
            value = f"{self.name(tensor)}[{offset}]"
            return f"(({' && '.join(conds)}) ? {value} : {other})" if conds else value

        if r.ttype.rank == 0:
            self.emit(f"const {C_TYPES[r.ttype.dtype]} {self.name(r)} = {expr(())};")
        elif self.early_loads and op in self.loop.body.ops and self.plan.storable(r) and self.reads_fixed_memory(op) \
                and any(map(self.plain_load, self.pending)):
            # a tile read late would be read from memory then, its latency in that phase: in
            # shared memory, it joins the loads stored together (flush_for), all in flight at once
            self.pending[r] = expr
        else:
            self.define(op, expr)

    def emit_store(self, op: StoreOp) -> None:
        value, tensor = op.operands[0], op.operands[1]
        joined = self.joins_last_store(op)  # in the phase of the store before it
        if tensor.ttype.optional:
            self.emit(f"if ({self.name(tensor)} != nullptr) {{")
            self.indent += 1
        if not joined:
            self.begin_phase()
        self.write_tensor(op, tensor, value)
        if tensor.ttype.optional:
            self.indent -= 1
            self.emit("}")
        self.close_store_phase(op, joined)

    # --- loops ----------------------------------------------------------------------------------
    def emit_for(self, op: ForOp) -> None:
        plan = column_loop(op) if self.column_registers else None
        if plan is not None:
            self.emit_column_for(op, plan)
            return
        lo, hi, step = (self.name(v) for v in op.operands[:3])
        args = op.body.args[1:]
        carried = {}
        for init, arg, res in zip(op.inits, args, op.results):
            if self.kind(arg) == "scalar":
                n = self.fresh("kfc_c")
                self.emit(f"{C_TYPES[arg.ttype.dtype]} {n} = {self.name(init)};")
                self.names[arg] = self.names[res] = n
            else:
                buf = self.store_tile(arg, lambda idx, init=init: self.elem(init, idx), source=init)
                carried[arg] = buf
        iv = self.name(op.body.args[0])
        loads, regs = self.begin_prefetched_loop(op)
        self.prefetched.update(loads)
        self.emit(f"for (long long {iv} = {lo}; {iv} < {hi}; {iv} += {step}) {{")
        self.indent += 1
        start = self.step + 1
        self.head_of_prefetched_iteration(op, loads, regs)
        for inner in op.body.ops[:-1]:
            self.emit_body_op(inner)
        fused = self.mma_into_carried(op.body.ops[-1], args, carried)
        self.flush_for(op.body.ops[-1].operands, keep=set(fused.values()))
        self.emit_yield(op.body.ops[-1], args, carried, fused)
        self.sync_scalar_reads()
        self.indent -= 1
        self.emit("}")
        self.arena.close_loop(start, self.step)
        for arg, res in zip(args, op.results):
            if arg in carried:
                self.buffers[res] = carried[arg]

    def emit_if(self, op: IfOp) -> None:
        """A branch on a scalar every thread holds alike: the whole CTA takes one side, so the
        barriers inside it are reached by all. A tile result is a buffer both sides write."""
        outs = {}
        for r in op.results:
            if self.kind(r) == "scalar":
                self.names[r] = self.fresh("kfc_b")
                self.emit(f"{C_TYPES[r.ttype.dtype]} {self.names[r]};")
            else:
                outs[r] = self.new_buffer(r)
        for side, region in zip(("if ({}) {{", "}} else {{"), op.regions):
            self.emit(side.format(self.name(op.operands[0])))
            self.indent += 1
            for inner in region.ops[:-1]:
                self.emit_body_op(inner)
            self.flush_for(region.ops[-1].operands)
            for r, y in zip(op.results, region.ops[-1].operands):
                if r in outs:
                    self.store_tile(r, lambda idx, y=y: self.elem(y, idx), outs[r], y)
                else:
                    self.emit(f"{self.names[r]} = {self.name(y)};")
            self.sync_scalar_reads()
            self.indent -= 1
        self.emit("}")

    def in_place(self, y: Value, a: Value, changing) -> bool:
        """Whether the carried tile a's next value y can be written into a's buffer as it is
        computed: y reads a only at the element it writes, and no other changing carried tile."""
        return y in self.inline and self.pointwise(y, a) and not any(self.touches(y, b) for b in changing - {a})

    def emit_yield(self, op: YieldOp, args, carried: dict[Value, Buffer], fused=None) -> None:
        """The next carried values: scalars through temporaries, tiles in place where the new
        value reads its carried buffer only at the element it writes, else through a copy;
        `fused` (kfc.codegen.tile_mma.mma_into_carried): tiles whose product is summed on
        tensor cores and written in place from the accumulators."""
        fused = fused or {}
        scalars = [(a, y) for a, y in zip(args, op.operands) if a not in carried]
        temps = []
        for a, y in scalars:
            t = self.fresh("kfc_y")
            self.emit(f"const {C_TYPES[a.ttype.dtype]} {t} = {self.name(y)};")
            temps.append((a, t))
        changing = {a for a, y in zip(args, op.operands) if a in carried and y is not a}
        copies = []
        for a, y in zip(args, op.operands):
            if a not in changing:
                continue
            if a in fused:
                self.pending.pop(fused[a])
                self.reopen_for(list(self.plan.owner[fused[a]].operands) + [y], in_place=(carried[a],))
                self.emit_mma_dot(self.plan.owner[fused[a]], into=(carried[a], self.inline[y], True))
                self.buffers[a] = carried[a]
            elif self.in_place(y, a, changing):
                self.store_tile(a, self.inline[y], carried[a], y)
            else:
                if y in self.inline:
                    self.store_tile(y, self.inline[y])
                copies.append((a, y))
        for a, y in copies:
            src = self.buffers[y]
            self.store_tile(a, lambda idx, src=src: src.at(idx), carried[a])
            self.arena.touch(src, self.step)
        for a, t in temps:
            self.emit(f"{self.names[a]} = {t};")
        for a in carried:
            self.buffers[a] = carried[a]

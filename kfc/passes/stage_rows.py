"""stage-rows: long rows of input travel through shared memory instead of living in registers.

Each row-indexed load of a whole row (`x[m, :]`, `dy[m, :]`) whose row is long enough (below)
becomes a bulk asynchronous copy into a shared-memory buffer, announced on one mbarrier
per row and waited for before the first read:

    %x = tile.load %X[%m, :]                %sx = gpu.smem_alloc : bf16[N] @shared
    ... reduce(%x) ...                      %b  = gpu.mbarrier_alloc {arrivals = 1}
    ... %x * %r ...                         gpu.expect_tx %b {bytes = 2N}
                                  ->        gpu.copy_async %X, %sx, %b, %m {index = [point, all]}
                                            gpu.mbarrier_wait %b
                                            %x1 = tile.load %sx[:]   ... reduce(%x1) ...
                                            %x2 = tile.load %sx[:]   ... %x2 * %r ...

Who copies the row is the option `copy`: `bulk` (the default) has one thread issue the CTA's
spans as bulk copies (cp.async.bulk) whose bytes complete the barrier's announced ones, as above;
`threads` has every thread copy its own chunks (cp.async) in a gpu.copy_async_arrive, each copy
an arrival of the barrier and nothing announced. Measured on the H200 neither wins everywhere
(bench/results/staging_copy_ab-20261202T1700Z.json): the factory chooses per shape.

Every stretch of the row program between two reductions reads the row again from shared
memory, so no thread keeps its share of the row in registers across a reduction: the code
generator then streams each stretch chunk by chunk, registers stay few, and more CTAs fit on an
SM (shared memory, not the register file, bounds them). The copy engine moves the row without
a thread issuing a load per vector.

A row read in two stretches (rmsnorm: the sum of squares, then the output) is staged from
`min_bytes` on; each further stretch multiplies that by EXTRA_STRETCH_FACTOR, since it reads
shared memory once more and recomputes what it needs (softmax and layernorm read the row three
times). Optional tensors and shorter rows keep their plain loads.

A program that issues many instructions for each byte it moves (row_cost: an IEEE division an
element, a scan) keeps its short rows in registers: re-reading them in each stretch would add to
what bounds it. Rows too long for a thread's registers (REGISTER_ROWS_ELEMS_PER_THREAD) leave
them whatever the stretches. Those the bulk copy cannot move are re-read (`reread`): each later stretch loads the
row again from global memory, where the first read left it in cache. That is a row whose byte
length is not a multiple of 16 (the copy's granule), or one that does not fit in shared memory
beside a loop's sums across rows (their accumulators take shared memory too: layernorm_bwd's dw
and db in f32 at rows of 262144, where one of its two rows is staged). Semantics do not change.
"""

from __future__ import annotations

import math

import attrs

from ..ir.core import Block, Value
from ..ir.func import FuncOp
from ..ir.gpu_ops import LaunchOp, row_dependent
from ..ir.smem_ops import BARRIER_TYPE, CopyAsyncArriveOp, CopyAsyncOp, ExpectTxOp, MbarrierAllocOp, MbarrierWaitOp
from ..ir.smem_ops import SmemAllocOp
from ..ir.tile_ops import BroadcastOp, CastOp, CmpOp, ConstOp, IotaOp, LoadOp, MaxSumExpOp, ReduceOp, UnaryOp, WhereOp
from ..ir.tile_ops import BinaryOp
from ..ir.types import MemSpace, TensorType
from ..model.target import LARGEST_CLUSTER, ROW_CTA_THREADS, ROW_KERNEL_STATIC_SMEM
from .base import Pass, PassError, define_pass, option
from .row_cost import ISSUE_HEAVY_PER_BYTE, bound_by_issue, keeps_in_registers
from .rows import find_row_loop, only_summed, row_length, with_loop_body

# The bulk copy moves multiples of 16 bytes between 16-byte-aligned addresses.
COPY_GRANULE = 16
# Rows shorter than this stay in registers. Measured on the H200 (bf16 rmsnorm, eager do_bench,
# M x N from 32768 x 4096 to 8192 x 262144; bench/results/stage_sweep-20261201T1352Z.json):
# staged rows beat register rows by 5-7% at rows of 8 to 32 KB and by 30-36% from 128 KB up;
# shorter rows were not measured staged.
DEFAULT_MIN_BYTES = 8 * 1024
# Softmax and layernorm (three stretches), staged from 8 KB on (bench/results/{softmax,layernorm}-
# staged-from-8KB-*.json against the register rows of the runs before): staged rows lost 5-20% at
# rows of 8 to 32 KB and won 6-40% from 64 KB up.
EXTRA_STRETCH_FACTOR = 8
# Rows leave registers, staged or re-read, whatever their stretches, where the row inputs' share
# of the largest tile (16 CTAs of 512 threads) passes this many elements a thread: layernorm_bwd_dx
# (four stretches, two rows, dw and db) spilled at rows of 200000 and 262143 in registers; at rows
# of 262143 (sm_90a ptxas) re-read rows take 32 (softmax_bwd) to 64 (rmsnorm_bwd) registers,
# register rows 92-128.
REGISTER_ROWS_ELEMS_PER_THREAD = 32
LARGEST_TILE_THREADS = ROW_CTA_THREADS * LARGEST_CLUSTER


def stretch_map(body) -> tuple[list, list[int], dict]:
    """The ops in the order they run, the stretch each runs in, and each value's stretch (a
    reduction's result is there from the stretch after its own). In program order each
    reduction of the row ends a stretch. Where that splits reductions that do not depend on each
    other (layernorm's backward: mean(g) and mean(g·x̂)), ops are ordered by dependence instead:
    a pure op runs in the stretch of its latest operand, a load or store no earlier than the ops
    the program wrote before it, stably, the terminator last; such reductions end one stretch."""
    in_order = _stretches(body, by_dependence=False)
    by_dependence = _stretches(body, by_dependence=True)
    fewer = max(by_dependence[2].values(), default=0) < max(in_order[2].values(), default=0)
    return by_dependence if fewer else in_order


def _stretches(body, by_dependence: bool) -> tuple[list, list[int], dict]:
    row_values = row_dependent(body)
    at: dict = {}
    placed = []
    latest = 0  # the stretch of the ops before, in program order
    for i, op in enumerate(body.ops):
        here = max((at.get(v, 0) for v in op.operands), default=0)
        if not by_dependence or not op.has_trait("pure"):
            here = max(here, latest)
        latest = max(latest, here)
        ends = isinstance(op, (ReduceOp, MaxSumExpOp)) and any(v in row_values for v in op.operands)
        for r in op.results:
            at[r] = here + ends
        if ends and not by_dependence:
            latest += 1
        placed.append((here, i, op))
    last = max((here for here, _, _ in placed), default=0)
    placed = [(last if op.has_trait("terminator") else here, i, op) for here, i, op in placed]
    placed.sort(key=lambda p: (p[2].has_trait("terminator"), p[0], p[1]))
    return [op for _, _, op in placed], [here for here, _, _ in placed], at


def stretches(body) -> int:
    """The stretches of the row program, the deepest chain of reductions plus the last: how
    often a staged row is read."""
    return 1 + max(stretch_map(body)[2].values(), default=0)


def threshold(min_bytes: int, reads: int) -> int:
    return min_bytes * EXTRA_STRETCH_FACTOR ** max(0, reads - 2)


def stageable(op, row_values: set, n: int) -> bool:
    """A load of one whole row of a global tensor, indexed by the row."""
    if not LoadOp.unrefined(op):  # a refined load (ptx.ld) is past staging
        return False
    t: TensorType = op.operands[0].ttype
    if t.space is not MemSpace.GLOBAL or t.optional or op.result.ttype.rank != 1:
        return False
    if [ix.kind for ix in op.index] != ["point"] * (t.rank - 1) + ["all"]:
        return False
    if not any(v in row_values for v in op.operands[1:]):
        return False  # a weight every row shares stays in cache, not in each CTA's shared memory
    return True


def copyable(op, n: int) -> bool:
    return (n * op.operands[0].ttype.dtype.itemsize) % COPY_GRANULE == 0


def row_bytes(op, n: int) -> int:
    return n * op.operands[0].ttype.dtype.itemsize


def room_for_rows(staged: list, n: int, sums: int, smem: int) -> list:
    """The staged rows that fit in a CTA's shared memory at the largest cluster beside `sums`
    f32 accumulators of the row's share; the longest rows give way first."""
    kept = sorted(staged, key=lambda op: -row_bytes(op, n))
    while kept and (sum(row_bytes(op, n) for op in kept) + 4 * sums * n) / LARGEST_CLUSTER + ROW_KERNEL_STATIC_SMEM > smem:
        kept.pop(0)
    return [op for op in staged if op in kept]


def _row_tile(v: Value) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.space is MemSpace.REG and t.rank >= 1


RECOMPUTABLE = (ConstOp, IotaOp, CastOp, UnaryOp, BinaryOp, CmpOp, WhereOp, BroadcastOp)


def _recomputable(op, row_values: set) -> bool:
    """An op whose result a later stretch may compute again instead of keeping it: elementwise
    arithmetic, or a load of data every row shares (a weight: it stays in cache)."""
    if isinstance(op, RECOMPUTABLE) and len(op.results) == 1 and not op.regions:
        return True
    return LoadOp.unrefined(op) and not any(v in row_values for v in op.operands[1:])


@define_pass("stage-rows",
             "copy long input rows into shared memory with bulk async copies; re-read them there",
             requires={"tma", "mbarrier"})
class StageRows(Pass):
    # rows read in two stretches are staged from this many bytes on (more stretches: see above)
    min_bytes: int = option(DEFAULT_MIN_BYTES, lo=0, hi=1 << 30)
    # rows too long for registers that cannot be staged are loaded again in each stretch (above)
    reread: bool = option(True, choices=(False, True))
    # who copies a row: `bulk`, one thread's bulk copies (cp.async.bulk) completing announced bytes;
    # `threads`, every thread its own 16 bytes at a time (cp.async), each copy an arrival
    copy: str = option("bulk", choices=("bulk", "threads"))
    # a program bound by issue (row_cost) keeps its short rows in `registers`, or has them staged
    # like any other (`stage`)
    heavy: str = option("registers", choices=("registers", "stage"))

    def copies(self, staged: list, n: int, buffers: dict) -> list:
        """The ops that copy each staged row into its buffer (recorded in `buffers`), every row
        on one barrier and one wait: after one announcement of their bytes (bulk), or with each
        copy an arrival (threads)."""
        loc = staged[0].loc
        bar = Value(BARRIER_TYPE, "bar")
        by_threads = self.copy == "threads"
        ops: list = [MbarrierAllocOp(results=(bar,), loc=loc, arrivals=len(staged) if by_threads else 1)]
        copies = []
        for op in staged:
            t = op.operands[0].ttype
            buf = Value(TensorType(t.dtype, (n,), MemSpace.SHARED), f"s_{op.operands[0].name or 'row'}")
            ops.append(SmemAllocOp(results=(buf,), loc=op.loc))
            kind = CopyAsyncArriveOp if by_threads else CopyAsyncOp
            copies.append(kind(operands=(op.operands[0], buf, bar, *op.operands[1:]), loc=op.loc, index=op.index))
            buffers[op.result] = buf
        if not by_threads:
            ops.append(ExpectTxOp(operands=(bar,), loc=loc, bytes=sum(row_bytes(op, n) for op in staged)))
        return ops + copies + [MbarrierWaitOp(operands=(bar,), loc=loc)]

    def run(self, func: FuncOp, ctx) -> FuncOp:
        if any(isinstance(op, LaunchOp) for op in func.body.ops):
            raise PassError("stage-rows runs on the row loop before tile maps it onto the GPU", func.loc,
                            "put stage-rows before tile in the pipeline, as the default pipeline does")
        loop = find_row_loop(func)
        n = row_length(loop, func)
        if only_summed(loop):
            # each row goes once from global memory into the adds: through shared memory it would
            # only take a detour (a column sum of 32768 x 16384 bf16 on the H200: 0.85 of the
            # copy bandwidth staged, 0.89 loaded straight into registers)
            return func
        body = loop.body
        row_values = row_dependent(body)
        reads = stretches(body)
        least = threshold(self.min_bytes, reads)
        rows = [op for op in body.ops if stageable(op, row_values, n)]
        # rows a thread cannot keep in registers across the reductions leave them whatever the stretches
        # (an odd row moves element by element, each with its own address and test: half as many fit)
        budget = REGISTER_ROWS_ELEMS_PER_THREAD // (2 if n % 2 else 1)
        too_many = reads > 1 and math.ceil(n / LARGEST_TILE_THREADS) * len(rows) > budget
        long_rows = [op for op in rows if too_many or row_bytes(op, n) >= least]
        if not long_rows or any(isinstance(op, SmemAllocOp) or op.regions for op in body.ops):
            return func  # already staged, or a for loop reads the row in chunks
        issue, moved, heavy = bound_by_issue(func, body, ctx)
        if self.heavy == "registers" and not too_many and all(keeps_in_registers(heavy, row_bytes(op, n))
                                                               for op in long_rows):
            # each stretch would read and convert the row again: bound by issue, it runs faster
            # from registers (row_cost)
            ctx.note(self, f"rows of {n} kept in registers: about {issue} instructions for the {moved} bytes an "
                           f"element moves (from {ISSUE_HEAVY_PER_BYTE:g} a byte, staged only where registers run out)")
            return func
        staged = room_for_rows([op for op in long_rows if copyable(op, n)], n, len(loop.results),
                               ctx.target.smem_per_block)
        reread = {op.result for op in long_rows if op not in staged} if self.reread and too_many else set()
        if not staged and not reread:
            return func

        # the copies start where the first staged load was (its index operands are defined by
        # then: every staged load's indices come before the first use of any staged row)
        ordered, runs, stretch_of = stretch_map(body)  # the ops by stretch; each op's and value's
        position = {id(op): i for i, op in enumerate(ordered)}
        defs = {r: op for op in body.ops for r in op.results}
        prologue: list = []
        buffers: dict[Value, Value] = {}
        start = -1
        if staged:
            prologue = self.copies(staged, n, buffers)
            first = min(position[id(op)] for op in staged)
            last_index_def = max((position[id(defs[v])] for op in staged for v in op.operands[1:] if v in defs),
                                 default=-1)
            start = max(first, last_index_def + 1)
            first_use = min(i for i, o in enumerate(ordered) if any(v in buffers for v in o.operands))
            if start > first_use:  # an index computed after a staged row is used: leave the rows as they are
                staged, buffers, prologue, start = [], {}, [], -1
                if not reread:
                    return func

        out: list = []
        made: dict[tuple[Value, int], Value] = {}    # (original, stretch) -> its value there

        def value_in(v: Value, k: int) -> Value:
            """v as stretch k reads it: a staged row is read again from shared memory, a row
            value of an earlier stretch is recomputed from such reads where it is elementwise."""
            if (v, k) in made:
                return made[(v, k)]
            if v in buffers:
                r = Value(v.type, v.name)
                out.append(LoadOp(operands=(buffers[v],), results=(r,), loc=defs[v].loc, index=(":",)))
            elif v in reread and stretch_of[v] != k:
                r = Value(v.type, v.name)
                out.append(attrs.evolve(defs[v], results=(r,)))
            elif not _row_tile(v) or stretch_of.get(v, k) == k or not _recomputable(defs[v], row_values):
                return v
            else:
                d = defs[v]
                r = Value(v.type, v.name)
                out.append(attrs.evolve(d, operands=tuple(value_in(o, k) for o in d.operands), results=(r,)))
            made[(v, k)] = r
            return r

        for i, op in enumerate(ordered):
            if i == start:
                out.extend(prologue)
            if op in staged:
                continue
            out.append(attrs.evolve(op, operands=tuple(value_in(v, runs[i]) for v in op.operands)))
        if staged:
            ctx.note(self, f"{len(staged)} row(s) of {n} staged through shared memory "
                           f"({sum(row_bytes(op, n) for op in staged)} bytes per row)")
        if reread:
            ctx.note(self, f"{len(reread)} row(s) of {n} re-read from global memory in each of {reads} stretches")
        return with_loop_body(func, loop, Block(body.args, tuple(out)))

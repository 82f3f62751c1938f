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

Every stretch of the row program between two reductions reads the row again from shared
memory, so no thread keeps its share of the row in registers across a reduction: the code
generator then streams each stretch chunk by chunk, registers stay few, and more CTAs fit on an
SM (shared memory, not the register file, bounds them). The copy engine moves the row without
a thread issuing a load per vector.

A row read in two stretches (rmsnorm: the sum of squares, then the output) is staged from
`min_bytes` on; each further stretch multiplies that by EXTRA_STRETCH_FACTOR, since it reads
shared memory once more and recomputes what it needs (softmax and layernorm read the row three
times). Rows whose byte length is not a multiple of 16 (the bulk copy's granule), optional
tensors and shorter rows keep their plain loads. Semantics do not change.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from ..ir.core import Block, Value
from ..ir.func import FuncOp
from ..ir.gpu_ops import LaunchOp, row_dependent
from ..ir.smem_ops import BARRIER_TYPE, CopyAsyncOp, ExpectTxOp, MbarrierAllocOp, MbarrierWaitOp, SmemAllocOp
from ..ir.tile_ops import BroadcastOp, CastOp, CmpOp, ConstOp, IotaOp, LoadOp, ReduceOp, UnaryOp, WhereOp
from ..ir.tile_ops import BinaryOp
from ..ir.types import MemSpace, TensorType
from .base import Pass, PassError, option, register_pass
from .rows import find_row_loop, row_length

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


def stretches(body) -> int:
    """How many stretches of the row program a reduction ends, plus the last: how often a
    staged row is read."""
    row_values = row_dependent(body)
    return 1 + sum(isinstance(op, ReduceOp) and any(v in row_values for v in op.operands) for op in body.ops)


def threshold(min_bytes: int, reads: int) -> int:
    return min_bytes * EXTRA_STRETCH_FACTOR ** max(0, reads - 2)


def stageable(op, row_values: set, n: int) -> bool:
    """A load of one whole row of a global tensor, indexed by the row."""
    if type(op) is not LoadOp:  # a refined load (ptx.ld) is past staging
        return False
    t: TensorType = op.operands[0].ttype
    if t.space is not MemSpace.GLOBAL or t.optional or op.result.ttype.rank != 1:
        return False
    if [ix.kind for ix in op.index] != ["point"] * (t.rank - 1) + ["all"]:
        return False
    if not any(v in row_values for v in op.operands[1:]):
        return False  # a weight every row shares stays in cache, not in each CTA's shared memory
    return (n * t.dtype.itemsize) % COPY_GRANULE == 0


def _row_tile(v: Value) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.space is MemSpace.REG and t.rank >= 1


RECOMPUTABLE = (ConstOp, IotaOp, CastOp, UnaryOp, BinaryOp, CmpOp, WhereOp, BroadcastOp)


def _recomputable(op, row_values: set) -> bool:
    """An op whose result a later stretch may compute again instead of keeping it: elementwise
    arithmetic, or a load of data every row shares (a weight: it stays in cache)."""
    if isinstance(op, RECOMPUTABLE) and len(op.results) == 1 and not op.regions:
        return True
    return type(op) is LoadOp and not any(v in row_values for v in op.operands[1:])


@register_pass
@attrs.frozen
class StageRows(Pass):
    NAME: ClassVar[str] = "stage-rows"
    SUMMARY: ClassVar[str] = "copy long input rows into shared memory with bulk async copies; re-read them there"
    REQUIRES: ClassVar[frozenset[str]] = frozenset({"tma", "mbarrier"})
    # rows read in two stretches are staged from this many bytes on (more stretches: see above)
    min_bytes: int = option(DEFAULT_MIN_BYTES, lo=0, hi=1 << 30)

    def run(self, func: FuncOp, ctx) -> FuncOp:
        if any(isinstance(op, LaunchOp) for op in func.body.ops):
            raise PassError("stage-rows runs on the row loop before tile maps it onto the GPU", func.loc,
                            "put stage-rows before tile in the pipeline, as the default pipeline does")
        loop = find_row_loop(func)
        n = row_length(loop, func)
        body = loop.body
        row_values = row_dependent(body)
        least = threshold(self.min_bytes, stretches(body))
        staged = [op for op in body.ops if stageable(op, row_values, n)
                  and n * op.operands[0].ttype.dtype.itemsize >= least]
        if not staged or any(isinstance(op, SmemAllocOp) for op in body.ops):
            return func

        # every staged row lands on one barrier: one announcement, one wait
        loc = staged[0].loc
        bar = Value(BARRIER_TYPE, "bar")
        prologue: list = [MbarrierAllocOp(results=(bar,), loc=loc, arrivals=1)]
        buffers: dict[Value, Value] = {}
        copies = []
        for op in staged:
            t = op.operands[0].ttype
            buf = Value(TensorType(t.dtype, (n,), MemSpace.SHARED), f"s_{op.operands[0].name or 'row'}")
            prologue.append(SmemAllocOp(results=(buf,), loc=op.loc))
            copies.append(CopyAsyncOp(operands=(op.operands[0], buf, bar, *op.operands[1:]), loc=op.loc,
                                      index=op.index))
            buffers[op.result] = buf
        total = sum(n * op.operands[0].ttype.dtype.itemsize for op in staged)
        prologue.append(ExpectTxOp(operands=(bar,), loc=loc, bytes=total))

        # the copies start where the first staged load was (its index operands are defined by
        # then: every staged load's indices come before the first use of any staged row)
        position = {id(op): i for i, op in enumerate(body.ops)}
        defs = {r: op for op in body.ops for r in op.results}
        first = min(position[id(op)] for op in staged)
        last_index_def = max((position[id(defs[v])] for op in staged for v in op.operands[1:] if v in defs),
                             default=-1)
        start = max(first, last_index_def + 1)
        first_use = min(i for i, o in enumerate(body.ops) if any(v in buffers for v in o.operands))
        if start > first_use:
            return func  # an index computed after a staged row is used: leave this loop alone

        out: list = []
        stretch = 0                                  # reductions passed so far
        stretch_of: dict[Value, int] = {}            # each original row value's stretch
        made: dict[tuple[Value, int], Value] = {}    # (original, stretch) -> its value there

        def value_in(v: Value, k: int) -> Value:
            """v as stretch k reads it: a staged row is read again from shared memory, a row
            value of an earlier stretch is recomputed from such reads where it is elementwise."""
            if (v, k) in made:
                return made[(v, k)]
            if v in buffers:
                r = Value(v.type, v.name)
                out.append(LoadOp(operands=(buffers[v],), results=(r,), loc=defs[v].loc, index=(":",)))
            elif not _row_tile(v) or stretch_of.get(v, k) == k or not _recomputable(defs[v], row_values):
                return v
            else:
                d = defs[v]
                r = Value(v.type, v.name)
                out.append(attrs.evolve(d, operands=tuple(value_in(o, k) for o in d.operands), results=(r,)))
            made[(v, k)] = r
            return r

        for i, op in enumerate(body.ops):
            if i == start:
                out.extend(prologue)
                out.extend(copies)
                out.append(MbarrierWaitOp(operands=(bar,), loc=loc))
            if op in staged:
                continue
            new = attrs.evolve(op, operands=tuple(value_in(v, stretch) for v in op.operands))
            out.append(new)
            for r in op.results:
                stretch_of[r] = stretch
            if isinstance(op, ReduceOp):
                stretch += 1
        ctx.note(self, f"{len(staged)} row(s) of {n} staged through shared memory ({total} bytes per row)")
        new_loop = attrs.evolve(loop, regions=(Block(body.args, tuple(out)),))
        ops = tuple(new_loop if o is loop else o for o in func.body.ops)
        return attrs.evolve(func, regions=(Block(func.body.args, ops),))

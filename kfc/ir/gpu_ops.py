"""The `gpu` dialect: how a row program maps onto the machine.

`gpu.launch` replaces the row loop: same semantics (independent iterations over rows), plus the
mapping — rows per CTA, threads per row, elements per vector access, CTAs per cluster, and
whether the grid is persistent. Row tiles inside it carry a `#row` layout:

    f32[4096] #row<threads = 256, vec = 8, cluster = 1>

element j of a row lives in thread g = (j // vec) % (threads · cluster) of the row's thread
group (g = cluster rank · threads + thread), at position ((j // vec) // (threads · cluster),
j % vec) of that thread's registers.

Reductions over a row lower into all-reduce steps on per-thread values, shape [threads ·
cluster] with a `#lanes` layout; each step has exact numpy semantics (same order of operations
as the generated code), so the interpreter checks the lowering bit for bit:

    gpu.thread_reduce   row -> lanes: each thread reduces its own elements in index order
    gpu.warp_reduce     xor butterfly over groups of `width` lanes: every lane gets its group's total
    gpu.cta_reduce      one value per warp through shared memory, summed in warp order
    gpu.cluster_reduce  one value per CTA through distributed shared memory, summed in rank order
    gpu.uniform         lanes that all hold the same value -> that scalar
"""

from __future__ import annotations

import attrs
import numpy as np

from ..diagnostics import InterpretError
from . import layouts
from ..model.target import LARGEST_CLUSTER, SM_THREADS
from .core import Op, define_op
from .dtypes import DType
from .tile_ops import ReduceKind, verify_loop_reductions
from .tile_ops.checks import check_int_scalar, check_operands, check_results, tensor_of
from .types import Layout, TensorType


def row_dependent(body) -> set:
    """The row index (a row loop's region argument) and every value computed from it, before
    or after `tile` maps the loop, inside nested loops too: a `for` whose bounds or carried
    values depend on the row has its index, carried values and results depend on it."""
    values = {body.args[0]}

    def visit(block) -> None:
        for op in block.ops:
            for region in op.regions:
                visit(region)
            yielded = [v for r in op.regions if r.ops for v in r.ops[-1].operands]
            if any(v in values for v in (*op.operands, *yielded)):
                values.update(op.results)
                for region in op.regions:
                    values.update(region.args)

    size = -1
    while size != len(values):  # carried values: until nothing more depends on the row
        size = len(values)
        visit(body)
    return values


def check_layouts(body, threads: int, vec: int, cluster: int) -> None:
    """Every tile inside a launch's body whose layout is one of the layout core's kinds asks of
    the launch only what it gives (a #row its threads, vec and cluster; an MMA layout whole
    warpgroups): the code generator maps tiles by the launch, so a layout that disagrees would be
    silently wrong."""
    def walk(block):
        for op in block.ops:
            for v in (*op.results, *(a for r in op.regions for a in r.args)):
                layout = getattr(v.type, "layout", None)
                if layout is None or layout.kind not in layouts.KINDS:
                    continue
                try:
                    problem = layouts.disagreement(layout, threads, vec, cluster)
                except ValueError as e:
                    raise op.error(f"its result {v.type}: {e}") from None
                if problem:
                    raise op.error(f"its result {v.type} says {problem}")
            for r in op.regions:
                walk(r)

    walk(body)


def row_layout(threads: int, vec: int, cluster: int) -> Layout:
    return layouts.Blocked1D(threads, vec, cluster).as_layout()


def lanes_layout(threads: int, cluster: int) -> Layout:
    return layouts.Lanes(threads, cluster).as_layout()


@define_op("gpu.launch", traits={"loop"}, operands=2)
class LaunchOp(Op):
    """Rows lo..hi mapped onto a grid; the region's one argument is the row index. Results, as
    for tile.parallel, are sums across the rows of what each row yields."""

    rows_per_cta: int = 1
    threads: int = 128          # threads per row
    vec: int = 8                # elements per thread per access
    cluster: int = 1            # CTAs per row (a cluster)
    persistent: bool = False    # a grid of about one wave that strides over the rows
    reduce: tuple[str, ...] = attrs.field(default=(), converter=tuple)  # results: sums across rows
    # where each thread keeps its part of those sums between rows: "registers", or "shared"
    # memory (its own words, no barrier) when registers are short
    sums_in: str = "registers"
    # CTAs that must fit on an SM at once (0: no demand): the code generator passes it to the
    # compiler as __launch_bounds__' minimum, which caps the registers a thread may take
    min_ctas_per_sm: int = 0

    @property
    def body(self):
        return self.regions[0]

    @property
    def block_threads(self) -> int:
        return self.rows_per_cta * self.threads

    def row_dependent_values(self) -> set:
        """Values computed from the row index (loads and stores that use them stream through
        memory once; the others are re-read by every row)."""
        return row_dependent(self.body)

    def verify_(self) -> None:
        if len(self.regions) != 1 or len(self.body.args) != 1:
            raise self.error("needs one region with one argument, the row index")
        verify_loop_reductions(self, self.body)
        if self.sums_in not in ("registers", "shared"):
            raise self.error(f"sums_in must be \"registers\" or \"shared\", not {self.sums_in!r}")
        if self.results and not self.persistent:
            raise self.error("a launch whose results sum across rows must be persistent: each CTA's rows add into "
                             "one partial per row slot, and a grid of a CTA per row batch would leave as many "
                             "partials as rows")
        for v in self.operands:
            check_int_scalar(self, v, "bound")
        if len(self.regions) != 1 or len(self.body.args) != 1:
            raise self.error("needs one region with one argument, the row index")
        if self.body.args[0].type != TensorType(DType.INDEX):
            raise self.error("the row index must be index")
        if self.threads < 1 or self.threads & (self.threads - 1):
            raise self.error(f"threads per row must be a power of two, not {self.threads}")
        if self.threads > 1024 or self.block_threads > 1024:
            raise self.error(f"{self.rows_per_cta} rows x {self.threads} threads exceeds 1024 threads per CTA")
        if self.threads < 32 and (self.block_threads % 32 or self.cluster > 1):
            raise self.error(f"rows of {self.threads} threads must pack whole warps: rows_per_cta x threads "
                             f"({self.block_threads}) must be a multiple of 32, in one CTA")
        if self.vec not in (1, 2, 4, 8, 16):
            raise self.error(f"vec must be 1, 2, 4, 8 or 16 elements, not {self.vec}")
        if self.cluster < 1 or self.cluster > LARGEST_CLUSTER or self.cluster & (self.cluster - 1):
            raise self.error(f"cluster must be a power of two up to {LARGEST_CLUSTER}, not {self.cluster}")
        if self.cluster > 1 and self.rows_per_cta != 1:
            raise self.error("a row split across a cluster takes the whole CTA: rows_per_cta must be 1")
        if self.rows_per_cta < 1:
            raise self.error("rows_per_cta must be positive")
        if self.min_ctas_per_sm < 0 or self.min_ctas_per_sm * self.block_threads > SM_THREADS:
            raise self.error(f"min_ctas_per_sm={self.min_ctas_per_sm} CTAs of {self.block_threads} threads do not fit "
                             f"the {SM_THREADS} threads of an SM")
        self._check_layouts()

    def _check_layouts(self) -> None:
        check_layouts(self.body, self.threads, self.vec, self.cluster)

    def interpret(self, interp, ins, env):
        body = self.body
        acc = interp.loop_accumulators(self)
        for i in range(int(ins[0]), int(ins[1])):
            env[body.args[0]] = np.asarray(i, dtype=np.int64)
            interp.accumulate(self, acc, interp.exec_iteration(body, env))
        return acc or None


# The interpreter's semantics of the reduction steps below (their `interpret` methods) follow
# the generated code's order of operations exactly, so the interpreter checks the lowering.
def combine(kind: str):
    return {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[kind]


def identity(kind: str) -> float:
    return {"sum": 0.0, "prod": 1.0, "max": -np.inf, "min": np.inf}[kind]


def combine_pairs(m1, s1, m2, s2):
    """Two (max, sum of exp(x - max)) pairs as one, as the code generator combines them."""
    with np.errstate(all="ignore"):
        big = np.maximum(m1, m2)  # NaN-propagating, as max.NaN
        at = np.where(big == -np.inf, np.float32(0), big)  # lanes without elements add nothing
        s = s1 * np.exp((m1 - at).astype(np.float32)) + s2 * np.exp((m2 - at).astype(np.float32))
    return big.astype(np.float32), s.astype(np.float32)


class _LaneReduce(Op):
    """Shared checks: lanes in, lanes out, same dtype."""

    def _same_lanes(self) -> TensorType:
        """An all-reduce step: one #lanes operand, a result of the same type."""
        a, r = self._lanes()
        if a != r:
            raise self.error(f"keeps its type: {a} became {r}")
        return a

    def _lanes(self, n_operands: int = 1):
        check_operands(self, n_operands)
        check_results(self, 1)
        a = tensor_of(self, self.operands[0], "operand")
        r = tensor_of(self, self.result, "result")
        if r.rank != 1 or r.layout is None or r.layout.kind != "lanes":
            raise self.error(f"result must be a 1-D #lanes tile, not {r}")
        if a.dtype != r.dtype:
            raise self.error(f"dtype changes from {a.dtype} to {r.dtype}")
        return a, r


@define_op("gpu.thread_reduce", traits={"pure"})
class ThreadReduceOp(_LaneReduce):
    """Each thread reduces its elements in index order; with map="mul" the two operands'
    products are summed as they are formed (acc = fma(a, b, acc))."""

    kind: ReduceKind = attrs.field(converter=ReduceKind)
    map: str = ""

    def verify_(self) -> None:
        if self.map not in ("", "mul"):
            raise self.error(f"map must be \"\" or \"mul\", not {self.map!r}")
        if self.map == "mul" and self.kind is not ReduceKind.SUM:
            raise self.error("a fused product only feeds a sum")
        a, r = self._lanes(2 if self.map else 1)
        if self.map and self.operands[1].type != a:
            raise self.error(f"the product's operands differ: {a} and {self.operands[1].type}")
        if a.rank != 1 or a.layout is None or a.layout.kind != "row":
            raise self.error(f"operand must be a 1-D #row tile, not {a}")
        p = a.layout.get("threads") * a.layout.get("cluster")
        if r.shape != (p,) or r.layout != lanes_layout(a.layout.get("threads"), a.layout.get("cluster")):
            raise self.error(f"result must be {a.dtype}[{p}] with the row's lanes layout")
        if self.kind is ReduceKind.MEAN:
            raise self.error("lower mean to sum and a multiply first")

    def interpret(self, interp, ins, env):
        row = layouts.of(self.operands[0].ttype.layout)
        p, v = row.lanes, row.vec
        n = ins[0].shape[0]
        e = row.chunks(n)
        kind = self.kind.value
        per_thread = row.per_lane  # [thread, its elements in order]

        valid = per_thread(np.ones(n, dtype=np.float32), 0.0) > 0
        acc = np.full(p, identity(kind), dtype=np.float32)
        if self.map == "mul":
            a, b = per_thread(ins[0], 0.0), per_thread(ins[1], 0.0)
            for i in range(e * v):  # acc = fma(a, b, acc): one rounding, as __fmaf_rn
                fused = (a[:, i].astype(np.float64) * b[:, i] + acc).astype(np.float32)
                acc = np.where(valid[:, i], fused, acc)
        else:
            x = per_thread(ins[0], identity(kind))
            f = combine(kind)
            for i in range(e * v):
                acc = np.where(valid[:, i], f(acc, x[:, i]), acc).astype(np.float32)
        return [acc]


@define_op("gpu.warp_reduce", traits={"pure"})
class WarpReduceOp(_LaneReduce):
    kind: ReduceKind = attrs.field(converter=ReduceKind)
    width: int = 32

    def verify_(self) -> None:
        self._same_lanes()
        if self.width not in (2, 4, 8, 16, 32):
            raise self.error(f"width must be 2..32 and a power of two, not {self.width}")

    def interpret(self, interp, ins, env):
        x = ins[0].astype(np.float32)
        f = combine(self.kind.value)
        idx = np.arange(x.shape[0])
        k = self.width // 2
        while k >= 1:  # the xor butterfly of shfl.sync.bfly
            x = f(x, x[idx ^ k]).astype(np.float32)
            k //= 2
        return [x]


@define_op("gpu.cta_reduce", traits={"pure"})
class CtaReduceOp(_LaneReduce):
    kind: ReduceKind = attrs.field(converter=ReduceKind)

    def verify_(self) -> None:
        a = self._same_lanes()
        if a.layout.get("threads") <= 32:
            raise self.error("a row of at most 32 threads needs no CTA step")

    def interpret(self, interp, ins, env):
        lanes = layouts.of(self.operands[0].ttype.layout)
        t = lanes.threads
        x = lanes.per_cta(ins[0]).reshape(lanes.cluster, t // 32, 32)[:, :, 0]  # lane 0 of each warp, per CTA
        f = combine(self.kind.value)
        acc = x[:, 0]
        for w in range(1, t // 32):  # read back from shared memory in warp order
            acc = f(acc, x[:, w]).astype(np.float32)
        return [np.repeat(acc, t).astype(np.float32)]


@define_op("gpu.cluster_reduce", traits={"pure"})
class ClusterReduceOp(_LaneReduce):
    kind: ReduceKind = attrs.field(converter=ReduceKind)

    def verify_(self) -> None:
        a = self._same_lanes()
        if a.layout.get("cluster") <= 1:
            raise self.error("a row held by one CTA needs no cluster step")

    def interpret(self, interp, ins, env):
        lanes = layouts.of(self.operands[0].ttype.layout)
        t, c = lanes.threads, lanes.cluster
        x = lanes.per_cta(ins[0])[:, 0]
        f = combine(self.kind.value)
        acc = x[0]
        for r in range(1, c):  # the slots in cluster-rank order
            acc = f(acc, x[r])
        return [np.full(c * t, acc, dtype=np.float32)]


@attrs.frozen(eq=False, kw_only=True)
class _MaxSumExp(Op):
    """A row's (maximum, sum of exp(x - maximum)) pairs, one per lane: the steps of
    tile.max_sumexp. Pairs combine as (M, s1·e^(m1−M) + s2·e^(m2−M)), M = max(m1, m2), an
    exponent of a maximum of −inf taken as 0 so that lanes without elements add nothing.
    With `approx` (lower-ptx) the exponentials are ex2.approx of the difference times log2 e."""

    approx: bool = False

    def _pair(self, n_operands: int) -> TensorType:
        check_operands(self, n_operands)
        check_results(self, 2)
        r = tensor_of(self, self.results[0], "maximum")
        if r.rank != 1 or r.layout is None or r.layout.kind != "lanes" or r.dtype is not DType.F32:
            raise self.error(f"the maximum must be an f32 #lanes tile, not {r}")
        if self.results[1].type != r:
            raise self.error(f"the sum must have the maximum's type {r}, not {self.results[1].type}")
        return r

    def _same_pairs(self) -> TensorType:
        r = self._pair(2)
        if any(v.type != r for v in self.operands):
            raise self.error(f"keeps its type: ({self.operands[0].type}, {self.operands[1].type}) became {r}")
        return r


@define_op("gpu.thread_max_sumexp", traits={"pure"})
class ThreadMaxSumExpOp(_MaxSumExp):
    """Each thread's pair over its own elements, chunk by chunk in index order."""

    def verify_(self) -> None:
        r = self._pair(1)
        a = tensor_of(self, self.operands[0], "operand")
        if a.rank != 1 or a.layout is None or a.layout.kind != "row" or a.dtype is not DType.F32:
            raise self.error(f"operand must be a 1-D f32 #row tile, not {a}")
        p = a.layout.get("threads") * a.layout.get("cluster")
        if r.shape != (p,) or r.layout != lanes_layout(a.layout.get("threads"), a.layout.get("cluster")):
            raise self.error(f"results must be f32[{p}] with the row's lanes layout")

    def interpret(self, interp, ins, env):
        row = layouts.of(self.operands[0].ttype.layout)
        n = ins[0].shape[0]
        valid = row.per_lane(np.ones(n, dtype=np.float32), 0.0) > 0
        x = row.per_lane(ins[0].astype(np.float32), -np.inf)
        with np.errstate(all="ignore"):
            m = np.where(valid, x, -np.inf).max(axis=1).astype(np.float32)
            at = np.where(m == -np.inf, np.float32(0), m)
            s = np.where(valid, np.exp((x - at[:, None]).astype(np.float32)), 0).sum(axis=1, dtype=np.float32)
        return [m, s]


@define_op("gpu.warp_max_sumexp", traits={"pure"})
class WarpMaxSumExpOp(_MaxSumExp):
    width: int = 32

    def verify_(self) -> None:
        self._same_pairs()
        if self.width not in (2, 4, 8, 16, 32):
            raise self.error(f"width must be 2..32 and a power of two, not {self.width}")

    def interpret(self, interp, ins, env):
        m, s = (v.astype(np.float32) for v in ins)
        idx = np.arange(m.shape[0])
        k = self.width // 2
        while k >= 1:  # the xor butterfly of shfl.sync.bfly, both values
            m, s = combine_pairs(m, s, m[idx ^ k], s[idx ^ k])
            k //= 2
        return [m, s]


@define_op("gpu.cta_max_sumexp", traits={"pure"})
class CtaMaxSumExpOp(_MaxSumExp):
    def verify_(self) -> None:
        if self._same_pairs().layout.get("threads") <= 32:
            raise self.error("a row of at most 32 threads needs no CTA step")

    def interpret(self, interp, ins, env):
        lanes = layouts.of(self.operands[0].ttype.layout)
        t = lanes.threads
        m, s = (lanes.per_cta(v).reshape(lanes.cluster, t // 32, 32)[:, :, 0] for v in ins)
        am, as_ = m[:, 0], s[:, 0]
        for w in range(1, t // 32):  # warp order
            am, as_ = combine_pairs(am, as_, m[:, w], s[:, w])
        return [np.repeat(am, t).astype(np.float32), np.repeat(as_, t).astype(np.float32)]


@define_op("gpu.cluster_max_sumexp", traits={"pure"})
class ClusterMaxSumExpOp(_MaxSumExp):
    def verify_(self) -> None:
        if self._same_pairs().layout.get("cluster") <= 1:
            raise self.error("a row held by one CTA needs no cluster step")

    def interpret(self, interp, ins, env):
        lanes = layouts.of(self.operands[0].ttype.layout)
        t, c = lanes.threads, lanes.cluster
        m, s = (lanes.per_cta(v)[:, 0] for v in ins)
        am, as_ = m[:1], s[:1]
        for r in range(1, c):  # cluster-rank order
            am, as_ = combine_pairs(am, as_, m[r:r + 1], s[r:r + 1])
        return [np.full(c * t, am[0], dtype=np.float32), np.full(c * t, as_[0], dtype=np.float32)]


MAX_SUMEXP_STEPS = (ThreadMaxSumExpOp, WarpMaxSumExpOp, CtaMaxSumExpOp, ClusterMaxSumExpOp)


@define_op("gpu.uniform", traits={"pure"}, operands=1, results=1)
class UniformOp(Op):
    """Lanes that all hold one value, as that scalar."""

    def verify_(self) -> None:
        a = tensor_of(self, self.operands[0], "operand")
        r = tensor_of(self, self.result, "result")
        if a.layout is None or a.layout.kind != "lanes":
            raise self.error(f"operand must be a #lanes tile, not {a}")
        if r != TensorType(a.dtype):
            raise self.error(f"result must be the scalar {a.dtype}, not {r}")

    def interpret(self, interp, ins, env):
        x = ins[0]
        if not (np.all(x == x[0]) or np.all(np.isnan(x))):
            raise InterpretError("gpu.uniform: the lanes hold different values; the reduction steps above do "
                                 "not reach every lane", self.loc)
        return [np.asarray(x[0]).astype(self.result.ttype.dtype.np)]

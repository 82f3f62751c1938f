"""chunk-rows: a long row that must stay in one CTA (it holds a scan) is read in chunks by
sequential for loops that carry each scan's running value and each reduction's partial result.

A scan's carries cross the CTA's warps, so a scanned row takes no cluster, and one CTA's
registers hold rows of at most 1024 x 128 elements (fewer before they spill). Chunked, the
row program makes one sweep over the row per chain of reductions, each sweep a loop over
chunks of `chunk` elements:

    xr = f32(x[m, :])                          run = 0.0
    y[m, :] = cumsum(xr)              ->        for k in 0..N step C carry (run) {
    s = sum(xr)                                   xr = f32(x[m, k:k+C])
                                                  y[m, k:k+C] = cumsum(xr) + run
                                                  run = run + sum(where(k + iota(C) < N, xr, 0))
                                                  s = s + ...   (a carried partial sum too)
                                                }

Scans combine their chunk's scan with the carry (sum, prod, max, min); reductions combine
their chunk's reduction into an accumulator, a mean dividing by N after the loop. A sweep that
holds a reverse scan visits the chunks from the row's end. Whatever needs a reduction's result
runs in a later sweep, which reads (and recomputes) the row again. Lanes past the row's end in
the last chunk read as the load's `other` and are not stored; where they could reach a result
(a reduction, a reverse scan) they are replaced by the reduction's identity. Low-precision
floats are scanned and summed in f32, as the unchunked ops accumulate.

Programs this does not fit are left as they are, with a note: a row program with its own for
loops or branches, sums across rows, a tensor both read and written, a tensor written twice,
a value that needs a forward and a reverse scan in one sweep.
"""

from __future__ import annotations

import attrs

from ..ir.builder import Builder
from ..ir.core import Block, Op, Value
from ..ir.dtypes import DType
from ..ir.func import FuncOp
from ..ir.tile_ops import (
    BinaryOp, BitcastOp, BroadcastOp, CastOp, CmpOp, ConstOp, ForOp, IfOp, IndexDim, IotaOp, LoadOp, ReduceKind,
    ReduceOp, ScanOp, StoreOp, UnaryOp, WhereOp, YieldOp,
)
from ..ir.tile_ops.reductions import identity
from ..ir.types import TensorType
from .base import Pass, define_pass, option
from .rows import find_row_loop, row_length, with_loop_body

ELEMENTWISE = (UnaryOp, BinaryOp, CmpOp, WhereOp, CastOp, BitcastOp)
# how a chunk's scan or reduction joins the carried value, by kind
COMBINE = {ReduceKind.SUM: "add", ReduceKind.MEAN: "add", ReduceKind.PROD: "mul", ReduceKind.MAX: "max",
           ReduceKind.MIN: "min"}
# Rows of 32768 elements and more spill in one CTA's registers when scanned (examples/scans.kfc,
# sm_90a); shorter rows keep the one-sweep form.
DEFAULT_MIN_ROW = 32768


class NotChunked(Exception):
    """Why a row program is left as it is."""


def wide_dtype(kind: ReduceKind, dtype: DType) -> DType:
    """The dtype a chunked scan or reduction carries: f32 for sums and products of narrower
    floats (the unchunked ops accumulate in f32 too), else the operand's own."""
    if dtype.is_float and dtype.bits < 32 and kind in (ReduceKind.SUM, ReduceKind.MEAN, ReduceKind.PROD):
        return DType.F32
    return dtype


@attrs.define
class Sweeps:
    """Where each op of a straight row body runs: the sweep (0, 1, ...) that computes a row
    value or feeds a sink, the scalars' readiness (the sweeps done before they exist), and the
    scan directions each row value depends on."""

    n: int
    sweep: dict = attrs.Factory(dict)       # row value -> earliest sweep
    ready: dict = attrs.Factory(dict)       # scalar value (body-defined) -> sweeps before it
    directions: dict = attrs.Factory(dict)  # row value -> {"forward", "reverse"}
    defs: dict = attrs.Factory(dict)        # value -> the body op defining it

    def is_row(self, v: Value) -> bool:
        t = v.type
        return isinstance(t, TensorType) and t.rank == 1 and t.shape[0] == self.n

    def of(self, v: Value) -> int:
        return self.sweep.get(v, self.ready.get(v, 0))

    def sink_sweep(self, op: Op) -> int:
        return max((self.of(v) for v in op.operands), default=0)

    def place(self, ops) -> None:
        for op in ops:
            self.defs.update((r, op) for r in op.results)
            rows = [v for v in op.operands if self.is_row(v)]
            at = max((self.of(v) for v in op.operands), default=0)
            if isinstance(op, ReduceOp):
                self.ready[op.result] = at + 1
                continue
            dirs = set().union(*(self.directions.get(v, set()) for v in rows))
            if isinstance(op, ScanOp):
                dirs |= {"reverse" if op.reverse else "forward"}
            for r in op.results:
                if self.is_row(r):
                    self.sweep[r], self.directions[r] = at, dirs
                else:
                    self.ready[r] = at


def check_body(ops, sweeps: Sweeps) -> None:
    """Raise NotChunked where a row body holds what chunking does not handle."""
    loaded, stored = set(), []
    for op in ops:
        if isinstance(op, (ForOp, IfOp)) or op.regions:
            raise NotChunked(f"it holds a {op.NAME}")
        if isinstance(op, YieldOp):
            raise NotChunked("it adds rows into sums across rows")
        if isinstance(op, LoadOp):
            loaded.add(op.operands[0])
        if isinstance(op, StoreOp):
            stored.append(op.operands[1])
        rowish = any(sweeps.is_row(v) for v in (*op.operands, *op.results))
        if not rowish:
            continue
        if isinstance(op, (LoadOp, StoreOp)):
            if [ix.kind for ix in op.index].count("all") != 1 or any(ix.kind == "slice" for ix in op.index):
                raise NotChunked(f"{op.NAME} at {op.loc} does not address one whole row")
        elif isinstance(op, BroadcastOp):
            if op.operands[0].ttype.rank:
                raise NotChunked(f"a broadcast of a tile at {op.loc}")
        elif isinstance(op, ScanOp):
            if not (op.operands[0].ttype.dtype.is_float or op.operands[0].ttype.dtype.is_int):
                raise NotChunked(f"a scan of {op.operands[0].ttype.dtype} at {op.loc}")
        elif isinstance(op, ReduceOp):
            if op.keepdims:
                raise NotChunked(f"a reduction with keepdims at {op.loc}")
        elif not isinstance(op, (ConstOp, IotaOp, *ELEMENTWISE)):
            raise NotChunked(f"{op.NAME} at {op.loc} on a row")
    if loaded & set(stored):
        raise NotChunked("a tensor is both read and written: chunks would reorder the reads and writes")
    if len(set(stored)) != len(stored):
        raise NotChunked("a tensor is written twice: chunks would reorder the writes")


@define_pass("chunk-rows", "a long row with a scan runs in chunks: for loops carrying the scans' and reductions' values")
class ChunkRows(Pass):
    chunk: int = option(4096, lo=256, hi=65536, pow2=True)
    min_row: int = option(DEFAULT_MIN_ROW, lo=0)  # rows of at least this many elements are chunked

    def run(self, func: FuncOp, ctx) -> FuncOp:
        loop = find_row_loop(func)
        body = loop.body.ops
        if not any(isinstance(op, ScanOp) for op in body) or any(op.regions for op in body):
            return func  # rows without a scan take a cluster; rows with loops or branches are the user's
        n = row_length(loop, func)
        if n < max(self.min_row, self.chunk + 1):
            return func
        sweeps = Sweeps(n)
        try:
            check_body(body, sweeps)
            sweeps.place(body)
            ops = Chunker(self.chunk, sweeps).build(body)
        except NotChunked as why:
            ctx.note(self, f"row {n} left whole: {why}")
            return func
        ctx.note(self, f"row {n} in chunks of {self.chunk}: {sum(isinstance(op, ForOp) for op in ops)} sweep(s)")
        if any(op.operands[0].ttype.dtype.is_float for op in body if isinstance(op, (ScanOp, ReduceOp))):
            ctx.approximated(self, "scans and reductions of floats combined chunk by chunk: another order of "
                                   "addition", loop.loc)
        return with_loop_body(func, loop, Block(loop.body.args, tuple(ops)))


class Chunker:
    """Builds the chunked row body: scalars in program order where they become ready, a loop
    per sweep and direction between."""

    def __init__(self, chunk: int, sweeps: Sweeps) -> None:
        self.c, self.sweeps, self.n, self.defs = chunk, sweeps, sweeps.n, sweeps.defs
        self.b = Builder()
        self.outer: dict[Value, Value] = {}  # scalars built outside the loops (reductions' finals)

    def build(self, body) -> list[Op]:
        sw = self.sweeps
        sinks = [op for op in body if isinstance(op, ReduceOp) or isinstance(op, StoreOp) and sw.is_row(op.operands[0])]
        last = max((sw.sink_sweep(op) for op in sinks), default=0)
        with self.b.region() as out:
            for p in range(last + 2):
                for op in body:  # the scalar work that becomes ready now, in program order
                    if op not in sinks and not any(sw.is_row(v) for v in (*op.operands, *op.results)) \
                            and sw.sink_sweep(op) == p:
                        self.scalar(op)
                if p > last:
                    break
                here = [op for op in sinks if sw.sink_sweep(op) == p]
                backward = [op for op in here if "reverse" in sw.directions.get(op.operands[0], set())]
                forward = [op for op in here if op not in backward]
                if any("forward" in sw.directions.get(op.operands[0], set()) for op in backward):
                    raise NotChunked("a value needs both a forward and a reverse scan of the row")
                if backward and not any("forward" in sw.directions.get(op.operands[0], set()) for op in forward):
                    backward, forward = backward + forward, []  # undirected sinks ride the reverse sweep
                for group, reverse in ((forward, False), (backward, True)):
                    if group:
                        self.sweep(group, reverse)
        return out

    def scalar(self, op: Op) -> None:
        with self.b.at(op.loc):
            new = self.b.insert(attrs.evolve(op, operands=tuple(self.outer.get(v, v) for v in op.operands)))
        self.outer.update(zip(op.results, new.results))

    # --- one sweep ------------------------------------------------------------------------------
    def sweep(self, sinks: list[Op], reverse: bool) -> None:
        """A for loop over the row's chunks (from its end when `reverse`) computing `sinks`."""
        b, c, n = self.b, self.c, self.n
        scans = self.cone_scans(sinks)
        reductions = [op for op in sinks if isinstance(op, ReduceOp)]
        carried_ops = scans + reductions
        inits = []
        for op in carried_ops:
            kind, dtype = op.kind, op.operands[0].ttype.dtype
            wide = wide_dtype(kind, dtype)
            with b.at(op.loc):
                inits.append(b.const(identity(kind, wide), wide))
        with b.at(sinks[0].loc), b.for_(0, n, c, inits, iv_name="j" if reverse else "k") as frame:
            k = frame.iv
            if reverse:  # chunk j from the end starts at (chunks - 1 - j) * c
                k = b.binary("sub", b.const((n - 1) // c * c, DType.INDEX), k, name="k")
            chunk = ChunkValues(self, k, dict(zip(carried_ops, frame.carried)), reverse)
            for op in sinks:
                with b.at(op.loc):
                    if isinstance(op, StoreOp):
                        chunk.store(op)
                    else:
                        chunk.reduce(op)
            frame.yield_([chunk.next[op] for op in carried_ops])
        for op, final in zip(reductions, frame.results[len(scans):]):
            with b.at(op.loc):
                if op.kind is ReduceKind.MEAN:
                    final = b.binary("div", final, float(n))
                self.outer[op.result] = b.cast(final, op.result.ttype.dtype)

    def cone_scans(self, sinks: list[Op]) -> list[ScanOp]:
        """The scans the sinks' row values are computed from, once each, in program order."""
        seen, order = set(), []

        def visit(v: Value) -> None:
            op = self.defs.get(v)
            if op is None or v in seen or not self.sweeps.is_row(v):
                return
            seen.add(v)
            for o in op.operands:
                visit(o)
            if isinstance(op, ScanOp) and op not in order:
                order.append(op)

        for op in sinks:
            visit(op.operands[0])
        return order


class ChunkValues:
    """The row values of one loop body, each built once, as chunks of c elements at k."""

    def __init__(self, chunker: Chunker, k: Value, carries: dict, reverse: bool) -> None:
        self.ch, self.b, self.k, self.c, self.n = chunker, chunker.b, k, chunker.c, chunker.n
        self.carries, self.reverse = carries, reverse
        self.next: dict = {}  # carried op -> its value for the next chunk
        self.built: dict[Value, Value] = {}
        self._mask: Value | None = None

    def mask(self) -> Value | None:
        """Which lanes of the chunk lie inside the row; None where every chunk is whole."""
        if self.n % self.c == 0:
            return None
        if self._mask is None:
            b = self.b
            at = b.binary("add", b.iota(self.c, DType.I32), b.cast(self.k, DType.I32))
            self._mask = b.cmp("lt", at, self.n)
        return self._mask

    def masked(self, v: Value, kind: ReduceKind) -> Value:
        m = self.mask()
        return v if m is None else self.b.where(m, v, identity(kind, v.ttype.dtype))

    def of(self, v: Value) -> Value:
        if not self.ch.sweeps.is_row(v):
            return self.ch.outer.get(v, v)
        if v not in self.built:
            op = self.ch.defs[v]
            with self.b.at(op.loc):
                self.built[v] = self.row(op)
        return self.built[v]

    def shape(self, v: Value) -> TensorType:
        return v.ttype.with_shape((self.c,))

    def row(self, op: Op) -> Value:
        b = self.b
        if isinstance(op, LoadOp):
            operands, index = self.sliced(op, op.operands[1:])
            return b.create(LoadOp, [op.operands[0], *operands], [self.shape(op.result)], name=op.result.name,
                            index=index, other=op.other).result
        if isinstance(op, IotaOp):
            dtype = op.result.ttype.dtype
            return b.binary("add", b.iota(self.c, dtype), b.cast(self.k, dtype), name=op.result.name)
        if isinstance(op, ConstOp):
            return b.const(op.value, op.result.ttype.dtype, (self.c,), name=op.result.name)
        if isinstance(op, BroadcastOp):
            return b.broadcast_to(self.of(op.operands[0]), (self.c,))
        if isinstance(op, ScanOp):
            return self.scan(op)
        return b.create(type(op), [self.of(v) for v in op.operands], [self.shape(op.result)], name=op.result.name,
                        **op.attributes()).result

    def sliced(self, op, index_operands) -> tuple[list[Value], tuple[IndexDim, ...]]:
        """The index operands and index of `op`'s access, narrowed from the whole row to this
        chunk."""
        dims, operands, rest = [], [], list(index_operands)
        for ix in op.index:
            if ix.kind == "all":
                dims.append(IndexDim("slice", self.c))
                operands.append(self.k)
            else:
                for _ in range(ix.n_operands):
                    operands.append(self.of(rest.pop(0)))
                dims.append(ix)
        return operands, tuple(dims)

    def scan(self, op: ScanOp) -> Value:
        b, kind = self.b, op.kind
        x = self.of(op.operands[0])
        dtype = x.ttype.dtype
        x = b.cast(x, wide_dtype(kind, dtype))
        if self.reverse:
            x = self.masked(x, kind)  # past the row's end must not flow back into it
        carry = self.carries[op]
        part = b.create(ScanOp, [x], kind=kind, axis=0, exclusive=op.exclusive, reverse=op.reverse).result
        out = b.binary(COMBINE[kind], part, carry)
        # forward, the last chunk's tail only reaches lanes not stored and a carry not used
        self.next[op] = b.binary(COMBINE[kind], carry, b.reduce(kind.value, x))
        return b.cast(out, dtype, name=op.result.name)

    def reduce(self, op: ReduceOp) -> None:
        b, kind = self.b, op.kind
        x = self.of(op.operands[0])
        x = self.masked(b.cast(x, wide_dtype(kind, x.ttype.dtype)), kind)
        part = b.reduce(ReduceKind.SUM.value if kind is ReduceKind.MEAN else kind.value, x)
        self.next[op] = b.binary(COMBINE[kind], self.carries[op], part)

    def store(self, op: StoreOp) -> None:
        value, tensor = self.of(op.operands[0]), op.operands[1]
        operands, index = self.sliced(op, op.operands[2:])
        self.b.create(StoreOp, [value, tensor, *operands], [], index=index)

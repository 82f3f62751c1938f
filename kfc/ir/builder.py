"""Build tile IR from Python. The `.kfc` front end uses this too, so the typing rules —
broadcasting, literal constants, integer promotion, what is a dtype mismatch — live here once.

    b = Builder()
    M, N = SymDim("M"), SymDim("N")
    with b.func("rmsnorm", inputs=[("x", tensor(BF16, M, N)), ("w", tensor(F32, N)), ("eps", scalar(F32))],
                outputs=[("y", tensor(BF16, M, N))], defaults={"eps": 1e-6}) as f:
        x, w, eps, y = f.args
        with b.parallel([(0, b.dim("M"))]) as (m,):
            xr = b.cast(b.load(x, [m, ALL]), F32)
            r = b.unary("rsqrt", b.binary("add", b.reduce("mean", b.binary("mul", xr, xr)), eps))
            b.store(b.cast(b.binary("mul", b.binary("mul", xr, r), b.load(w, [ALL])), BF16), y, [m, ALL])
    func = f.op

Rules: floats of different dtypes never mix silently (cast explicitly); integers promote to the
wider, `index` being the widest; Python numbers take the dtype of the other operand; shapes
broadcast as in numpy, a size-1 dim or a missing leading dim stretching.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence, Union

import attrs

from ..diagnostics import KfcError, Span
from .core import Block, Op, Value
from .dtypes import DType, promote_ints, spoken
from .func import FuncOp
from .tile_ops import (
    BINARY_CLASSES, KIND_WORDS, UNARY_CLASSES, BitcastOp, BroadcastOp, CastOp, CmpOp, CmpPred, ConstOp, DimOp, DotOp,
    ExpandDimsOp, ForOp, IfOp, IndexDim, IotaOp, LoadOp, ParallelOp, ScratchOp, ReduceKind, ReduceOp, ReshapeOp,
    ScanOp, StoreOp, TransposeOp, TriInvOp, TriOp, WhereOp, YieldOp, broadcast_compatible, indexed_shape, kind_accepts,
)
from .types import Dim, MemSpace, SymDim, TensorType, Type, bare_type

Number = Union[bool, int, float]
Operand = Union[Value, Number]


class _All:
    def __repr__(self) -> str:
        return "ALL"


ALL = _All()


@attrs.frozen
class Slice:
    """`start : start + size`, valid below `limit` (and the tensor's extent)."""

    start: Operand
    size: int
    limit: Operand | None = None


class BuildError(KfcError):
    """A type or shape rule of the IR was broken while building."""


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _a(word) -> str:
    """`word` with its article, as it is read out: an f32, an i32, an i64 (an index), a bf16, a bool."""
    word = spoken(word)
    return ("an " if word[:1] in "aefhilmnorsx" else "a ") + word


class Builder:
    def __init__(self) -> None:
        self._blocks: list[list[Op]] = []
        self._loc: Span | None = None

    # --- location and insertion ---------------------------------------------------------
    @contextlib.contextmanager
    def at(self, span: Span | None) -> Iterator[None]:
        """Ops built inside carry `span`; errors raised inside point at it."""
        saved = self._loc
        self._loc = span if span is not None else saved
        try:
            yield
        finally:
            self._loc = saved

    def error(self, message: str, hint: str | None = None) -> BuildError:
        return BuildError(message, self._loc, hint)

    def insert(self, op: Op) -> Op:
        if not self._blocks:
            raise RuntimeError("no insertion point: build inside `with builder.func(...)`")
        self._blocks[-1].append(op)
        return op

    def create(self, cls: type[Op], operands: Sequence[Value], result_types: Sequence[Type] | None = None,
               regions: Sequence[Block] = (), name: str | None = None, **attributes) -> Op:
        if result_types is None:
            result_types = cls.infer_result_types([v.type for v in operands], attributes)
            assert result_types is not None, f"{cls.NAME} needs explicit result types"
        results = tuple(Value(t, name if len(result_types) == 1 else None) for t in result_types)
        op = cls(operands=tuple(operands), results=results, regions=tuple(regions), loc=self._loc, **attributes)
        return self.insert(op)

    def name_value(self, v: Value, name: str) -> Value:
        """Give the value just built a source name, for readable IR. A value that already has
        users or a name is returned as it is (the new name becomes an alias)."""
        block = self._blocks[-1]
        if v.name is None and block and v in block[-1].results and len(block[-1].results) == 1:
            last = block.pop()
            nv = Value(v.type, name)
            block.append(last.evolve(results=(nv,)))
            return nv
        return v

    # --- functions and loops ------------------------------------------------------------
    @contextlib.contextmanager
    def func(self, name: str, inputs: Sequence[tuple[str, TensorType]], outputs: Sequence[tuple[str, TensorType]],
             defaults: dict[str, object] | None = None, locs: dict[str, Span] | None = None) -> Iterator["FuncFrame"]:
        locs = locs or {}
        frame = FuncFrame([Value(t, n, locs.get(n)) for n, t in list(inputs) + list(outputs)])
        self._blocks.append([])
        try:
            yield frame
        finally:
            ops = self._blocks.pop()
        frame.op = FuncOp(sym_name=name, num_outputs=len(outputs), defaults=tuple((defaults or {}).items()),
                          regions=(Block(frame.args, ops),), loc=self._loc)

    @contextlib.contextmanager
    def parallel(self, bounds: Sequence[tuple[Operand, Operand]], names: Sequence[str] | None = None) -> Iterator[tuple[Value, ...]]:
        with self.parallel_reduce(bounds, names) as frame:
            yield frame.ivs

    @contextlib.contextmanager
    def parallel_reduce(self, bounds: Sequence[tuple[Operand, Operand]],
                        names: Sequence[str] | None = None) -> Iterator["ParallelFrame"]:
        """A parallel loop whose body may end with `frame.reduce(kinds, values)`: each value is
        an iteration's contribution to one of the loop's results (`frame.results` afterwards)."""
        lows = [self.as_index(lo, "lower bound") for lo, _ in bounds]
        highs = [self.as_index(hi, "upper bound") for _, hi in bounds]
        names = list(names) if names is not None else [None] * len(bounds)
        frame = ParallelFrame(tuple(Value(TensorType(DType.INDEX), n) for n in names))
        loc = self._loc
        self._blocks.append([])
        try:
            yield frame
        finally:
            ops = self._blocks.pop()
        if frame.contributions:
            ops.append(YieldOp(operands=frame.contributions, loc=frame.yield_loc or loc))
        frame.results = tuple(Value(bare_type(c.type), name) for c, name in zip(frame.contributions, frame.names))
        self.insert(ParallelOp(operands=tuple(lows + highs), results=frame.results, reduce=frame.kinds,
                               regions=(Block(frame.ivs, ops),), loc=loc))

    @contextlib.contextmanager
    def for_(self, lo: Operand, hi: Operand, step: Operand, carried: Sequence[Value] = (),
             iv_name: str | None = None) -> Iterator["LoopFrame"]:
        bounds = [self.as_index(lo, "lower bound"), self.as_index(hi, "upper bound"), self.as_index(step, "step")]
        iv = Value(TensorType(DType.INDEX), iv_name)
        frame = LoopFrame(iv, tuple(Value(c.type, c.name) for c in carried), tuple(carried))
        loc = self._loc
        self._blocks.append([])
        try:
            yield frame
        finally:
            ops = self._blocks.pop()
        if frame.yielded is None:
            frame.yielded = frame.carried
        yielded = frame.yielded
        for i, (init, y) in enumerate(zip(carried, yielded)):
            if init.type != y.type:
                raise BuildError(f"carried value {init.name or i!s} changes type in the loop: "
                                 f"{init.type} before, {y.type} after one iteration",
                                 frame.yield_loc or loc, "a carried value must keep its dtype and shape; "
                                 f"cast it back, e.g. {init.ttype.dtype}(...)")
        ops.append(YieldOp(operands=tuple(yielded), loc=frame.yield_loc or loc))
        results = tuple(Value(c.type, c.name) for c in carried)
        op = ForOp(operands=tuple(bounds) + tuple(carried), results=results,
                   regions=(Block((iv,) + frame.carried, ops),), loc=loc)
        self.insert(op)
        frame.results = results

    @contextlib.contextmanager
    def region(self) -> Iterator[list[Op]]:
        """Ops built inside go to a block of their own (a branch of an if): the list, after."""
        ops: list[Op] = []
        self._blocks.append(ops)
        try:
            yield ops
        finally:
            self._blocks.pop()

    def if_(self, cond: Value, then_ops: Sequence[Op], then_values: Sequence[Value], else_ops: Sequence[Op],
            else_values: Sequence[Value], names: Sequence[str | None]) -> tuple[Value, ...]:
        """A tile.if of the two branches built in region()s, yielding the values each gives the
        results (named `names`)."""
        t = cond.type
        if not (isinstance(t, TensorType) and t.is_scalar and t.dtype is DType.BOOL):
            raise self.error(f"an if's condition is a scalar bool, not {t}", "compare to make one, e.g. if n > 0")
        loc = self._loc
        results = tuple(Value(v.type, n) for v, n in zip(then_values, names))
        then = Block((), tuple(then_ops) + (YieldOp(operands=tuple(then_values), loc=loc),))
        other = Block((), tuple(else_ops) + (YieldOp(operands=tuple(else_values), loc=loc),))
        self.insert(IfOp(operands=(cond,), results=results, regions=(then, other), loc=loc))
        return results

    # --- constants ----------------------------------------------------------------------
    def const(self, value: Number, dtype: DType, shape: Sequence[Dim] = (), name: str | None = None) -> Value:
        if dtype.is_float:
            value = float(value)
        elif dtype.is_int:
            if isinstance(value, float) and not value.is_integer():
                raise self.error(f"{value} is not an integer, but the constant is {dtype}")
            value = int(value)
        else:
            value = bool(value)
        return self.create(ConstOp, [], [TensorType(dtype, tuple(shape))], value=value, name=name).result

    def dim(self, sym: str) -> Value:
        return self.create(DimOp, [], sym=sym).result

    def iota(self, n: int | SymDim, dtype: DType = DType.I32) -> Value:
        return self.create(IotaOp, [], [TensorType(dtype, (n,))]).result

    def scratch(self, dtype: DType, shape: tuple) -> Value:
        """A tensor in global memory for this call of the op (kfc.ir.tile_ops.ScratchOp)."""
        return self.create(ScratchOp, [], [TensorType(dtype, tuple(shape), MemSpace.GLOBAL)]).result

    def tri(self, rows: int, cols: int, lower: bool = True, k: int = 0) -> Value:
        return self.create(TriOp, [], [TensorType(DType.BOOL, (rows, cols))], lower=lower, k=k).result

    # --- conversions ----------------------------------------------------------------------
    def literal(self, value: Number, like: TensorType | None) -> Value:
        """A Python number as a scalar of the dtype it meets."""
        if like is None:
            if isinstance(value, bool):
                return self.const(value, DType.BOOL)
            return self.const(value, DType.INDEX if isinstance(value, int) else DType.F32)
        d = like.dtype
        if isinstance(value, bool):
            if not d.is_bool:
                raise self.error(f"dtype mismatch: a boolean literal meets {_a(d)} operand",
                                 "use a number of the operand's dtype, or convert the mask, e.g. f32(mask)")
            return self.const(value, d)
        if isinstance(value, float) and not d.is_float:
            raise self.error(f"dtype mismatch: the float literal {value} meets {_a(d)} operand",
                             "write an integer, or cast the other side, e.g. f32(...)")
        if d.is_bool:
            raise self.error(f"dtype mismatch: the number {value} meets a bool operand",
                             "use true or false, or compare to get a mask, e.g. x > 0")
        return self.const(value, d)

    def as_index(self, v: Operand, what: str = "index") -> Value:
        if isinstance(v, bool) or isinstance(v, float):
            raise self.error(f"{what} must be an integer, not {v!r}")
        if isinstance(v, int):
            return self.const(v, DType.INDEX)
        t = v.ttype
        if t.space is not MemSpace.REG or not t.is_scalar or not t.dtype.is_int:
            raise self.error(f"{what} must be an integer scalar, not {t}",
                             "loop bounds and indices are integers: dims, loop indices or loads from integer tensors")
        return v if t.dtype is DType.INDEX else self.create(CastOp, [v], [TensorType(DType.INDEX)]).result

    def cast(self, v: Value, dtype: DType, name: str | None = None) -> Value:
        t = self.tile_of(v, "cast operand")
        if t.dtype == dtype:
            return v
        return self.create(CastOp, [v], [t.with_dtype(dtype)], name=name).result

    def bitcast(self, v: Value, dtype: DType, name: str | None = None) -> Value:
        t = self.tile_of(v, "bitcast operand")
        if t.dtype == dtype:
            return v
        if t.dtype.is_bool or dtype.is_bool or t.dtype.bits != dtype.bits:
            raise self.error(f"bitcast keeps the width: {t.dtype} has {t.dtype.bits} bits, {dtype} has {dtype.bits}",
                             "bitcast between dtypes of one width (e4m3, e5m2, i8, u8; bf16, f16; f32, i32; f64, i64)")
        return self.create(BitcastOp, [v], [t.with_dtype(dtype)], name=name).result

    def broadcast_to(self, v: Value, shape: Sequence[Dim]) -> Value:
        t = v.ttype
        shape = tuple(shape)
        if t.shape == shape:
            return v
        if not broadcast_compatible(t.shape, shape):
            raise self.error(f"cannot broadcast {_shape(t.shape)} to {_shape(shape)}")
        return self.create(BroadcastOp, [v], [t.with_shape(shape)]).result

    def tile_of(self, v: Value, what: str) -> TensorType:
        t = v.ttype
        if t.space is not MemSpace.REG:
            raise self.error(f"{what} is a tensor in {t.space} memory, not a tile",
                             "index it to load a tile, e.g. x[m, :]")
        return t

    # --- elementwise ----------------------------------------------------------------------
    def broadcast_shape(self, shapes: Sequence[tuple[Dim, ...]], what: str) -> tuple[Dim, ...]:
        rank = max(len(s) for s in shapes)
        out: list[Dim] = []
        for i in range(1, rank + 1):
            dims = {s[-i] for s in shapes if len(s) >= i}
            dims.discard(1)
            if len(dims) > 1:
                got = " and ".join(_shape(s) for s in shapes)
                raise self.error(f"shape mismatch in {what}: {got} do not broadcast "
                                 f"(dim {' vs '.join(str(d) for d in sorted(dims, key=str))})",
                                 "shapes must agree, or be 1, in each dim counted from the right")
            out.append(dims.pop() if dims else 1)
        return tuple(reversed(out))

    def _unify(self, operands: Sequence[Operand], what: str, allow_bool: bool = True) -> list[Value]:
        """Give operands one dtype and one shape: literals adopt, integers promote."""
        values = [v for v in operands if isinstance(v, Value)]
        for v in values:
            self.tile_of(v, f"operand of {what}")
        if not values:
            values = [self.literal(operands[0], None)]
            operands = [values[0]] + list(operands[1:])
        dtypes = {v.ttype.dtype for v in values}
        if len(dtypes) > 1:
            if all(d.is_int for d in dtypes):
                target = DType.I8
                for d in dtypes:
                    target = promote_ints(target, d)
            else:
                a, b = sorted(dtypes, key=str)[:2]
                raise self.error(f"dtype mismatch in {what}: {spoken(a)} and {spoken(b)}",
                                 f"convert explicitly, e.g. {'f32' if a.is_float or b.is_float else spoken(a)}(...) "
                                 "on one side" + (" (loop indices, dims and a bare `n = 0` are i64; "
                                                  "start a float at 0.0)"
                                                  if DType.INDEX in (a, b) and (a.is_float or b.is_float) else ""))
        else:
            target = dtypes.pop()
        like = TensorType(target)
        typed = [v if isinstance(v, Value) else self.literal(v, like) for v in operands]
        typed = [self.cast(v, target) if v.ttype.dtype != target else v for v in typed]
        shape = self.broadcast_shape([v.ttype.shape for v in typed], what)
        return [self.broadcast_to(v, shape) for v in typed]

    def unary(self, fn: str, x: Operand, name: str | None = None) -> Value:
        if fn not in UNARY_CLASSES:
            raise self.error(f"unknown unary function {fn!r}")
        (x,) = self._unify([x], fn)
        cls = UNARY_CLASSES[fn]
        if not kind_accepts(cls.OPERAND_KIND, x.ttype.dtype):
            raise self.error(f"{fn} needs {KIND_WORDS[cls.OPERAND_KIND]} operand, not {spoken(x.ttype.dtype)}",
                             f"convert first, e.g. {fn}(f32(...))" if cls.OPERAND_KIND.value == "float" else None)
        return self.create(cls, [x], name=name).result

    def binary(self, fn: str, a: Operand, b: Operand, name: str | None = None) -> Value:
        if fn not in BINARY_CLASSES:
            raise self.error(f"unknown binary function {fn!r}")
        a, b = self._unify([a, b], fn)
        cls = BINARY_CLASSES[fn]
        if not kind_accepts(cls.OPERAND_KIND, a.ttype.dtype):
            raise self.error(f"{fn} needs {KIND_WORDS[cls.OPERAND_KIND].removeprefix('a ')} operands, "
                             f"not {spoken(a.ttype.dtype)}")
        return self.create(cls, [a, b], name=name).result

    def cmp(self, pred: str, a: Operand, b: Operand, name: str | None = None) -> Value:
        a, b = self._unify([a, b], f"comparison '{pred}'")
        return self.create(CmpOp, [a, b], pred=CmpPred(pred), name=name).result

    def where(self, cond: Operand, a: Operand, b: Operand, name: str | None = None) -> Value:
        if isinstance(cond, Value) and cond.ttype.dtype is not DType.BOOL:
            raise self.error(f"where's condition must be bool, not {spoken(cond.ttype.dtype)}",
                             "compare to get a mask, e.g. where(x > 0, x, 0.0)")
        if not isinstance(cond, Value):
            if not isinstance(cond, bool):
                raise self.error(f"where's condition must be bool, not the number {cond!r}",
                                 "write true or false, or a comparison such as x > 0")
            cond = self.literal(cond, TensorType(DType.BOOL))
        if not isinstance(a, Value) and not isinstance(b, Value) and not isinstance(a, bool):
            # both numbers (where(x > 0, 2, 1)): integers default to i32 as iota's do, a float makes both f32
            a = self.const(a, DType.F32 if isinstance(a, float) or isinstance(b, float) else DType.I32)
        a, b = self._unify([a, b], "where")
        shape = self.broadcast_shape([cond.ttype.shape, a.ttype.shape], "where")
        cond, a, b = (self.broadcast_to(v, shape) for v in (cond, a, b))
        return self.create(WhereOp, [cond, a, b], name=name).result

    # --- shape ----------------------------------------------------------------------------
    def expand_dims(self, x: Value, axes: Sequence[int], name: str | None = None) -> Value:
        self.tile_of(x, "expand_dims operand")
        rank = x.ttype.rank + len(axes)
        axes = sorted(a % rank if -rank <= a < rank else a for a in axes)
        if any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
            raise self.error(f"cannot insert axes {list(axes)} into a rank-{x.ttype.rank} tile")
        return self.create(ExpandDimsOp, [x], axes=tuple(axes), name=name).result

    def transpose(self, x: Value, perm: Sequence[int] | None = None, name: str | None = None) -> Value:
        t = self.tile_of(x, "transpose operand")
        if perm is None:
            if t.rank != 2:
                raise self.error(f".T transposes 2-D tiles; this one is {_shape(t.shape)}",
                                 "use transpose(x, [..]) with a permutation")
            perm = (1, 0)
        if sorted(perm) != list(range(t.rank)):
            raise self.error(f"{list(perm)} is not a permutation of {t.rank} axes")
        return self.create(TransposeOp, [x], perm=tuple(perm), name=name).result

    def reshape(self, x: Value, shape: Sequence[Dim], name: str | None = None) -> Value:
        t = self.tile_of(x, "reshape operand")
        out = t.with_shape(tuple(shape))
        if t.is_static and out.is_static and t.numel() != out.numel():
            raise self.error(f"cannot reshape {_shape(t.shape)} ({t.numel()} elements) to "
                             f"{_shape(out.shape)} ({out.numel()} elements)")
        return self.create(ReshapeOp, [x], [out], name=name).result

    # --- reductions -------------------------------------------------------------------------
    def _axes(self, t: TensorType, axes: int | Sequence[int] | None) -> tuple[int, ...]:
        if axes is None:
            return tuple(range(t.rank))
        if isinstance(axes, int):
            axes = [axes]
        out = []
        for a in axes:
            if not -t.rank <= a < t.rank:
                raise self.error(f"axis {a} is out of range for a rank-{t.rank} tile {_shape(t.shape)}",
                                 "its only axis is 0 (or -1)" if t.rank == 1 else
                                 f"its axes are 0 to {t.rank - 1} (or -{t.rank} to -1 from the end)")
            out.append(a % t.rank)
        if len(set(out)) != len(out):
            raise self.error(f"axis listed twice in {list(axes)}")
        return tuple(sorted(out))

    def reduce(self, kind: str, x: Value, axes: int | Sequence[int] | None = None, keepdims: bool = False,
               name: str | None = None) -> Value:
        t = self.tile_of(x, f"{kind} operand")
        if t.rank == 0:
            raise self.error(f"{kind} of a scalar: there is no axis to reduce")
        if kind == "mean" and not t.dtype.is_float:
            raise self.error(f"mean needs a floating-point tile, not {spoken(t.dtype)}",
                             "convert first, e.g. mean(f32(x))")
        if kind in ("sum", "prod") and t.dtype.is_bool:
            raise self.error(f"{kind} of a bool tile", "convert first, e.g. sum(i32(mask))")
        return self.create(ReduceOp, [x], kind=ReduceKind(kind), axes=self._axes(t, axes), keepdims=keepdims,
                           name=name).result

    def scan(self, kind: str, x: Value, axis: int = 0, exclusive: bool = False, reverse: bool = False,
             name: str | None = None) -> Value:
        t = self.tile_of(x, "scan operand")
        (axis,) = self._axes(t, axis) if t.rank else (None,)
        if axis is None:
            raise self.error(f"cum{kind} of a scalar")
        return self.create(ScanOp, [x], kind=ReduceKind(kind), axis=axis, exclusive=exclusive, reverse=reverse,
                           name=name).result

    def dot(self, a: Value, b: Value, trans_a: bool = False, trans_b: bool = False, name: str | None = None) -> Value:
        ta, tb = self.tile_of(a, "dot lhs"), self.tile_of(b, "dot rhs")
        if ta.rank != 2 or tb.rank != 2:
            raise self.error(f"dot multiplies 2-D tiles; got {_shape(ta.shape)} and {_shape(tb.shape)}",
                             "use x[None, :] to make a row, x[:, None] a column")
        if ta.dtype != tb.dtype:
            raise self.error(f"dtype mismatch in dot: {spoken(ta.dtype)} and {spoken(tb.dtype)}",
                             "both operands need the same dtype; convert one, e.g. bf16(...)")
        m, n, ka, kb = DotOp.mnk(ta, tb, trans_a, trans_b)
        if ka != kb:
            sa = _shape(ta.shape) + ("ᵀ" if trans_a else "")
            sb = _shape(tb.shape) + ("ᵀ" if trans_b else "")
            raise self.error(f"shape mismatch in dot: {sa} · {sb} contracts {ka} with {kb}",
                             "the lhs's columns must match the rhs's rows; transpose with trans_a/trans_b or .T")
        return self.create(DotOp, [a, b], trans_a=trans_a, trans_b=trans_b, name=name).result

    def tri_inv(self, x: Value, name: str | None = None) -> Value:
        t = self.tile_of(x, "tri_inv operand")
        if t.rank != 2 or t.shape[0] != t.shape[1] or not isinstance(t.shape[0], int):
            raise self.error(f"tri_inv inverts a square tile of a fixed size, not {_shape(t.shape)}",
                             "pass the chunk's [C, C] matrix, C a number")
        if t.dtype is not DType.F32:
            raise self.error(f"tri_inv inverts an f32 tile, not {spoken(t.dtype)}", "cast it: tri_inv(f32(x))")
        return self.create(TriInvOp, [x], name=name).result

    # --- memory -----------------------------------------------------------------------------
    def _index(self, t: TensorType, index: Sequence) -> tuple[tuple[IndexDim, ...], list[Value]]:
        if len(index) > t.rank:
            raise self.error(f"{len(index)} indices for a rank-{t.rank} tensor {t}")
        index = list(index) + [ALL] * (t.rank - len(index))
        dims: list[IndexDim] = []
        operands: list[Value] = []
        for item in index:
            if item is ALL:
                dims.append(IndexDim("all"))
            elif isinstance(item, Slice):
                if item.size <= 0:
                    raise self.error(f"a slice needs a positive size, not {item.size}")
                dims.append(IndexDim("slice", item.size, item.limit is not None))
                operands.append(self.as_index(item.start, "slice start"))
                if item.limit is not None:
                    operands.append(self.as_index(item.limit, "slice limit"))
            else:
                dims.append(IndexDim("point"))
                operands.append(self.as_index(item, "index"))
        return tuple(dims), operands

    def load(self, tensor: Value, index: Sequence, other: Number = 0, name: str | None = None) -> Value:
        t = tensor.ttype
        if t.space is MemSpace.REG:
            raise self.error(f"cannot index the tile {t} like a tensor",
                             "tiles take ':' and 'None' only; use where(...) with a mask to pick elements")
        dims, operands = self._index(t, index)
        if t.dtype.is_float:
            other = float(other)
        elif t.dtype.is_int:
            other = int(other)
        else:
            other = bool(other)
        return self.create(LoadOp, [tensor] + operands, index=dims, other=other, name=name).result

    def store(self, value: Operand, tensor: Value, index: Sequence) -> Op:
        t = tensor.ttype
        dims, operands = self._index(t, index)
        shape = tuple(indexed_shape(t, dims))
        if not isinstance(value, Value):
            value = self.literal(value, TensorType(t.dtype))
        vt = self.tile_of(value, "stored value")
        if vt.dtype != t.dtype:
            # an integer literal is an index (loop bounds and offsets take it): say where one came from
            index = " (an integer literal, such as a carry's start `n = 0`, is an i64 index)" \
                if vt.dtype is DType.INDEX else ""
            raise self.error(f"dtype mismatch in store: {_a(vt.dtype)} tile into the {t.dtype} tensor "
                             f"{tensor.name or ''}".rstrip() + index,
                             f"convert it, e.g. {t.dtype}(...)" + (f", or start from {t.dtype}(0)" if index else ""))
        if vt.shape != shape:
            if not broadcast_compatible(vt.shape, shape):
                raise self.error(f"shape mismatch in store: a {_shape(vt.shape)} tile into a "
                                 f"{_shape(shape)} region of {tensor.name or 'the tensor'}",
                                 "the value must have the region's shape (or broadcast to it); "
                                 "index the target or the value so the two agree")
            value = self.broadcast_to(value, shape)
        return self.create(StoreOp, [value, tensor] + operands, [], index=dims)


@attrs.define
class FuncFrame:
    args: list[Value]
    op: FuncOp | None = None


@attrs.define
class ParallelFrame:
    ivs: tuple[Value, ...]
    kinds: tuple[str, ...] = ()
    contributions: tuple[Value, ...] = ()
    names: tuple[str | None, ...] = ()
    yield_loc: Span | None = None
    results: tuple[Value, ...] = ()

    def reduce(self, kinds: Sequence[str], values: Sequence[Value], names: Sequence[str | None],
               loc: Span | None = None) -> None:
        self.kinds, self.contributions, self.names = tuple(kinds), tuple(values), tuple(names)
        self.yield_loc = loc


@attrs.define
class LoopFrame:
    iv: Value
    carried: tuple[Value, ...]
    inits: tuple[Value, ...]
    yielded: tuple[Value, ...] | None = None
    yield_loc: Span | None = None
    results: tuple[Value, ...] = ()

    def yield_(self, values: Sequence[Value], loc: Span | None = None) -> None:
        self.yielded = tuple(values)
        self.yield_loc = loc

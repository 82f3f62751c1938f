"""The oracle: a numpy interpreter for the IR.

Values are numpy arrays of the exact element type (ml_dtypes for bf16 and fp8); arithmetic on
narrow floats is done in fp32 and rounded back, as a GPU does. Reductions and dots accumulate
in fp32. Parallel loops run their iterations one after another (they are independent, so the
order cannot matter for a valid program).

    outs = run(func, {"x": x, "w": w})          # outputs are allocated and NaN-poisoned
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import numpy as np

from ..diagnostics import InterpretError, KfcError
from . import constexpr
from .core import Block, Op, Value
from .dtypes import DType
from .func import FuncOp
from .tile_ops import (
    BinaryOp, BroadcastOp, CastOp, CmpOp, ConstOp, DimOp, DotOp, ExpandDimsOp, ForOp, IndexDim,
    IotaOp, LoadOp, ParallelOp, ReduceOp, ReshapeOp, ScanOp, StoreOp, TransposeOp, TriOp, UnaryOp,
    WhereOp, YieldOp,
)
from .signature import bind_dims
from . import smem_ops
from .gpu_ops import combine
from .smem_ops import HazardError, SharedBuffer
from .types import MemSpace, SymDim, TensorType, bind_dim


def _sigmoid(x):
    e = np.exp(-np.abs(x))  # never overflows; keeps relative precision for x << 0
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _rsqrt(x):
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(x)


def _not(x):
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


UNARY_FNS: dict[str, Callable] = {
    "neg": np.negative, "abs": np.abs, "not": _not, "exp": np.exp, "exp2": np.exp2, "log": np.log,
    "log2": np.log2, "sqrt": np.sqrt, "rsqrt": _rsqrt, "sigmoid": _sigmoid,
    "softplus": lambda x: np.logaddexp(np.zeros_like(x), x), "tanh": np.tanh,
}


def _div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        if np.any(b == 0):
            raise ZeroDivisionError("integer division by zero")
        return np.floor_divide(a, b)
    return np.true_divide(a, b)


def _rem(a, b):
    if np.issubdtype(a.dtype, np.integer) and np.any(b == 0):
        raise ZeroDivisionError("integer remainder by zero")
    return np.mod(a, b)


def _logical(fn_bool, fn_int):
    return lambda a, b: fn_bool(a, b) if a.dtype == np.bool_ else fn_int(a, b)


BINARY_FNS: dict[str, Callable] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div, "rem": _rem,
    "max": np.maximum, "min": np.minimum, "pow": np.power,
    "and": _logical(np.logical_and, np.bitwise_and), "or": _logical(np.logical_or, np.bitwise_or),
    "xor": _logical(np.logical_xor, np.bitwise_xor),
}
CMP_FNS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
           "eq": np.equal, "ne": np.not_equal}


def poison_value(dtype: DType):
    """What an unwritten output element holds: NaN for floats, an unlikely value otherwise."""
    if dtype.is_float:
        return np.nan
    if dtype.is_bool:
        return True
    return np.iinfo(dtype.np).min


# ---------------------------------------------------------------------------------------------
# binding arguments


def bind_arguments(func: FuncOp, args: dict[str, Any], dims: dict[str, int] | None = None,
                   outputs: dict[str, np.ndarray] | None = None):
    """Match call arguments against the signature: bind shape symbols, fill defaults, allocate
    (poisoned) outputs. Returns (dims, env) with env mapping each argument Value to its array
    (None for an absent optional tensor)."""
    unknown = set(args) - set(func.input_names)
    if unknown:
        raise KfcError(f"{func.sym_name} has no input named {sorted(unknown)[0]!r}",
                       hint=f"its inputs are {func.input_names}")
    env: dict[Value, Any] = {}
    shapes: dict[str, tuple[int, ...] | None] = {}
    for v in func.inputs:
        t = v.ttype
        if t.space is MemSpace.REG:
            continue
        arr = args.get(v.name)
        if arr is None:
            if not t.optional:
                raise KfcError(f"missing input {v.name!r} ({t})")
            env[v], shapes[v.name] = None, None
            continue
        if not isinstance(arr, np.ndarray):
            raise KfcError(f"input {v.name!r} must be a numpy array, not {type(arr).__name__}")
        if arr.dtype != t.dtype.np:
            raise KfcError(f"input {v.name!r} has dtype {arr.dtype}, the signature says {t.dtype}")
        env[v], shapes[v.name] = arr, arr.shape
    dims = bind_dims(func, shapes, dims)
    for v in func.scalar_inputs:
        value = args.get(v.name, func.default_of(v.name))
        if value is None:
            raise KfcError(f"missing scalar input {v.name!r} (it has no default)")
        if isinstance(value, str):
            value = constexpr.evaluate(value, dims)
        env[v] = np.asarray(value).astype(v.ttype.dtype.np)
    outputs = dict(outputs or {})
    for v in func.outputs:
        t = v.ttype
        missing = sorted(t.symbols - set(dims))
        if missing:
            raise KfcError(f"cannot size output {v.name!r}: symbol {missing[0]} is not bound by any input",
                           hint="pass it in dims=")
        shape = tuple(bind_dim(d, dims) for d in t.shape)
        if v.name in outputs and outputs[v.name] is None:  # an absent optional output: stores skip it
            if not t.optional:
                raise KfcError(f"output {v.name!r} is not optional; it cannot be None")
            env[v] = None
            continue
        if v.name in outputs:
            arr = outputs[v.name]
            if arr.shape != shape or arr.dtype != t.dtype.np:
                raise KfcError(f"output {v.name!r} must be {t.dtype}{list(shape)}, got {arr.dtype}{list(arr.shape)}")
        else:
            arr = np.full(shape, poison_value(t.dtype), dtype=t.dtype.np)
        env[v] = arr
    return dims, env


def run(func: FuncOp, args: dict[str, Any], dims: dict[str, int] | None = None,
        outputs: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Interpret `func` on numpy inputs; return its outputs by name."""
    dims, env = bind_arguments(func, args, dims, outputs)
    Interpreter(func, dims).exec_block(func.body, env)
    return {v.name: env[v] for v in func.outputs}


def run_tracked(func: FuncOp, args: dict[str, Any], dims: dict[str, int] | None = None):
    """Like run, and also which op last wrote each output element: returns (outputs, writers)
    where writers[name] holds indices into writers["__ops__"] (-1: never written)."""
    dims, env = bind_arguments(func, args, dims)
    interp = Interpreter(func, dims)
    interp.writers = {v: np.full(env[v].shape, -1, dtype=np.int64) for v in func.outputs if env[v] is not None}
    interp.exec_block(func.body, env)
    writers: dict[str, Any] = {v.name: w for v, w in interp.writers.items()}
    writers["__ops__"] = interp.writer_ops
    return {v.name: env[v] for v in func.outputs}, writers


# ---------------------------------------------------------------------------------------------


class Interpreter:
    def __init__(self, func: FuncOp, dims: dict[str, int]) -> None:
        self.func = func
        self.dims = dims
        self.writers: dict[Value, np.ndarray] | None = None  # set by run_tracked
        self.writer_ops: list[Op] = []
        self._writer_index: dict[int, int] = {}
        self.barriers: list = []  # (MBarrier, its alloc op) made in the current loop iteration

    def shape_of(self, t: TensorType) -> tuple[int, ...]:
        shape = tuple(bind_dim(d, self.dims) for d in t.shape)
        if any(isinstance(d, SymDim) for d in shape):
            raise InterpretError(f"type {t} has an unbound symbol")
        return shape

    # --- blocks -----------------------------------------------------------------------------
    def exec_block(self, block: Block, env: dict) -> list | None:
        for op in block.ops:
            if isinstance(op, YieldOp):
                return [env[v] for v in op.operands]
            try:
                outs = self.exec_op(op, env)
            except KfcError:
                raise
            except (ValueError, IndexError, ZeroDivisionError, FloatingPointError, TypeError) as e:
                raise InterpretError(f"{op.NAME}: {e}", op.loc) from None
            if outs is not None:
                for r, value in zip(op.results, outs):
                    env[r] = value
        return None

    def exec_op(self, op: Op, env: dict):
        ins = [env[v] for v in op.operands]
        interpret = getattr(op, "interpret", None)
        if interpret is not None:  # an op that carries its own semantics (kfc.ir.smem_ops)
            return interpret(self, ins, env)
        if isinstance(op, UnaryOp):
            return [self.unary(op, ins[0])]
        if isinstance(op, BinaryOp):
            return [self.binary(op, *ins)]
        method = None
        for cls in type(op).__mro__:  # a refined op (ptx.ld) runs as the op it refines (tile.load)
            method = getattr(self, "op_" + cls.__name__, None)
            if method is not None:
                break
        if method is None:
            raise InterpretError(f"the interpreter has no semantics for {op.NAME}", op.loc,
                                 "add them in kfc/ir/interpreter.py; every op needs an oracle")
        return method(op, ins, env)

    # --- elementwise ------------------------------------------------------------------------
    @staticmethod
    def _out(op: Op, value: np.ndarray, i: int = 0) -> np.ndarray:
        dt = op.results[i].ttype.dtype.np
        return np.asarray(value).astype(dt, copy=False)

    def unary(self, op: UnaryOp, x: np.ndarray) -> np.ndarray:
        ct = op.operands[0].ttype.dtype.compute_np
        with np.errstate(all="ignore"):
            fn = getattr(op, "FN", None) or op.NAME.split(".")[1]
            return self._out(op, UNARY_FNS[fn](x.astype(ct, copy=False)))

    def binary(self, op: BinaryOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        ct = op.operands[0].ttype.dtype.compute_np
        with np.errstate(all="ignore"):
            return self._out(op, BINARY_FNS[op.NAME.split(".")[1]](a.astype(ct, copy=False), b.astype(ct, copy=False)))

    def op_CmpOp(self, op: CmpOp, ins, env):
        ct = op.operands[0].ttype.dtype.compute_np
        a, b = (x.astype(ct, copy=False) for x in ins)
        return [np.asarray(CMP_FNS[op.pred.value](a, b))]

    def op_WhereOp(self, op: WhereOp, ins, env):
        c, a, b = ins
        return [self._out(op, np.where(c, a, b))]

    def op_CastOp(self, op: CastOp, ins, env):
        src = op.operands[0].ttype.dtype
        dst = op.result.ttype.dtype
        x = ins[0]
        if src.is_float and (dst.is_int):
            with np.errstate(invalid="ignore"):
                x = np.trunc(x.astype(np.float64))
        if dst.is_float and not src.is_float:
            x = x.astype(np.float64)
        with np.errstate(all="ignore"):
            return [np.asarray(x).astype(dst.np)]

    # --- generators -------------------------------------------------------------------------
    def op_ConstOp(self, op: ConstOp, ins, env):
        t = op.result.ttype
        return [np.full(self.shape_of(t), op.value, dtype=t.dtype.np)]

    def op_DimOp(self, op: DimOp, ins, env):
        if op.sym not in self.dims:
            raise InterpretError(f"shape symbol {op.sym} is not bound", op.loc)
        return [np.asarray(self.dims[op.sym], dtype=np.int64)]

    def op_IotaOp(self, op: IotaOp, ins, env):
        t = op.result.ttype
        return [np.arange(self.shape_of(t)[0]).astype(t.dtype.np)]

    def op_TriOp(self, op: TriOp, ins, env):
        r, c = self.shape_of(op.result.ttype)
        ones = np.ones((r, c), dtype=bool)
        return [np.tril(ones, op.k) if op.lower else np.triu(ones, op.k)]

    # --- shape ------------------------------------------------------------------------------
    def op_BroadcastOp(self, op: BroadcastOp, ins, env):
        return [np.broadcast_to(ins[0], self.shape_of(op.result.ttype))]

    def op_ExpandDimsOp(self, op: ExpandDimsOp, ins, env):
        return [np.expand_dims(ins[0], tuple(op.axes))]

    def op_ReshapeOp(self, op: ReshapeOp, ins, env):
        return [np.reshape(ins[0], self.shape_of(op.result.ttype))]

    def op_TransposeOp(self, op: TransposeOp, ins, env):
        return [np.transpose(ins[0], op.perm)]

    # --- reductions -------------------------------------------------------------------------
    def op_ReduceOp(self, op: ReduceOp, ins, env):
        x = ins[0]
        d = op.operands[0].ttype.dtype
        acc = np.float32 if d.is_float and d.bits <= 32 else (np.float64 if d.is_float else np.int64)
        if d.is_bool:
            acc = np.bool_
        x = x.astype(acc, copy=False)
        axes = tuple(op.axes)
        kind = op.kind.value
        if kind == "sum":
            r = np.sum(x, axis=axes, keepdims=op.keepdims, dtype=acc)
        elif kind == "mean":
            r = np.mean(x, axis=axes, keepdims=op.keepdims, dtype=acc)
        elif kind == "prod":
            r = np.prod(x, axis=axes, keepdims=op.keepdims, dtype=acc)
        elif kind == "max":
            r = np.max(x, axis=axes, keepdims=op.keepdims) if x.size else self._empty(op, -np.inf)
        else:
            r = np.min(x, axis=axes, keepdims=op.keepdims) if x.size else self._empty(op, np.inf)
        return [self._out(op, r)]

    def op_MaxSumExpOp(self, op, ins, env):
        # as max(x), then sum(exp(x - max(x))) compute it: f32 differences, exponentials, sum
        x = ins[0].astype(np.float32, copy=False)
        m = np.max(x) if x.size else np.float32(-np.inf)
        with np.errstate(all="ignore"):
            s = np.sum(np.exp((x - m).astype(np.float32)), dtype=np.float32)
        return [self._out(op, m, 0), self._out(op, s, 1)]

    def _empty(self, op: ReduceOp, identity: float):
        t = op.result.ttype
        return np.full(self.shape_of(t), identity if t.dtype.is_float else 0)

    def op_ScanOp(self, op: ScanOp, ins, env):
        x = ins[0]
        d = op.operands[0].ttype.dtype
        acc = np.float32 if d.is_float and d.bits <= 32 else (np.float64 if d.is_float else np.int64)
        x = x.astype(acc, copy=False)
        axis = op.axis
        if op.reverse:
            x = np.flip(x, axis)
        kind = op.kind.value
        if kind == "sum":
            r, ident = np.cumsum(x, axis=axis, dtype=acc), 0
        elif kind == "prod":
            r, ident = np.cumprod(x, axis=axis, dtype=acc), 1
        elif kind == "max":  # identities of the operand's own type (the accumulator's would wrap)
            r, ident = np.maximum.accumulate(x, axis=axis), (-np.inf if d.is_float else False if d.is_bool else np.iinfo(d.np).min)
        else:
            r, ident = np.minimum.accumulate(x, axis=axis), (np.inf if d.is_float else True if d.is_bool else np.iinfo(d.np).max)
        if op.exclusive:
            pad = np.full_like(np.take(r, [0], axis=axis), ident)
            r = np.concatenate([pad, np.take(r, np.arange(r.shape[axis] - 1), axis=axis)], axis=axis)
        if op.reverse:
            r = np.flip(r, axis)
        return [self._out(op, r)]

    def op_DotOp(self, op: DotOp, ins, env):
        a, b = ins
        if op.operands[0].ttype.dtype.is_int:
            a, b = a.astype(np.int64), b.astype(np.int64)
        else:
            a, b = a.astype(np.float32), b.astype(np.float32)
        if op.trans_a:
            a = a.T
        if op.trans_b:
            b = b.T
        return [self._out(op, np.matmul(a, b))]

    # --- memory -----------------------------------------------------------------------------
    def _gather_plan(self, op: Op, t: TensorType, index: tuple[IndexDim, ...], idx_values: list, extent):
        """Per dim: the positions addressed (in bounds or not) and which are valid."""
        it = iter(int(np.asarray(x)) for x in idx_values)
        plan = []
        for dim, (ix, n) in enumerate(zip(index, extent)):
            if ix.kind == "point":
                i = next(it)
                if not 0 <= i < n:
                    raise InterpretError(f"{op.NAME}: index {i} is out of bounds for dim {dim} of size {n} "
                                         f"of {op.operands[1 if isinstance(op, StoreOp) else 0].name or 'the tensor'}",
                                         op.loc, "guard the access, or use a slice with a limit")
                plan.append(("point", np.array([i]), np.array([True])))
            elif ix.kind == "all":
                plan.append(("all", np.arange(n), np.ones(n, dtype=bool)))
            else:
                start = next(it)
                limit = next(it) if ix.limit else n
                pos = start + np.arange(ix.size)
                valid = (pos >= 0) & (pos < min(n, limit))
                plan.append(("slice", pos, valid))
        return plan

    def gather(self, op: Op, t: TensorType, index, idx_values, arr: np.ndarray, other, out_shape, np_dtype):
        """The indexed region of arr, `other` where it lies outside the tensor."""
        plan = self._gather_plan(op, t, index, idx_values, arr.shape)
        gather = [np.where(valid, pos, 0) for _, pos, valid in plan]
        vals = arr[np.ix_(*gather)] if gather else arr[()]
        mask = np.ones(vals.shape, dtype=bool)
        for axis, (_, _, valid) in enumerate(plan):
            shape = [1] * len(plan)
            shape[axis] = len(valid)
            mask &= valid.reshape(shape)
        vals = np.where(mask, vals, np.asarray(other).astype(np_dtype))
        return np.asarray(vals).reshape(out_shape).astype(np_dtype)

    def op_LoadOp(self, op: LoadOp, ins, env):
        arr = ins[0]
        rt = op.result.ttype
        out_shape = self.shape_of(rt)
        if arr is None:  # an absent optional tensor reads as `other`
            return [np.full(out_shape, op.other, dtype=rt.dtype.np)]
        if isinstance(arr, SharedBuffer):
            if arr.pending is not None:
                raise HazardError(f"{op.NAME}: {smem_ops.read_in_flight(arr.name, arr.pending.name)}", op.loc,
                                  smem_ops.HINT_WAIT_BEFORE_READ)
            arr = arr.data
        return [self.gather(op, op.operands[0].ttype, op.index, ins[1:], arr, op.other, out_shape, rt.dtype.np)]

    def op_StoreOp(self, op: StoreOp, ins, env):
        value, arr = ins[0], ins[1]
        if arr is None:  # an absent optional output is not written
            return None
        t = op.operands[1].ttype
        plan = self._gather_plan(op, t, op.index, ins[2:], arr.shape)
        dst = [pos[valid] for _, pos, valid in plan]
        if any(len(d) == 0 for d in dst):
            return None
        # positions inside the value tile: point dims are absent from it
        src = [np.nonzero(valid)[0] for kind, _, valid in plan if kind != "point"]
        v = np.asarray(value)
        block = v[np.ix_(*src)] if src else v
        target_shape = tuple(len(d) for d in dst)
        arr[np.ix_(*dst)] = np.reshape(block, target_shape)
        if self.writers is not None and op.operands[1] in self.writers:
            if id(op) not in self._writer_index:
                self._writer_index[id(op)] = len(self.writer_ops)
                self.writer_ops.append(op)
            self.writers[op.operands[1]][np.ix_(*dst)] = self._writer_index[id(op)]
        return None

    # --- control flow -----------------------------------------------------------------------
    def op_ParallelOp(self, op: ParallelOp, ins, env):
        n = op.rank
        ranges = [range(int(lo), int(hi)) for lo, hi in zip(ins[:n], ins[n:])]
        body = op.body
        acc = self.loop_accumulators(op)
        for point in itertools.product(*ranges):
            for a, i in zip(body.args, point):
                env[a] = np.asarray(i, dtype=np.int64)
            self.accumulate(op, acc, self.exec_iteration(body, env))
        return acc or None

    def loop_accumulators(self, op) -> list:
        """The results of a loop that reduces across its iterations, before the first one."""
        return [np.zeros(self.shape_of(r.ttype), dtype=r.ttype.dtype.np) for r in op.results]

    def accumulate(self, op, acc: list, contributions) -> None:
        for k, (kind, c) in enumerate(zip(op.reduce, contributions or ())):
            acc[k] = combine(kind)(acc[k], np.asarray(c, dtype=acc[k].dtype)).astype(acc[k].dtype)

    def op_IfOp(self, op, ins, env):
        return self.exec_block(op.regions[0 if bool(ins[0]) else 1], env)

    def op_ForOp(self, op: ForOp, ins, env):
        lo, hi, step = (int(x) for x in ins[:3])
        if step <= 0:
            raise InterpretError(f"tile.for: step must be positive, got {step}", op.loc)
        carried = list(ins[3:])
        body = op.body
        i = lo
        while i < hi:
            env[body.args[0]] = np.asarray(i, dtype=np.int64)
            for a, c in zip(body.args[1:], carried):
                env[a] = c
            carried = self.exec_block(body, env)
            i += step
        return carried

    # --- gpu dialect: the mapping does not change meaning (the reduction steps carry their
    # semantics, in the generated code's order of operations: kfc.ir.gpu_ops) --------------
    def op_LaunchOp(self, op, ins, env):
        body = op.body
        acc = self.loop_accumulators(op)
        for i in range(int(ins[0]), int(ins[1])):
            env[body.args[0]] = np.asarray(i, dtype=np.int64)
            self.accumulate(op, acc, self.exec_iteration(body, env))
        return acc or None

    def exec_iteration(self, body: Block, env: dict) -> list | None:
        """One iteration of a parallel loop, and what it yields: its barriers must end with every
        copy waited for."""
        outer, self.barriers = self.barriers, []
        try:
            yielded = self.exec_block(body, env)
            for bar, alloc in self.barriers:
                if bar.copies:
                    raise HazardError(f"{smem_ops.never_waited(bar.copies[0][0].name, bar.name)}: the iteration "
                                      f"ends with {bar.outstanding()}", alloc.loc, smem_ops.HINT_WAIT_BEFORE_END)
            return yielded
        finally:
            self.barriers = outer

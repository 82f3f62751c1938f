"""The oracle: a numpy interpreter for the IR.

Values are numpy arrays of the exact element type (ml_dtypes for bf16 and fp8); arithmetic on
narrow floats is done in fp32 and rounded back, as a GPU does. Each op carries its own
semantics (its `interpret` method, beside its verifier in kfc.ir.tile_ops, gpu_ops, smem_ops);
the interpreter runs blocks, binds dims and holds what those semantics share. Reductions and dots accumulate
in fp32. Parallel loops run their iterations one after another (they are independent, so the
order cannot matter for a valid program).

    outs = run(func, {"x": x, "w": w})          # outputs are allocated and NaN-poisoned
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import numpy as np

from ..diagnostics import InterpretError, KfcError
from . import constexpr
from .core import Block, Op, Value
from .dtypes import convert, poison_value
from .func import FuncOp
from .tile_ops import IndexDim, StoreOp, YieldOp
from .signature import bind_dims
from . import smem_ops
from .gpu_ops import combine
from .smem_ops import HazardError, SharedBuffer
from .types import MemSpace, SymDim, TensorType, bind_dim


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
        env[v] = convert(value, v.ttype.dtype)
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


@contextlib.contextmanager
def deep_regions():
    """Room for the few Python frames a region level takes, to the verifier's deepest nesting
    (kfc.ir.verifier.MAX_REGION_DEPTH regions: about 1 500 frames past Python's default 1 000)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 8000))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def run(func: FuncOp, args: dict[str, Any], dims: dict[str, int] | None = None,
        outputs: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Interpret `func` on numpy inputs; return its outputs by name."""
    dims, env = bind_arguments(func, args, dims, outputs)
    with np.errstate(all="ignore"), deep_regions():  # overflow and NaN are results here, as on the GPU
        Interpreter(func, dims).exec_block(func.body, env)
    return {v.name: env[v] for v in func.outputs}


def run_tracked(func: FuncOp, args: dict[str, Any], dims: dict[str, int] | None = None):
    """Like run, and also which op last wrote each output element: returns (outputs, writers)
    where writers[name] holds indices into writers["__ops__"] (-1: never written)."""
    dims, env = bind_arguments(func, args, dims)
    interp = Interpreter(func, dims)
    interp.writers = {v: np.full(env[v].shape, -1, dtype=np.int64) for v in func.outputs if env[v] is not None}
    interp.tracked_arrays = {id(env[v]): v for v in interp.writers}
    with np.errstate(all="ignore"), deep_regions():
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
        self.tracked_arrays: dict[int, Value] = {}  # id of a tracked output's array -> the output
        self._writer_index: dict[int, int] = {}
        self.barriers: list = []  # (MBarrier, its alloc op) made in the current loop iteration

    def shape_of(self, t: TensorType) -> tuple[int, ...]:
        shape = tuple(bind_dim(d, self.dims) for d in t.shape)
        if any(isinstance(d, SymDim) for d in shape):
            raise InterpretError(f"type {t} has an unbound symbol")
        return shape

    # --- blocks -----------------------------------------------------------------------------
    def exec_block(self, block: Block, env: dict) -> list | None:
        return self.exec_ops(block.ops, env)

    def exec_ops(self, ops, env: dict) -> list | None:
        """Run ops in order; a yield among them ends the run with its values."""
        for op in ops:
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
        """Run op by its own semantics (each op's `interpret`; a refined op, ptx.ld, inherits
        the op it refines)."""
        interpret = getattr(op, "interpret", None)
        if interpret is None:
            raise InterpretError(f"the interpreter has no semantics for {op.NAME}", op.loc,
                                 "give the op an interpret method; every op needs an oracle")
        return interpret(self, [env[v] for v in op.operands], env)

    # --- what the ops' semantics share ------------------------------------------------------
    @staticmethod
    def result_array(op: Op, value: np.ndarray, i: int = 0) -> np.ndarray:
        """value as result i of op: an array of that result's element type."""
        return convert(value, op.results[i].ttype.dtype)

    def empty_reduction(self, op: Op, identity: float) -> np.ndarray:
        """The result of a max or min over no elements: the identity (0 for integers)."""
        t = op.result.ttype
        return np.full(self.shape_of(t), identity if t.dtype.is_float else 0)

    # --- memory -----------------------------------------------------------------------------
    def gather_plan(self, op: Op, t: TensorType, index: tuple[IndexDim, ...], idx_values: list, extent):
        """Per dim: the positions addressed (in bounds or not) and which are valid."""
        it = iter(int(np.asarray(x)) for x in idx_values)
        plan = []
        for dim, (ix, n) in enumerate(zip(index, extent)):
            if ix.kind == "point":
                i = next(it)
                if not 0 <= i < n:
                    name = op.operands[1 if isinstance(op, StoreOp) else 0].name
                    what = f"'{name}'" if name else "a tensor"
                    raise InterpretError(f"{'a store into' if isinstance(op, StoreOp) else 'a read of'} {what} at "
                                         f"index {i} of dim {dim}, which has {n} elements: out of bounds",
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
        plan = self.gather_plan(op, t, index, idx_values, arr.shape)
        gather = [np.where(valid, pos, 0) for _, pos, valid in plan]
        vals = arr[np.ix_(*gather)] if gather else arr[()]
        if not all(valid.all() for _, _, valid in plan):  # else nothing lies outside: no mask to apply
            mask = np.ones(vals.shape, dtype=bool)
            for axis, (_, _, valid) in enumerate(plan):
                shape = [1] * len(plan)
                shape[axis] = len(valid)
                mask &= valid.reshape(shape)
            vals = np.where(mask, vals, np.asarray(other).astype(np_dtype))
        return np.asarray(vals).reshape(out_shape).astype(np_dtype)

    def readable(self, op: Op, arr):
        """The array a load reads: a shared buffer's data, once no copy into it is in flight."""
        if isinstance(arr, SharedBuffer):
            if arr.pending is not None:
                raise HazardError(f"{op.NAME}: {smem_ops.read_in_flight(arr.name, arr.pending.name)}", op.loc,
                                  smem_ops.HINT_WAIT_BEFORE_READ)
            return arr.data
        return arr

    def record_write(self, op: Op, dst, array: np.ndarray | None = None) -> None:
        """Which store wrote each element of a tracked output (run_tracked): the op's operand 1,
        or the output whose array is `array` (a store through a tensor map)."""
        if self.writers is None:
            return
        target = op.operands[1] if array is None else self.tracked_arrays.get(id(array))
        if target in self.writers:
            if id(op) not in self._writer_index:
                self._writer_index[id(op)] = len(self.writer_ops)
                self.writer_ops.append(op)
            self.writers[target][np.ix_(*dst)] = self._writer_index[id(op)]

    # --- loops: what the ops' semantics share ------------------------------------------------
    def loop_accumulators(self, op) -> list:
        """The results of a loop that reduces across its iterations, before the first one."""
        return [np.zeros(self.shape_of(r.ttype), dtype=r.ttype.dtype.np) for r in op.results]

    def accumulate(self, op, acc: list, contributions) -> None:
        for k, (kind, c) in enumerate(zip(op.reduce, contributions or ())):
            acc[k] = combine(kind)(acc[k], np.asarray(c, dtype=acc[k].dtype)).astype(acc[k].dtype)

    def exec_iteration(self, body: Block, env: dict) -> list | None:
        """One iteration of a parallel loop, and what it yields: its barriers must end with every
        copy waited for."""
        outer, self.barriers = self.barriers, []
        try:
            yielded = self.exec_block(body, env)
            self.check_barriers_drained()
            return yielded
        finally:
            self.barriers = outer

    def check_barriers_drained(self) -> None:
        """The barriers made in this iteration (or cluster of CTAs) end with no copy unwaited."""
        for bar, alloc in self.barriers:
            if bar.copies:
                raise HazardError(f"{smem_ops.never_waited(bar.copies[0][0].name, bar.name)}: the iteration "
                                  f"ends with {bar.outstanding()}", alloc.loc, smem_ops.HINT_WAIT_BEFORE_END)

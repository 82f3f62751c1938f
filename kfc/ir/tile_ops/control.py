"""The tile dialect's control flow: parallel loops (with reductions across iterations),
sequential loops with carried values, branches, and the yield that ends their regions."""

from __future__ import annotations

import itertools

import attrs
import numpy as np

from ...diagnostics import InterpretError
from ..core import Op, Value, define_op
from ..dtypes import DType
from ..types import MemSpace, TensorType
from .checks import check_int_scalar, tensor_of


def verify_loop_reductions(op: Op, body) -> None:
    """A parallel loop's results are reductions across its iterations: the body ends with a
    tile.yield of each iteration's contribution, one `reduce` kind per result, and a result has
    its contribution's dtype and shape (its layout, if any, stays inside the loop). Sums run in
    f32 so that every order of accumulation rounds alike."""
    kinds = op.reduce
    if len(kinds) != len(op.results):
        raise op.error(f"{len(op.results)} result(s) need as many reduce kinds, has {len(kinds)}")
    for k in kinds:
        if k not in LOOP_REDUCE_KINDS:
            raise op.error(f"reduce kind {k!r} is not one of {', '.join(LOOP_REDUCE_KINDS)}")
    ops = body.ops
    if not op.results:
        if ops and isinstance(ops[-1], YieldOp):
            raise op.error("a parallel loop without results ends without tile.yield")
        return
    if not ops or not isinstance(ops[-1], YieldOp):
        raise op.error("a parallel loop with results ends with a tile.yield of each iteration's contribution")
    yielded = ops[-1].operands
    if len(yielded) != len(op.results):
        raise op.error(f"yields {len(yielded)} value(s) for {len(op.results)} result(s)")
    for i, (y, r) in enumerate(zip(yielded, op.results)):
        yt, rt = tensor_of(op, y, "contribution"), tensor_of(op, r, "result")
        if yt.dtype is not DType.F32:
            raise op.error(f"contribution {i} is {yt}; reductions across a parallel loop accumulate f32",
                           "convert the contribution with f32(...)")
        if yt.space is not MemSpace.REG or rt.space is not MemSpace.REG or yt.shape != rt.shape \
                or yt.dtype != rt.dtype or rt.layout is not None:
            raise op.error(f"result {i} is {rt} for contributions of {yt}: a result has its contribution's dtype "
                           "and shape, without a layout")


LOOP_REDUCE_KINDS = ("sum",)


@define_op("tile.parallel", traits={"loop"})
class ParallelOp(Op):
    """Independent iterations over a box of indices: operands are n lower then n upper bounds;
    the region's n arguments are the indices. Results, if any, are reductions across the
    iterations (`reduce`, one kind per result) of what each iteration yields: `dw[:] += ...`
    inside the loop."""

    reduce: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @property
    def rank(self) -> int:
        return len(self.operands) // 2

    @property
    def lowers(self) -> tuple[Value, ...]:
        return self.operands[: self.rank]

    @property
    def uppers(self) -> tuple[Value, ...]:
        return self.operands[self.rank:]

    @property
    def body(self):
        return self.regions[0]

    def verify_(self) -> None:
        if len(self.regions) != 1:
            raise self.error("needs exactly one region")
        verify_loop_reductions(self, self.body)
        n = len(self.body.args)
        if n == 0 or len(self.operands) != 2 * n:
            raise self.error(f"{n} indices need {2 * n} bound operands, has {len(self.operands)}")
        for v in self.operands:
            check_int_scalar(self, v, "bound")
        for a in self.body.args:
            if a.type != TensorType(DType.INDEX):
                raise self.error(f"index argument must be index, not {a.type}")

    def interpret(self, interp, ins, env):
        n = self.rank
        ranges = [range(int(lo), int(hi)) for lo, hi in zip(ins[:n], ins[n:])]
        body = self.body
        acc = interp.loop_accumulators(self)
        for point in itertools.product(*ranges):
            for a, i in zip(body.args, point):
                env[a] = np.asarray(i, dtype=np.int64)
            interp.accumulate(self, acc, interp.exec_iteration(body, env))
        return acc or None


@define_op("tile.for", traits={"loop"})
class ForOp(Op):
    """Sequential loop: operands lower, upper, step, then the initial carried values; the
    region's arguments are the induction variable and the carried values; it ends with a
    tile.yield of the next carried values; the results are the final ones."""

    @property
    def body(self):
        return self.regions[0]

    @property
    def inits(self) -> tuple[Value, ...]:
        return self.operands[3:]

    def verify_(self) -> None:
        if len(self.regions) != 1:
            raise self.error("needs exactly one region")
        if len(self.operands) < 3:
            raise self.error("needs lower, upper and step operands")
        for v in self.operands[:3]:
            check_int_scalar(self, v, "bound")
        inits = self.inits
        args = self.body.args
        if len(args) != len(inits) + 1:
            raise self.error(f"region has {len(args)} arguments for {len(inits)} carried values")
        if args[0].type != TensorType(DType.INDEX):
            raise self.error(f"induction variable must be index, not {args[0].type}")
        if len(self.results) != len(inits):
            raise self.error(f"{len(inits)} carried values but {len(self.results)} results")
        ops = self.body.ops
        if not ops or not isinstance(ops[-1], YieldOp):
            raise self.error("body must end with tile.yield")
        yielded = ops[-1].operands
        if len(yielded) != len(inits):
            raise self.error(f"yields {len(yielded)} values for {len(inits)} carried values")
        for i, (init, arg, y, r) in enumerate(zip(inits, args[1:], yielded, self.results)):
            if not (init.type == arg.type == y.type == r.type):
                raise self.error(f"carried value {i} changes type: starts as {init.type}, "
                                 f"yields {y.type}",
                                 "a carried value must keep its dtype and shape; cast it back")

    def interpret(self, interp, ins, env):
        lo, hi, step = (int(x) for x in ins[:3])
        if step <= 0:
            raise InterpretError(f"tile.for: step must be positive, got {step}", self.loc)
        carried = list(ins[3:])
        body = self.body
        i = lo
        while i < hi:
            env[body.args[0]] = np.asarray(i, dtype=np.int64)
            for a, c in zip(body.args[1:], carried):
                env[a] = c
            carried = interp.exec_block(body, env)
            i += step
        return carried


@define_op("tile.if", traits={"branch"}, operands=1)
class IfOp(Op):
    """Runs its first region where the scalar bool operand holds, its second otherwise; each
    region ends with a tile.yield of the values the results take (the names a branch assigns
    that live on after the `if`)."""

    def verify_(self) -> None:
        c = tensor_of(self, self.operands[0], "condition")
        if not (c.is_scalar and c.dtype is DType.BOOL and c.space is MemSpace.REG):
            raise self.error(f"the condition must be a scalar bool, not {c}",
                             "compare to make one, e.g. if n > 0 { ... }")
        if len(self.regions) != 2:
            raise self.error("needs a then region and an else region")
        for name, region in zip(("then", "else"), self.regions):
            if region.args:
                raise self.error(f"the {name} region takes no arguments")
            ops = region.ops
            if not ops or not isinstance(ops[-1], YieldOp):
                raise self.error(f"the {name} region must end with tile.yield")
            yielded = ops[-1].operands
            if len(yielded) != len(self.results):
                raise self.error(f"the {name} region yields {len(yielded)} value(s) for {len(self.results)} result(s)")
            for i, (y, r) in enumerate(zip(yielded, self.results)):
                if y.type != r.type:
                    raise self.error(f"result {i} is {r.type} but the {name} region yields {y.type}",
                                     "both branches must give a name the same dtype and shape")

    def interpret(self, interp, ins, env):
        return interp.exec_block(self.regions[0 if bool(ins[0]) else 1], env)


@define_op("tile.yield", traits={"terminator"}, results=0)
class YieldOp(Op):
    pass

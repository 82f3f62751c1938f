"""A tile program of several top-level parallel loops runs as a kernel per loop, launched in the
loops' order on one stream: a later loop reads what an earlier one stored (the launch between
them orders the stores before the loads), as the interpreter, which runs the loops in turn, does.

    op pair(x: ...) -> (z: ...) {
      y = scratch([B, ...])                         # a workspace of the call
      parallel b in 0..B { y[b, ...] = ... }        # kernel 1
      parallel b in 0..B { z[b, ...] = ...y... }    # kernel 2, after kernel 1
    }

Each kernel is the program with one of the loops and every top-level scalar (the emitter's
rules write the scalars each kernel reads): it takes every argument, so the runtime passes a
later kernel the op's inputs and scalars as it does the first one's. A scratch tensor is a
workspace parameter of every kernel (kfc.codegen.c_names.argument_params), which the runtime
allocates per call."""

from __future__ import annotations

import attrs

from ..ir.core import Block
from ..ir.func import FuncOp
from ..ir.tile_ops import ParallelOp, ScratchOp
from .c_names import scratch_name
from .rules import rule


def kernel_programs(func: FuncOp) -> list[FuncOp]:
    """The program of each kernel, in launch order: `func` itself where it has one loop."""
    loops = [op for op in func.body.ops if isinstance(op, ParallelOp)]
    if len(loops) < 2:
        return [func]
    return [attrs.evolve(func, regions=(Block(func.body.args, [op for op in func.body.ops
                                                               if op is loop or not isinstance(op, ParallelOp)]),))
            for loop in loops]


def kernel_name(first: str, k: int) -> str:
    """The C name of a program's k-th kernel (0: the op's own)."""
    return first if k == 0 else f"{first}_k{k}"


@rule(ScratchOp)
def _scratch(em, op) -> None:
    """Nothing to write: the tensor is the kernel's workspace parameter of that name."""
    em.names[op.result] = scratch_name(op.result)

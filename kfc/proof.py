"""The compiled IR proven, not only the source: `kfc check` runs the interpreter on the IR each
pass leaves, at each check shape, against the same reference on the same inputs. The final IR
is what the code generator turns into CUDA (and what the GPU must agree with); where it departs
from the reference and the source does not, the check runner (kfc.check.runner) replays the
stages in order to name the first pass whose IR departs."""

from __future__ import annotations

import attrs

from .compile import fixed_dims, lower_op
from .diagnostics import InternalError, KfcError
from .ir.func import FuncOp
from .model.spec import OpSpec
from .model.target import Target
from .passes import PassContext


@attrs.frozen
class Stages:
    """The IR after each pass of the pipeline `compile` would run at one check shape."""

    pipeline: str
    stages: tuple[tuple[str, FuncOp], ...]  # (pass, IR after it), in order; the last is the final IR


@attrs.frozen
class NotCompiled:
    """Why an op has no final IR at a shape (kfc compile refuses it there)."""

    reason: str


def lower_stages(spec: OpSpec, target: Target, pipeline: str | None, dims: dict[str, int]) -> Stages | NotCompiled:
    """Run the pipeline at `dims` (all but the row count fixed, as kfc compile does) keeping the
    IR after every pass."""
    ctx = PassContext(target=target, check=spec.check, where="a check shape", stages=[])
    try:
        lowering = lower_op(spec, target, pipeline, dims, ctx)
    except InternalError:
        raise  # a pass that crashes or breaks the IR is a bug to report, not a reason to skip
    except KfcError as e:
        return NotCompiled(e.message)
    return Stages(str(lowering.pipeline), tuple(ctx.stages) or (("(no pass)", lowering.func),))


def stages_by_shape(spec: OpSpec, target: Target, pipeline: str | None):
    """lower_stages as a function of the dims, lowering once for each set of fixed dims: the
    pipeline fixes every dim but the row count, so check cases that differ only in their rows
    (or scaled down only in them) run the same IR."""
    lowered: dict[tuple, Stages | NotCompiled] = {}

    def at(dims: dict[str, int]) -> Stages | NotCompiled:
        key = tuple(sorted(fixed_dims(spec.func, dims).items()))
        if key not in lowered:
            lowered[key] = lower_stages(spec, target, pipeline, dims)
        return lowered[key]
    return at

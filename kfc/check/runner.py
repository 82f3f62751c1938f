"""Prove an op description on the CPU: for every check shape (scaled down where huge), every
seed and both states of the optional inputs, run the specialised IR in the interpreter and the
reference in torch on the same fresh random inputs, and compare every output.

An output passes when it has no NaN or infinity where the reference is finite (outputs start
poisoned with NaN, so an unwritten element fails), its relative RMSE ‖out − ref‖/‖ref‖ is within
the dtype's tolerance, and every element is within tol · (|ref| + rms(ref)).
"""

from __future__ import annotations

import math
import secrets
from typing import Any, Callable

import attrs
import numpy as np

from ..diagnostics import KfcError
from ..model.spec import CheckSpec, OpSpec
from ..ir.interpreter import run
from ..ir.specialize import specialize
from ..ir.types import MemSpace, SymDim, bind_dim
from ..ir.verifier import verify
from .generators import GENERATORS, draw_default
from .sandbox import Limits, ReferenceSandbox, shared_sandbox
from .tensors import to_torch
from .tolerance import compare_arrays
from ..ir import constexpr

DEFAULT_BUDGET = 1 << 20  # elements over all tensors of one case, for the interpreter


@attrs.frozen
class OutputResult:
    case: int
    dims: dict[str, int]
    scaled_from: dict[str, int] | None
    variant: str
    seed: int
    output: str
    dtype: str
    max_abs: float
    rel_rmse: float
    tol: float
    ok: bool
    note: str = ""
    instance: str = ""  # the op with its type arguments, e.g. rmsnorm_f16
    ir: str = "source"  # which IR the interpreter ran: the op as written, or "final" (after the passes)


# where a final IR's failure comes from when the op as written fails the same comparison
SOURCE_DEPARTS = "none: the source departs too"

def case_elements(spec: OpSpec, dims: dict[str, int]) -> int:
    total = 0
    for v in spec.func.args:
        t = v.ttype
        if t.space is not MemSpace.REG:
            total += math.prod(max(bind_dim(d, dims), 0) for d in t.shape)
    return total


def scale_down(spec: OpSpec, dims: dict[str, int], budget: int) -> dict[str, int]:
    """Halve the largest dimension until one case's tensors hold at most `budget` elements; a
    dimension is halved only while every dim of every tensor stays at least 1 (`N - 5000`)."""
    dims = dict(dims)
    floors = dim_floors(spec.func)
    while case_elements(spec, dims) > budget:
        for name in sorted(dims, key=lambda k: -dims[k]):
            half = (dims[name] + 1) // 2
            if half < dims[name] and half >= floors.get(name, 1):
                dims[name] = half
                break
        else:
            break
    return dims


def dim_floors(func) -> dict[str, int]:
    """The least size of each shape symbol that keeps every dim it appears in at least 1."""
    out: dict[str, int] = {}
    for v in func.args:
        for d in v.ttype.shape:
            if isinstance(d, SymDim):
                out[d.name] = max(out.get(d.name, 1), 1 - d.offset)
    return out


def make_inputs(spec: OpSpec, dims: dict[str, int], rng: np.random.Generator, with_optional: bool) -> dict[str, Any]:
    return draw_inputs(spec.func, spec.check, dims, rng, with_optional)


def draw_inputs(func, check: CheckSpec | None, dims: dict[str, int], rng: np.random.Generator,
                with_optional: bool = True) -> dict[str, Any]:
    """Fresh random arguments for `func` at `dims`, drawn as the check block says."""
    check = check or CheckSpec()
    args: dict[str, Any] = {}
    for v in func.inputs:
        t = v.ttype
        if t.space is MemSpace.REG:
            default = func.default_of(v.name)
            if default is None:  # a scalar with no default: a benign positive value
                args[v.name] = float(rng.uniform(0.5, 1.5)) if t.dtype.is_float else int(rng.integers(1, 10))
            continue
        if t.optional and not with_optional:
            args[v.name] = None
            continue
        shape = tuple(bind_dim(d, dims) for d in t.shape)
        gen = check.inputs.get(v.name)
        if gen is None:
            args[v.name] = draw_default(rng, t, shape)
            continue
        try:
            args[v.name] = GENERATORS[gen.name].draw(rng, shape, t.dtype, dims, gen.args)
        except ValueError as e:
            shown = ", ".join(f"{k}={n}" for k, n in dims.items())
            raise KfcError(f"cannot draw {v.name} at {shown}: {e}", gen.span,
                           GENERATORS[gen.name].usage) from None
    return args


def require_reference(spec: OpSpec) -> None:
    check = spec.check
    if check is None or check.reference is None:
        raise KfcError(f"{spec.name} has no reference to check against", check.span if check else spec.func.loc,
                       hint='add check { reference = "..." shapes = [...] } to the .kfc file')


def reference_call(spec: OpSpec, args: dict[str, Any], dims: dict[str, int]):
    """The reference's request for `args` (numpy arrays or torch tensors by input name): the
    inputs as (name, kind, value) and the outputs as (name, shape)."""
    func = spec.func
    inputs = []
    for v in func.inputs:
        a = args.get(v.name)
        if v.ttype.space is MemSpace.REG:
            value = a if a is not None else scalar_default(spec, v.name, dims)
            inputs.append((v.name, "scalar", value.item() if hasattr(value, "item") else value))
        elif a is None:
            inputs.append((v.name, "absent", None))
        else:
            inputs.append((v.name, "tensor", to_torch(a, v.ttype.dtype) if isinstance(a, np.ndarray) else a))
    outputs = [(v.name, tuple(int(bind_dim(d, dims)) for d in v.ttype.shape)) for v in func.outputs]
    return inputs, outputs


def run_reference(spec: OpSpec, args: dict[str, Any], dims: dict[str, int], limits: Limits | None = None,
                  sandbox: ReferenceSandbox | None = None) -> list:
    """The reference's outputs for `args`, computed in its child process (kfc.check.sandbox):
    float64 numpy arrays for numpy or CPU inputs; float32 tensors on the GPU for CUDA inputs."""
    require_reference(spec)
    check = spec.check
    inputs, outputs = reference_call(spec, args, dims)
    box = sandbox or shared_sandbox(limits, "cpu")
    return box.call(check.reference, check.reference_is_function, check.reference_span, inputs,
                    {**spec.sizes, **dims}, outputs)


def scalar_default(spec: OpSpec, name: str, dims: dict[str, int]):
    d = spec.func.default_of(name)
    return constexpr.evaluate(d, dims) if isinstance(d, str) else d


def compare(out: np.ndarray, ref: np.ndarray, tol: float) -> tuple[float, float, bool, str]:
    """(max abs error, relative RMSE, ok, what is wrong) by the rule of kfc.check.tolerance."""
    c = compare_arrays(out.astype(np.float64), ref.astype(np.float64), tol)
    if c.shape_mismatch:
        return math.inf, math.inf, False, f"shape {list(out.shape)} vs reference {list(ref.shape)}"
    if c.unwritten:
        note = f"{c.unwritten} element(s) NaN/inf or unwritten, first at {list(c.first_bad)}"
    elif c.special_mismatch:
        note = "reference has NaN/inf where the output differs"
    elif tol == 0.0 and not c.ok:
        note = "not equal (tolerance 0)"
    elif c.beyond:
        note = f"{c.beyond} element(s) off, first at {list(c.first_bad)}"
    elif not c.ok:
        note = "relative RMSE over tolerance"
    else:
        note = ""
    return c.max_abs, c.rel_rmse, c.ok, note


def check_op(spec: OpSpec, seeds: list[int] | None = None, full: bool = False, budget: int = DEFAULT_BUDGET,
             shapes: list[dict[str, int]] | None = None,
             on_result: Callable[[OutputResult], None] | None = None,
             limits: Limits | None = None,
             stages_at: Callable[[dict[str, int]], Any] | None = None) -> list[OutputResult]:
    """Run every case; return one result per (case, variant, seed, output). With `stages_at`
    (dims -> the IR after each pass of the pipeline at those dims, as `.stages`, or something
    without them where the op does not compile there), the final IR runs on the same inputs
    too, with its own results; where it departs from the reference, the first pass whose IR
    departs is named in the note."""
    check = spec.check
    if check is None:
        raise KfcError(f"{spec.name} has no check block", spec.func.loc, hint="add check { reference = ... shapes = [...] }")
    cases = shapes if shapes is not None else list(check.shapes)
    if not cases:
        raise KfcError(f"{spec.name}'s check block has no shapes", check.span or spec.func.loc,
                       hint="add shapes = [{M: ..., N: ...}, ...] to it")
    require_reference(spec)
    shared_sandbox(limits, "cpu").warm()
    if seeds is None:
        seeds = list(check.seeds) + [secrets.randbits(31)]
    optional = [v.name for v in spec.func.inputs if v.ttype.optional]
    variants = [(True, "all inputs")] if not optional else [(True, f"{', '.join(optional)} given"),
                                                             (False, f"{', '.join(optional)} absent")]
    results: list[OutputResult] = []
    for ci, dims in enumerate(cases):
        run_dims = dict(dims) if full else scale_down(spec, dims, budget)
        scaled = dict(dims) if run_dims != dims else None
        func = verify(specialize(spec.func, run_dims, where=f"check case {ci}" + (" scaled down" if scaled else "")))
        lowered = getattr(stages_at(run_dims), "stages", None) if stages_at is not None else None
        for with_opt, label in variants:
            for seed in seeds:
                rng = np.random.default_rng(seed)
                try:
                    args = make_inputs(spec, run_dims, rng, with_opt)
                except MemoryError:
                    shown = ", ".join(f"{k}={v}" for k, v in run_dims.items())
                    raise KfcError(f"the inputs of check case {ci} ({shown}) do not fit in memory", spec.func.loc,
                                   "check smaller shapes: leave out --full, or lower --budget") from None
                before = {k: v.copy() for k, v in args.items() if isinstance(v, np.ndarray)}
                try:
                    outs = run(func, args)
                except MemoryError:
                    shown = ", ".join(f"{k}={v}" for k, v in run_dims.items())
                    raise KfcError(f"the interpreter ran out of memory at check case {ci} ({shown})",
                                   spec.func.loc, "check smaller shapes: leave out --full, or lower --budget") from None
                refs = run_reference(spec, args, run_dims, limits)
                changed = [k for k, v in before.items() if not np.array_equal(v, args[k], equal_nan=True)]
                for v, ref in zip(spec.func.outputs, refs):
                    dtype = str(v.ttype.dtype)
                    tol = check.tolerance_for(dtype)
                    max_abs, rel, ok, note = compare(outs[v.name], ref, tol)
                    if changed:
                        ok, note = False, f"input {changed[0]} was modified"
                    res = OutputResult(ci, run_dims, scaled, label, seed, v.name, dtype, max_abs, rel, tol, ok, note,
                                       spec.instance_name)
                    results.append(res)
                    if on_result is not None:
                        on_result(res)
                if lowered:
                    source_ok = all(r.ok for r in results[-len(refs):])
                    for res in final_ir_results(spec, lowered, {**args, **before}, refs, source_ok,
                                                (ci, run_dims, scaled, label, seed)):
                        results.append(res)
                        if on_result is not None:
                            on_result(res)
    return results


def final_ir_results(spec: OpSpec, stages, inputs: dict, refs, source_ok: bool, where: tuple) -> list[OutputResult]:
    """The final IR (the last of `stages`, (pass, IR) pairs) run on copies of the inputs and
    compared with the reference; where it departs and the source did not, the first pass whose
    IR departs."""
    check = spec.check
    outputs = spec.func.outputs

    def compared(func):
        args = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}
        outs = run(func, args)
        return [(v, *compare(outs[v.name], ref, check.tolerance_for(str(v.ttype.dtype))))
                for v, ref in zip(outputs, refs)]

    final = compared(stages[-1][1])
    departed = ""
    if not source_ok:
        departed = SOURCE_DEPARTS
    elif not all(ok for _, _, _, ok, _ in final):
        departed = "after pass " + next((name for name, func in stages
                                         if not all(ok for _, _, _, ok, _ in compared(func))), stages[-1][0])
    ci, run_dims, scaled, label, seed = where
    return [OutputResult(ci, run_dims, scaled, label, seed, v.name, str(v.ttype.dtype), max_abs, rel,
                         check.tolerance_for(str(v.ttype.dtype)), ok,
                         note if ok else f"{note}; first departs: {departed}".lstrip("; "),
                         spec.instance_name, "final")
            for v, max_abs, rel, ok, note in final]

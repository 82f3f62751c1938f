"""Running a pipeline: target gating, the verifier after every pass, `--verify-each`
(the interpreter before and after each pass on the same random inputs), IR printing, per-pass
timing, and a dump folder (KFC_DUMP_DIR)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from ..diagnostics import InternalError, KfcError, VerifyError
from ..ir.func import FuncOp
from ..ir.printer import print_ir
from ..ir.verifier import verify
from ..model.target import Target
from ..check.runner import compare, draw_inputs
from ..check.tolerance import compare_arrays
from ..ir.interpreter import run_tracked
from ..model.spec import CheckSpec
from .base import PASSES, Pass, PassCrashed, PassError
from .context import PassContext
from .pipeline import Pipeline


class PassBrokeIR(VerifyError, InternalError):
    """The verifier rejected a pass's output: a bug in the pass."""


class PassManager:
    def __init__(self, pipeline: Pipeline, ctx: PassContext) -> None:
        self.pipeline = pipeline
        self.ctx = ctx
        # --verify-each: per seed, the last pass's output, its dims, inputs and results; the next
        # pass's input is that same function, so its results need not be computed again
        self._last_results: dict[int, tuple[FuncOp, dict, dict, dict]] = {}
        if ctx.dump_dir is None and os.environ.get("KFC_DUMP_DIR"):
            ctx.dump_dir = Path(os.environ["KFC_DUMP_DIR"])

    def check_target(self) -> None:
        """Arch gating, before any pass runs: fail early with what to do instead."""
        t = self.ctx.target
        for p in self.pipeline:
            missing = sorted(f for f in p.required_features() if not t.has(f))
            if missing:
                raise PassError(f"pass {p.NAME} needs {', '.join(missing)}, which {t} ({t.family}) does not have",
                                hint=_gating_hint(missing[0], t))

    def check_print_requests(self) -> None:
        """--print-ir-before/--print-ir-after name passes of this pipeline (a typo prints nothing)."""
        names = [p.NAME for p in self.pipeline]
        for flag, wanted in (("--print-ir-before", self.ctx.print_ir_before),
                             ("--print-ir-after", self.ctx.print_ir_after)):
            for name in sorted(wanted):
                if name not in PASSES:
                    raise PassError(f"{flag} {name}: there is no pass named {name!r}",
                                    hint=f"the pipeline's passes are {', '.join(dict.fromkeys(names)) or 'none'}")
                if name not in names:
                    raise PassError(f"{flag} {name}: the pipeline {self.pipeline} has no {name} pass",
                                    hint=f"its passes are {', '.join(dict.fromkeys(names)) or 'none'}")

    def run(self, func: FuncOp) -> FuncOp:
        self.check_target()
        self.check_print_requests()
        self._dump(0, "input", func)
        for i, p in enumerate(self.pipeline, start=1):
            if p.NAME in self.ctx.print_ir_before:
                self._print(f"IR before {p}", func)
            started = time.perf_counter()
            try:
                new = p.run(func, self.ctx)
            except KfcError:
                raise
            except Exception as e:  # noqa: BLE001 - a crashing pass is named, with its input dumped
                raise PassCrashed(f"pass {p} failed: {type(e).__name__}: {e}", func.loc,
                                  "this is a bug in the pass; rerun with KFC_DEBUG=1 for the traceback, and "
                                  "KFC_DUMP_DIR keeps the IR it got") from e
            self.ctx.timings.append((str(p), time.perf_counter() - started))
            try:
                verify(new)
            except VerifyError as e:
                raise PassBrokeIR(f"after pass {p}: {e.message}", e.span,
                                  e.hint or f"the pass {p.NAME} produced invalid IR; this is a bug in the pass") from None
            if self.ctx.verify_each is not None:
                self._verify_semantics(p, func, new)
            self._dump(i, p.NAME, new)
            if self.ctx.stages is not None:
                self.ctx.stages.append((str(p), new))
            if self.ctx.print_ir_after_all or p.NAME in self.ctx.print_ir_after:
                self._print(f"IR after {p}", new)
            func = new
        if self.ctx.timing:
            total = sum(t for _, t in self.ctx.timings)
            print("pass timing:", file=self.ctx.out)
            for name, t in self.ctx.timings:
                print(f"  {t * 1e3:8.2f} ms  {name}", file=self.ctx.out)
            print(f"  {total * 1e3:8.2f} ms  total", file=self.ctx.out)
        return func

    # --- --verify-each ------------------------------------------------------------------------
    def _verify_semantics(self, p: Pass, before: FuncOp, after: FuncOp) -> None:
        ve = self.ctx.verify_each
        check = ve.check or CheckSpec()
        dims = {k: v for k, v in ve.dims.items() if k in set(before.symbols) | set(after.symbols)}
        for seed in ve.seeds:
            args = draw_inputs(before, check, {**ve.dims, **dims}, np.random.default_rng(seed))
            ref = self._results_of(before, args, dims, seed)
            got, writers = run_tracked(after, {k: _copy(v) for k, v in args.items()}, dims)
            self._last_results[seed] = (after, dims, args, got)
            for out in after.outputs:
                tol = check.tolerance_for(str(out.ttype.dtype))
                a, b = got[out.name], ref[out.name].astype(np.float64)
                _, rel, ok, note = compare(a, b, tol)
                if ok:
                    continue
                where = compare_arrays(a.astype(np.float64), b, tol).first_bad
                writer = writers[out.name][where] if where else None
                who = ("an element no op wrote" if writer is None or writer < 0 else None)
                span = None
                if who is None:
                    op = writers["__ops__"][writer]
                    who = f"{op.NAME}"
                    span = op.loc
                before_v = b[where] if where else float("nan")
                after_v = a[where] if where else float("nan")
                raise PassError(
                    f"pass {p} changed the results: output {out.name} differs at {list(where)} "
                    f"({before_v:.6g} before, {after_v:.6g} after; {note or f'relative RMSE {rel:.3g}'}), "
                    f"written by {who}" + (f" at {span}" if span is not None else ""),
                    span, f"the pass {p.NAME} is wrong for this IR; run with KFC_DUMP_DIR to compare the IR "
                          "before and after it")

    def _results_of(self, func: FuncOp, args: dict, dims: dict, seed: int) -> dict:
        """The interpreter's results of `func` on `args`: those the previous pass's check computed
        when `func` is its output, run on the same dims and bit-identical inputs; else run now."""
        last = self._last_results.get(seed)
        if last is not None and last[0] is func and last[1] == dims and _same_inputs(last[2], args):
            return last[3]
        return run_tracked(func, {k: _copy(v) for k, v in args.items()}, dims)[0]

    # --- output -------------------------------------------------------------------------------
    def _print(self, title: str, func: FuncOp) -> None:
        print(f"// ----- {title} -----", file=self.ctx.out)
        self.ctx.out.write(print_ir(func))

    def _dump(self, index: int, name: str, func: FuncOp) -> None:
        if self.ctx.dump_dir is None:
            return
        d = Path(self.ctx.dump_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{index:02d}-{name}.kir").write_text(print_ir(func))


def _copy(v):
    return v.copy() if isinstance(v, np.ndarray) else v


def _same_inputs(a: dict, b: dict) -> bool:
    """The same names holding bit-identical values (NaNs included, dtypes too)."""
    if a.keys() != b.keys():
        return False
    for k, x in a.items():
        x, y = np.asarray(x), np.asarray(b[k])
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return False
    return True


def _gating_hint(feature: str, t: Target) -> str:
    if feature == "wgmma":
        return ("wgmma is Hopper-only (sm_90a); on Blackwell (sm_100a) leave accelerate-matmul's mma at auto, "
                "or give mma=tcgen05")
    if feature == "tcgen05":
        return ("tcgen05 is Blackwell-only (sm_100a); on Hopper (sm_90a) leave accelerate-matmul's mma at auto, "
                "or give mma=wgmma")
    return f"choose a newer target (--target sm_90a or sm_100a), or drop the pass that needs {feature}"

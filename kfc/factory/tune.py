"""`kfc tune`: rounds of propose -> apply passes (verified) -> compile in parallel -> gate on the
GPU -> time -> record -> update, for one op instance, target and shape.

Every candidate is recorded in the knowledge base in its own transaction the moment its
outcome is known, so an interrupted tune (Ctrl-C, or a killed process) loses nothing already
recorded. Running the same command again resumes the interrupted run: candidates that were in
flight are evaluated first, the ones already evaluated count against the budget, and the
policy sees every earlier trial. After a run that finished, the same command starts a new run
that searches further (nothing tried is tried again). The default pipeline is timed first as
the baseline (not counted in the budget) and stays the answer unless a candidate beats it.
"""

from __future__ import annotations

import json
import math
import platform
from typing import Any, Callable

import attrs

from ..compile import fixed_dims, row_dims
from ..diagnostics import KfcError
from ..model.spec import OpSpec
from ..kb.fingerprint import op_features, op_fingerprint
from ..kb.store import KnowledgeBase, canonical_shape
from ..passes import default_pipeline
from ..passes.base import PassError
from ..passes.matmul_match import tma_product_rows
from ..passes.context import PassContext
from ..passes.pipeline import parse_pipeline
from ..passes.row_cost import bound_by_issue
from ..passes.rows import find_row_loop, narrowest_load, row_length
from ..passes.stage_rows import stretches
from ..ir.specialize import specialize
from ..model.target import Target
from .evaluate import to_outcome
from .model import TuneContext
from ..model.records import Outcome, Proposal, Stage, Trial
from .problem import gate_cases
from .matmul_space import MatmulSpace, matmul_space, product_roles
from .space import SearchSpace
from ..codegen.backend import program_kind
from ..codegen.toolchain import find_toolchain
from ..provenance import git_commit


# trials of the knowledge base a policy is shown: enough of a similar op's record to see its
# other good basins, not only its best few configurations
PRIOR_TRIALS = 64


@attrs.frozen
class TuneResult:
    run_id: int
    op: str
    shape: dict[str, int]
    candidates: int                  # evaluated in this run (the baseline not counted)
    baseline: Trial | None
    best: Trial | None               # the fastest timed trial, the baseline included
    interrupted: bool = False

    @property
    def speedup(self) -> float | None:
        if self.best is None or self.baseline is None or not self.baseline.outcome.median_us:
            return None
        return self.baseline.outcome.median_us / self.best.outcome.median_us


def space_for(spec: OpSpec, dims: dict[str, int], target: Target) -> SearchSpace | MatmulSpace:
    """What the tuner searches for this op: a matrix product's tiles, stages and roles, or a row
    program's layout."""
    fixed = fixed_dims(spec.func, dims)
    func = specialize(spec.func, fixed, partial=True)
    if program_kind(func)[0] == "matmul":
        return matmul_space(func, target, default_pipeline("matmul", tma_product_rows(func), target),
                            product_roles(spec.func))
    try:
        loop = find_row_loop(func)
        n = row_length(loop, func)
    except PassError as e:
        raise PassError(f"kfc tune searches row programs and matrix products; {spec.name} is neither: {e.message}",
                        e.span) from None
    sizes = [v.ttype.dtype.itemsize for v in func.args if v.ttype.space.value != "reg" and v.ttype.rank >= 1]
    heavy = bound_by_issue(func, loop.body, PassContext(target, check=spec.check))[2]
    return SearchSpace(n, min(sizes) if sizes else 4, target.has("cluster"), reads=stretches(loop.body),
                       heavy=heavy, load_itemsize=narrowest_load(loop.body))


def tune(spec: OpSpec, target: Target, dims: dict[str, int], budget: int, policy, kb: KnowledgeBase, evaluator,
         batch: int | None = None, env: dict[str, Any] | None = None,
         on_trial: Callable[[Trial, Trial | None, int], None] | None = None) -> TuneResult:
    """Tune one instance at one shape; `on_trial(trial, best, n_done)` reports progress."""
    space = space_for(spec, dims, target)
    fp, features = op_fingerprint(spec.func), op_features(spec.func)
    op_id = kb.op_id(fp, spec.instance_name, features)
    run_id = kb.unfinished_run(op_id, target.name, dims, policy.name)
    if run_id is None:
        run_id = kb.start_run(op_id, target.name, dims, policy.name, budget, env or default_env())
        done, pending = 0, []
    else:
        kb.reopen_run(run_id, budget)
        done = sum(1 for t in kb.trials(run_id=run_id) if t.proposal.proposer != "baseline")
        pending = kb.pending(run_id)
    cases = gate_cases(spec, dims, row_dims(spec.func))
    batch = batch or max(2, 2 * getattr(evaluator, "n_gpus", 1))
    status = "interrupted"

    def evaluate(proposals: list[Proposal], baseline: Outcome | None, ids: list[int] | None = None) -> list[Trial]:
        ids = ids or [kb.add_candidate(run_id, op_id, target.name, dims, p, space.config_of(p.pipeline))
                      for p in proposals]
        futures = [(p, cid, evaluator.evaluate(spec, target, p.pipeline, cases, dims))
                   for p, cid in zip(proposals, ids)]
        out = []
        for p, cid, fut in futures:
            compiled, gated = fut.result()
            outcome = to_outcome(compiled, gated, baseline)
            kb.record_outcome(cid, outcome)
            out.append(Trial(cid, p, outcome, op_id))
            if gated is not None and gated.defence == "reference":
                # every candidate would fail the same way: stop, with the reference's own error
                raise KfcError(f"the gate could not check {spec.instance_name}: {gated.error}",
                               spec.check.reference_span if spec.check else None,
                               "fix the reference (kfc check runs it on the CPU), then run the same command")
        return out

    try:
        history = kb.trials(op_id=op_id, target=target.name, shape=dims)
        baseline = _baseline(history, spec)
        if baseline is not None and baseline.outcome.eager_us is None and \
                baseline.candidate_id not in {t.candidate_id for t in kb.trials(run_id=run_id)}:
            baseline = None  # an earlier run's, timed before the gate timed eagerly: no base for eager speedups
        if baseline is None:
            ids = [cid for cid, p in pending if p.proposer == "baseline"][-1:]
            default = space.default_pipeline() if isinstance(space, MatmulSpace) else default_pipeline("row")
            (baseline,) = evaluate([Proposal(_canonical(default), "kfc's default pipeline", "baseline")], None, ids)
            history.append(baseline)
        base = baseline.outcome
        pending = [(cid, p) for cid, p in pending if p.proposer != "baseline"][: max(0, budget - done)]
        if pending:  # in flight when the interrupted run stopped: theirs to finish
            trials = evaluate([p for _, p in pending], base, [cid for cid, _ in pending])
            history += trials
            done += len(trials)
        lessons: list[str] = [ls["text"] for ls in kb.lessons(op_id)]
        while done < budget:
            ctx = TuneContext(spec.instance_name, fp, features, target.name, dims, space, tuple(history),
                              tuple(kb.prior(fp, features, target.name, dims, k=PRIOR_TRIALS)),
                              tuple(lessons[-20:]))
            tried = {space.canonical(t.proposal.pipeline) for t in history}
            proposals = _dedupe(policy.propose(ctx, min(batch, budget - done)), space)
            proposals = [p for p in proposals if p.pipeline not in tried][: budget - done]
            if not proposals:
                break  # the policy has nothing new: the space is exhausted for it
            trials = evaluate(proposals, base)
            history += trials
            done += len(trials)
            best = _best(history)
            for t in trials:
                if on_trial is not None:
                    on_trial(t, best, done)
            for text in policy.reflect(attrs.evolve(ctx, history=tuple(history)), trials):
                if text not in lessons:
                    lessons.append(text)
                    kb.add_lesson(op_id, text, [t.candidate_id for t in trials], policy.name)
        status = "finished"
    finally:
        kb.finish_run(run_id, status, f"{done} candidates")
    history = kb.trials(op_id=op_id, target=target.name, shape=dims)
    return TuneResult(run_id, spec.instance_name, dims, done, _baseline(history, spec), _best(history),
                      status != "finished")


def finished_tune(spec: OpSpec, target: Target, dims: dict[str, int], budget: int, policy: str,
                  kb: KnowledgeBase) -> TuneResult | None:
    """The newest finished run of this op at this target and shape with at least this budget,
    as a TuneResult (for a benchmark that resumes after being stopped), or None."""
    op = kb.op_by_fingerprint(op_fingerprint(spec.func))
    if op is None:
        return None
    shape = json.loads(canonical_shape(dims))
    runs = [r for r in kb.runs(op["id"]) if r["target"] == target.name and r["shape"] == shape
            and r["policy"] == policy and r["status"] == "finished" and (r["budget"] or 0) >= budget]
    if not runs:
        return None
    run = runs[-1]
    history = kb.trials(op_id=op["id"], target=target.name, shape=dims)
    mine = [t for t in kb.trials(run_id=run["id"]) if t.proposal.proposer != "baseline"]
    return TuneResult(run["id"], spec.instance_name, dims, len(mine), _baseline(history, spec), _best(history))


def _canonical(pipeline: str) -> str:
    return str(parse_pipeline(pipeline))


def _dedupe(proposals: list[Proposal], space: SearchSpace) -> list[Proposal]:
    """Each kernel once, in the space's spelling where it has one (the default pipeline and its
    explicit form are one candidate)."""
    seen, out = set(), []
    for p in proposals:
        try:
            canon = space.canonical(_canonical(p.pipeline))
        except PassError:
            canon = p.pipeline  # recorded as failing to parse
        if canon not in seen:
            seen.add(canon)
            out.append(attrs.evolve(p, pipeline=canon))
    return out


def _baseline(history: list[Trial], spec: OpSpec) -> Trial | None:
    base = [t for t in history if t.proposal.proposer == "baseline" and t.outcome.stage is Stage.TIMED]
    return base[-1] if base else None


def _best(history: list[Trial]) -> Trial | None:
    timed = [t for t in history if t.outcome.stage is Stage.TIMED and t.outcome.median_us]
    return min(timed, key=lambda t: t.outcome.median_us) if timed else None


def default_env() -> dict[str, Any]:
    env: dict[str, Any] = {"host": platform.node(), "python": platform.python_version()}
    try:
        import torch  # lazy: torch (~3 s), only for the GPU's name in the run's provenance

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
        env["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        env["toolchain"] = find_toolchain().version_text
    except Exception:  # noqa: BLE001 - provenance only
        pass

    env["kfc_commit"] = git_commit()
    return env


def curve(trials: list[Trial]) -> list[float]:
    """Best time so far after each candidate (inf until one is timed)."""
    best, out = math.inf, []
    for t in trials:
        if t.outcome.stage is Stage.TIMED and t.outcome.median_us:
            best = min(best, t.outcome.median_us)
        out.append(best)
    return out


def candidates_to_reach(trials: list[Trial], target_us: float) -> int | None:
    """How many candidates it took to get within target_us (None: never)."""
    for i, b in enumerate(curve(trials), 1):
        if b <= target_us:
            return i
    return None

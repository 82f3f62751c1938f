"""The tune loop on the CPU, with a stand-in for the GPU: recording, resuming, interruption,
transfer from similar ops, and the worker's crash and hang handling (real subprocesses)."""

import math
import sys
from concurrent.futures import Future

import attrs
import pytest

from kfc.factory.evaluate import Compiled, GpuWorker
from kfc.factory.gate import GateResult
from kfc.model.records import Stage
from kfc.factory.offline import SearchPolicy
from kfc.factory.tune import candidates_to_reach, curve, finished_tune, space_for, tune
from kfc.frontend import instances, load_kfc
from kfc.kb.store import KnowledgeBase
from kfc.model.target import parse_target

TARGET = parse_target("sm_90a")
DIMS = {"M": 4096, "N": 4096}


class FakeGpu:
    """Times a candidate by a smooth function of its tile options: fastest at 256 threads,
    cluster 1, vec 8, the `cs` hints; a pipeline outside the space is slow."""

    n_gpus = 1

    def __init__(self, spec, fail_after=None):
        self.space = space_for(spec, DIMS, TARGET)
        self.calls = 0
        self.fail_after = fail_after

    def time_of(self, pipeline):
        from kfc.passes import ROW_PIPELINE, parse_pipeline

        c = self.space.config_of(pipeline)
        if pipeline == str(parse_pipeline(ROW_PIPELINE)):  # the default's heuristics
            c = self.space.default()
        if c is None:
            return 500.0
        t = 100.0 * (1 + 0.15 * abs(math.log2(c["threads"] / 256)) + 0.2 * abs(math.log2(c["cluster"]))
                     + 0.1 * abs(math.log2(8 / c["vec"])) + 0.05 * (c["stream"] != "cs") + 0.05 * c["persistent"])
        return t

    def evaluate(self, spec, target, pipeline, cases, timed):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt
        f = Future()
        f.set_result((Compiled(Stage.COMPILED, "", 40, 0, 64),
                      GateResult(Stage.TIMED, median_us=self.time_of(pipeline), spread_us=1.0, times_us=(1.0,),
                                 eager_us=self.time_of(pipeline) + 7.0)))
        return f


@pytest.fixture
def kb(tmp_path):
    k = KnowledgeBase(tmp_path / "kb.sqlite")
    yield k
    k.close()


def test_a_tune_records_every_candidate_and_keeps_the_best(kb):
    spec = load_kfc("kernels/rmsnorm.kfc")
    gpu = FakeGpu(spec)
    r = tune(spec, TARGET, DIMS, 12, SearchPolicy(seed=3), kb, gpu)
    assert r.candidates == 12 and not r.interrupted
    trials = kb.trials(run_id=r.run_id)
    assert len(trials) == 13 and trials[0].proposal.proposer == "baseline"
    assert len({t.proposal.pipeline for t in trials}) == 13
    base = trials[0].outcome  # each candidate's speedups over it, back to back and eagerly
    for t in trials[1:]:
        assert t.outcome.speedup == pytest.approx(base.median_us / t.outcome.median_us)
        assert t.outcome.eager_speedup == pytest.approx(base.eager_us / t.outcome.eager_us)
    assert r.best.outcome.median_us == min(t.outcome.median_us for t in trials)
    assert r.best.outcome.median_us <= r.baseline.outcome.median_us
    assert all(t.outcome.speedup is not None for t in trials[1:])


class BackToBackOnlyGpu(FakeGpu):
    """A gate as it was before it timed eagerly: no eager figure."""

    def evaluate(self, spec, target, pipeline, cases, timed):
        compiled, gated = super().evaluate(spec, target, pipeline, cases, timed).result()
        f = Future()
        f.set_result((compiled, attrs.evolve(gated, eager_us=None)))
        return f


def test_a_baseline_timed_before_the_eager_figure_is_timed_again(kb):
    spec = load_kfc("kernels/rmsnorm.kfc")
    old = tune(spec, TARGET, DIMS, 2, SearchPolicy(seed=1), kb, BackToBackOnlyGpu(spec))
    assert kb.trials(run_id=old.run_id)[0].outcome.eager_us is None
    new = tune(spec, TARGET, DIMS, 2, SearchPolicy(seed=2), kb, FakeGpu(spec))
    trials = kb.trials(run_id=new.run_id)
    assert trials[0].proposal.proposer == "baseline" and trials[0].outcome.eager_us is not None
    assert all(t.outcome.eager_speedup is not None for t in trials[1:])


def test_a_rerun_resumes_without_repeating_itself(kb):
    spec = load_kfc("kernels/rmsnorm.kfc")
    first = tune(spec, TARGET, DIMS, 5, SearchPolicy(seed=1), kb, FakeGpu(spec))
    gpu = FakeGpu(spec)
    second = tune(spec, TARGET, DIMS, 5, SearchPolicy(seed=1), kb, gpu)
    assert gpu.calls == 5  # the baseline was not timed again
    pipelines = [t.proposal.pipeline for t in kb.trials(op_id=None, target="sm_90a", shape=DIMS)]
    assert len(pipelines) == len(set(pipelines)) == 11
    assert second.best.outcome.median_us <= first.best.outcome.median_us


def test_an_interrupted_tune_loses_nothing_recorded(kb):
    spec = load_kfc("kernels/rmsnorm.kfc")
    with pytest.raises(KeyboardInterrupt):
        tune(spec, TARGET, DIMS, 10, SearchPolicy(seed=2), kb, FakeGpu(spec, fail_after=4), batch=1)
    trials = kb.trials(target="sm_90a", shape=DIMS)
    assert len(trials) == 4  # the baseline and three candidates, each with its outcome
    assert all(t.outcome.stage is Stage.TIMED for t in trials)
    assert kb.runs()[-1]["status"] == "interrupted"
    (in_flight,) = kb.pending(kb.runs()[-1]["id"])  # added, then the interrupt hit its evaluation
    gpu = FakeGpu(spec)
    r = tune(spec, TARGET, DIMS, 10, SearchPolicy(seed=2), kb, gpu)  # the same command again
    assert r.run_id == kb.runs()[-1]["id"] and len(kb.runs()) == 1  # resumed, not a new run
    assert r.candidates == 10 and gpu.calls == 7 and not r.interrupted
    trials = kb.trials(target="sm_90a", shape=DIMS)
    assert len(trials) == 11 and trials[4].candidate_id == in_flight[0]  # the one in flight went first
    assert kb.pending(r.run_id) == [] and kb.runs()[-1]["status"] == "finished"


def test_after_a_finished_run_the_same_command_searches_further(kb):
    spec = load_kfc("kernels/rmsnorm.kfc")
    first = tune(spec, TARGET, DIMS, 4, SearchPolicy(seed=2), kb, FakeGpu(spec))
    assert finished_tune(spec, TARGET, DIMS, 4, "search", kb).run_id == first.run_id
    assert finished_tune(spec, TARGET, DIMS, 5, "search", kb) is None  # a larger budget is not done yet
    second = tune(spec, TARGET, DIMS, 4, SearchPolicy(seed=2), kb, FakeGpu(spec))
    assert second.run_id != first.run_id and second.candidates == 4
    assert finished_tune(spec, TARGET, DIMS, 4, "search", kb).run_id == second.run_id


def test_a_run_killed_during_its_baseline_resumes_with_that_candidate(kb):
    spec = load_kfc("kernels/rmsnorm.kfc")
    with pytest.raises(KeyboardInterrupt):
        tune(spec, TARGET, DIMS, 3, SearchPolicy(seed=2), kb, FakeGpu(spec, fail_after=0))
    (base_id, p), = kb.pending(kb.runs()[-1]["id"])
    assert p.proposer == "baseline"
    r = tune(spec, TARGET, DIMS, 3, SearchPolicy(seed=2), kb, FakeGpu(spec))
    assert r.baseline.candidate_id == base_id and r.candidates == 3 and len(kb.runs()) == 1


def test_what_was_learned_on_one_op_seeds_a_similar_one(kb):
    rms = load_kfc("kernels/rmsnorm.kfc")
    tune(rms, TARGET, DIMS, 16, SearchPolicy(seed=4), kb, FakeGpu(rms))
    ln = load_kfc("kernels/layernorm.kfc")
    seen = []

    class Spy(SearchPolicy):
        def propose(self, ctx, n):
            out = super().propose(ctx, n)
            seen.append((len(ctx.prior), out))
            return out

    tune(ln, TARGET, DIMS, 4, Spy(seed=4), kb, FakeGpu(ln))
    n_prior, first = seen[0]
    assert n_prior > 0 and first[0].rationale.startswith("prior from the knowledge base")


def test_a_warm_start_needs_fewer_candidates_than_a_cold_one(tmp_path):
    """The issue's protocol in miniature: softmax tuned with an empty knowledge base, and again
    with one filled by tuning rmsnorm and layernorm."""
    rms, ln, sm = (load_kfc(f"kernels/{k}.kfc") for k in ("rmsnorm", "layernorm", "softmax"))
    cold_kb, warm_kb = KnowledgeBase(tmp_path / "cold.sqlite"), KnowledgeBase(tmp_path / "warm.sqlite")
    try:
        cold = tune(sm, TARGET, DIMS, 24, SearchPolicy(seed=1), cold_kb, FakeGpu(sm))
        tune(rms, TARGET, DIMS, 24, SearchPolicy(seed=11), warm_kb, FakeGpu(rms))
        tune(ln, TARGET, DIMS, 24, SearchPolicy(seed=21), warm_kb, FakeGpu(ln))
        warm = tune(sm, TARGET, DIMS, 24, SearchPolicy(seed=1), warm_kb, FakeGpu(sm))
        best = min(cold.best.outcome.median_us, warm.best.outcome.median_us)
        c = candidates_to_reach(cold_kb.trials(run_id=cold.run_id)[1:], best / 0.95)
        w = candidates_to_reach(warm_kb.trials(run_id=warm.run_id)[1:], best / 0.95)
        assert w is not None and (c is None or w <= c / 2), (w, c)
    finally:
        cold_kb.close()
        warm_kb.close()


def test_curve_is_the_best_so_far():
    from kfc.model.records import Outcome, Proposal, Trial

    ts = [Trial(i, Proposal("p"), Outcome(Stage.TIMED, median_us=m)) for i, m in enumerate([5.0, 7.0, 3.0, 4.0])]
    ts.insert(1, Trial(9, Proposal("q"), Outcome(Stage.COMPILED, error="x")))
    assert curve(ts) == [5.0, 5.0, 5.0, 3.0, 3.0]
    assert candidates_to_reach(ts, 3.0) == 4 and candidates_to_reach(ts, 1.0) is None


# --- the worker process: crashes and hangs are failures, and the worker comes back ----------

class ScriptedWorker(GpuWorker):
    """The real worker plumbing around a scripted child process."""

    def __init__(self, script, timeout_s):
        super().__init__("0", timeout_s)
        self.script = script
        self.starts = 0

    def command(self):
        self.starts += 1
        return [sys.executable, "-c", self.script]


def test_a_crashing_worker_is_a_failure_and_is_restarted():
    w = ScriptedWorker("import sys; sys.stdin.readline(); sys.exit(7)", timeout_s=30)
    r = w.run({"id": 1})
    assert r.stage is Stage.COMPILED and "crashed" in r.error and "status 7" in r.error
    r = w.run({"id": 2})
    assert "crashed" in r.error and w.starts == 2
    w.stop()


def test_a_worker_killed_by_a_signal_says_which_signal():
    w = ScriptedWorker("import os, signal, sys; sys.stdin.readline(); os.kill(os.getpid(), signal.SIGSEGV)",
                       timeout_s=30)
    r = w.run({"id": 1})
    assert "crashed" in r.error and "killed by signal SIGSEGV" in r.error
    w.stop()


def test_a_hanging_worker_is_killed_after_the_timeout():
    w = ScriptedWorker("import sys, time; sys.stdin.readline(); time.sleep(60)", timeout_s=1.0)
    r = w.run({"id": 1})
    assert "hung" in r.error and w.proc is None


def test_a_worker_answer_is_matched_to_its_job():
    script = ("import sys, json\n"
              "for line in sys.stdin:\n"
              "    job = json.loads(line)\n"
              "    print('some library chatter')\n"
              "    print(json.dumps({'id': job['id'], 'stage': 'timed', 'median_us': 12.5, 'error': '',"
              " 'defence': '', 'notes': ''}), flush=True)\n")
    w = ScriptedWorker(script, timeout_s=30)
    r = w.run({"id": 41})
    assert r.stage is Stage.TIMED and r.median_us == 12.5
    w.stop()


KILLED_TUNE = r"""
import sys, time
sys.path.insert(0, "tests")
from test_tune import DIMS, TARGET, FakeGpu
from kfc.factory.offline import SearchPolicy
from kfc.factory.tune import tune
from kfc.frontend import instances, load_kfc
from kfc.kb.store import KnowledgeBase

class SlowGpu(FakeGpu):
    def evaluate(self, *args):
        time.sleep(0.01)
        return super().evaluate(*args)

spec = load_kfc("kernels/rmsnorm.kfc")
tune(spec, TARGET, DIMS, int(sys.argv[2]), SearchPolicy(seed=5), KnowledgeBase(sys.argv[1]), SlowGpu(spec), batch=2,
     on_trial=lambda t, best, n: print(t.candidate_id, flush=True))
"""


def test_a_tune_killed_with_sigkill_keeps_every_record_and_resumes(tmp_path):
    from killed_child import run_and_kill

    path, budget = tmp_path / "kb.sqlite", 60
    printed, _ = run_and_kill(KILLED_TUNE, [str(path), str(budget)], after=20)
    with KnowledgeBase(path, create=False) as k:
        assert k.integrity_check() == "ok"
        trials = {t.candidate_id: t for t in k.trials()}
        assert all(trials[c].outcome.stage is Stage.TIMED for c in printed)  # every reported record intact
        (run,) = k.runs()
        assert run["status"] == "running"  # nobody closed it
        spec = load_kfc("kernels/rmsnorm.kfc")
        r = tune(spec, TARGET, DIMS, budget, SearchPolicy(seed=5), k, FakeGpu(spec), batch=2)  # the same command
        assert r.run_id == run["id"] and r.candidates == budget and not r.interrupted
        assert len(k.trials(run_id=r.run_id)) == budget + 1 and k.pending(r.run_id) == []
        assert {t.candidate_id for t in k.trials()} >= set(printed)


def test_the_default_pipeline_is_a_point_of_the_space():
    """The baseline's configuration is known to the policies (as prior and as data), and its
    explicit spelling is the same candidate."""
    from kfc.passes import ROW_PIPELINE

    for n in (256, 4096, 16384, 65536, 4100):
        space = space_for(load_kfc("kernels/softmax.kfc"), {"M": 32768, "N": n}, TARGET)
        assert space.config_of(ROW_PIPELINE) == space.default()
        assert space.canonical(ROW_PIPELINE) == space.pipeline(space.default())
        assert space.canonical("canonicalize,cse") == "canonicalize,cse"  # outside the space: unchanged


def test_the_default_and_its_explicit_spelling_build_the_same_kernel():
    from kfc.compile import compile_op
    from kfc.passes import ROW_PIPELINE

    spec = instances(load_kfc("kernels/rmsnorm.kfc"))[0]
    for n in (16384, 65536):
        dims = {"M": 32768, "N": n}
        a = compile_op(spec, TARGET, ROW_PIPELINE, dims)
        b = compile_op(spec, TARGET, space_for(spec, dims, TARGET).canonical(ROW_PIPELINE), dims)
        assert a.ir == b.ir and a.plan == b.plan


def test_a_tune_never_retries_the_baseline_under_another_spelling(kb):
    spec = load_kfc("kernels/rmsnorm.kfc")
    space = space_for(spec, DIMS, TARGET)
    r = tune(spec, TARGET, DIMS, 40, SearchPolicy(seed=6), kb, FakeGpu(spec))
    configs = [space.config_of(t.proposal.pipeline) for t in kb.trials(run_id=r.run_id)]
    assert configs.count(space.default()) == 1


def _trial(cid, space, c, us):
    from kfc.model.records import Outcome, Proposal, Trial

    return Trial(cid, Proposal(space.pipeline(c)), Outcome(Stage.TIMED, median_us=us))


def test_a_similar_op_that_is_uniformly_faster_does_not_outvote_this_ops_measurements():
    from kfc.factory.model import TuneContext

    spec = load_kfc("kernels/softmax.kfc")
    space = space_for(spec, DIMS, TARGET)
    base = space.default()
    fast, slow = dict(base, threads=256), dict(base, threads=128)
    # this op: 256 threads beat 128; the other op, twice as fast overall, tried mostly 128
    history = [_trial(1, space, fast, 100.0), _trial(2, space, slow, 120.0)]
    prior = [_trial(10 + i, space, dict(slow, vec=v), 50.0) for i, v in enumerate((2, 4, 8))] + \
        [_trial(20, space, dict(fast, vec=8), 45.0)]
    ctx = TuneContext("softmax_bf16", "fp", {}, "sm_90a", DIMS, space, tuple(history), tuple(prior))
    policy = SearchPolicy(seed=0)
    _, _, effect, _ = policy.fit(ctx)
    assert effect[("threads", 256)] < effect[("threads", 128)]
    # and a best configuration to step from is ranked against its own op's mean
    obs = sorted((o for o in policy.observations(ctx) if o[1] is not None), key=lambda o: o[1])
    assert obs[0][0]["threads"] == 256


def test_the_search_policy_recombines_the_best_paying_steps_of_the_pass_sequence_graph():
    from kfc.factory.model import TuneContext
    from kfc.model.records import Outcome, Proposal, Trial
    from kfc.factory.offline import graph_proposal

    spec = load_kfc("kernels/softmax.kfc")
    space = space_for(spec, DIMS, TARGET)
    base = space.default()

    def trial(cid, c, speedup):
        return Trial(cid, Proposal(space.pipeline(c)), Outcome(Stage.TIMED, median_us=100 / speedup, speedup=speedup))

    good_tile = dict(base, threads=512, vec=4)       # the best tile, tried only with the default lower-ptx
    good_ptx = dict(base, stream="nc_na", store="none")  # the best lower-ptx, tried only with other tiles
    history = [trial(1, base, 1.0), trial(2, good_tile, 1.4), trial(3, dict(good_tile, fuse=False), 1.4),
               trial(4, dict(good_ptx, threads=64), 1.3), trial(5, dict(good_ptx, threads=64, vec=2), 1.3)]
    ctx = TuneContext("softmax_bf16", "fp", {}, "sm_90a", DIMS, space, tuple(history))
    c, why = graph_proposal(ctx)
    # never tried: the two best-paying steps together; without fuse-reductions, whose trials
    # averaged 1.25x against 1.4x for those without it
    assert c == dict(good_tile, stream="nc_na", store="none", fuse=False)
    assert why.startswith("the pass-sequence graph: tile{threads=512,vec=4,cluster=1} (mean 1.40x over 2 trials)")
    out = SearchPolicy(seed=0).propose(ctx, 4)
    assert out[0].pipeline == space.pipeline(c) and out[0].rationale == why
    # nothing timed with a speedup yet: no recombination
    assert graph_proposal(TuneContext("softmax_bf16", "fp", {}, "sm_90a", DIMS, space, ())) is None


def _ctx(space, configs_and_times, baseline=None):
    from kfc.factory.model import TuneContext
    from kfc.model.records import Outcome, Proposal, Trial

    history = []
    if baseline is not None:
        c, us = baseline
        history.append(Trial(1, Proposal(space.pipeline(c), "default", "baseline"), Outcome(Stage.TIMED, median_us=us)))
    history += [_trial(10 + i, space, c, us) for i, (c, us) in enumerate(configs_and_times)]
    return TuneContext("softmax_bf16", "fp", {}, "sm_90a", DIMS, space, tuple(history))


def test_the_search_keeps_stepping_from_the_default_configuration():
    space = space_for(load_kfc("kernels/softmax.kfc"), DIMS, TARGET)
    base = space.default()
    far = dict(base, threads=64, vec=2, rows=4, stream="none", store="none")
    best = [dict(far, approx=a, fuse=f) for a in ("auto", "off") for f in (True, False)][:3]
    ctx = _ctx(space, [(c, 100.0) for c in best], baseline=(base, 200.0))
    near_base = {space.pipeline(d) for d in space.neighbours(base)} - \
        {space.pipeline(d) for c in best for d in space.neighbours(c)}

    def proposed(policy):
        return {p.pipeline for p in policy.propose(ctx, 60)}

    assert proposed(SearchPolicy(seed=0, explore=0.0)) & near_base
    assert not proposed(SearchPolicy(seed=0, explore=0.0, anchor=False)) & near_base


def test_the_joint_model_shares_a_slow_trials_blame_between_its_choices():
    space = space_for(load_kfc("kernels/softmax.kfc"), {"M": 32768, "N": 65536}, TARGET)
    base = dict(space.default(), cluster=2, threads=512)
    # log time = +1 for 1024 threads, -0.2 for clusters of 4; 1024 threads were only tried with clusters of 4
    times = [(dict(base, threads=1024, cluster=4), math.exp(0.8)), (dict(base, cluster=4), math.exp(-0.2)),
             (dict(base, cluster=4, vec=4), math.exp(-0.2)), (base, 1.0), (dict(base, vec=4), 1.0)]
    ctx = _ctx(space, times)
    _, _, per_value, _ = SearchPolicy(joint=False).fit(ctx)
    _, _, joint, _ = SearchPolicy(joint=True, ridge=0.01).fit(ctx)
    assert per_value[("cluster", 4)] > per_value[("cluster", 2)]  # the per-value mean blames clusters of 4
    assert joint[("cluster", 4)] < joint[("cluster", 2)]
    assert joint[("threads", 1024)] - joint[("threads", 512)] == pytest.approx(1.0, abs=0.05)


def test_kfc_tune_runs_end_to_end_with_a_stand_in_gpu(tmp_path, monkeypatch, capsys):
    """The command: progress, the report, the best kernel and tune.json written, and
    `kfc compile --from-kb` reusing the best recorded pipeline."""
    import json

    import torch

    import kfc.factory.evaluate as evaluate
    from kfc.cli import main

    spec = load_kfc("kernels/rmsnorm.kfc")

    class StandIn(FakeGpu):
        def __init__(self, gpus, timeout_s, reference_limits):
            super().__init__(spec)
            assert reference_limits.timeout_s == 120

        def close(self):
            pass

    monkeypatch.setattr(evaluate, "Evaluator", StandIn)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # the stand-in is GPU 0, as --gpus checks
    monkeypatch.setenv("KFC_CACHE_DIR", str(tmp_path / "cache"))
    kb, out = tmp_path / "kb.sqlite", tmp_path / "out"
    shape = "M=4096,N=4096"
    assert main(["tune", "kernels/rmsnorm.kfc", "--shape", shape, "--budget", "6", "--gpus", "0", "--kb", str(kb),
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "6 candidates; best" in printed and "best pipeline:" in printed
    (folder,) = out.iterdir()
    summary = json.loads((folder / "tune.json").read_text())
    assert summary["candidates"] == 6 and summary["best_us"] <= summary["baseline_us"]
    assert (folder / "rmsnorm.cubin").stat().st_size > 0 and (folder / "report.json").exists()
    assert main(["compile", "kernels/rmsnorm.kfc", "--from-kb", "--kb", str(kb), "--shape", shape,
                 "-o", str(tmp_path / "again")]) == 0
    assert summary["best_pipeline"] in capsys.readouterr().out


def test_a_similar_ops_prior_is_tried_basin_by_basin():
    from kfc.factory.model import TuneContext
    from kfc.model.records import Outcome, Proposal, Trial

    dims = {"M": 32768, "N": 65536}
    space = space_for(load_kfc("kernels/softmax.kfc"), dims, TARGET)
    base = space.default()

    def trial(cid, c, us, op):
        return Trial(cid, Proposal(space.pipeline(c)), Outcome(Stage.TIMED, median_us=us), op)

    persistent = dict(base, cluster=2, persistent=True, threads=512)
    detail = dict(persistent, stream="nc_na")                       # the same basin, a detail changed
    wide = dict(base, cluster=8, persistent=False, threads=128)     # another basin, 2.4% slower
    four = dict(base, cluster=4, persistent=False, threads=512)     # a third, 3.3% slower
    far = dict(base, cluster=16, persistent=True, threads=256)      # another geometry, but 20% slower: not replayed
    other_op = dict(persistent, threads=1024)                       # a second op's best: the first basin
    narrow = dict(persistent, vec=4)                                # the first basin, another layout, 3% slower
    own_earlier = dict(base, vec=4)                                 # this op's own record comes first
    history = (Trial(1, Proposal(space.pipeline(base), "default", "baseline"), Outcome(Stage.TIMED, median_us=300.0), 9),)
    prior = (trial(2, own_earlier, 290.0, 9),
             trial(10, persistent, 100.0, 7), trial(11, detail, 100.1, 7), trial(12, wide, 102.4, 7),
             trial(13, four, 103.3, 7), trial(14, far, 120.0, 7), trial(15, narrow, 103.0, 7),
             trial(20, other_op, 50.0, 8))
    ctx = TuneContext("softmax_bf16", "fp", {}, "sm_90a", dims, space, history, prior)

    def order(policy):
        return [c for c, _, _ in policy.prior_order(ctx)]

    # basins first, then the other layouts of near-best configurations, then details
    assert order(SearchPolicy()) == [own_earlier, persistent, wide, four, other_op, narrow, detail]
    # without the hedge, the similar ops' record ranks by closeness to each op's best alone
    assert order(SearchPolicy(basin_tolerance=0.0)) == \
        [own_earlier, persistent, other_op, detail, wide, narrow, four]
    # a configuration far from its op's best is replayed only where the tolerance reaches it
    assert order(SearchPolicy(replay_tolerance=0.25))[-1] == far
    out = SearchPolicy(seed=0, explore=0.0).propose(ctx, 4)
    assert [p.pipeline for p in out] == [space.pipeline(c) for c in (own_earlier, persistent, wide, four)]
    assert "the best of a basin, 1.024x its op's best" in out[2].rationale


def test_gpus_takes_indices_or_all():
    import argparse

    from kfc.cli_args import gpu_list

    assert gpu_list("0,1") == ["0", "1"] and gpu_list(" 3 ") == ["3"]
    assert gpu_list("all") is None and gpu_list("ALL") is None  # every visible GPU, as the default
    for bad, why in (("0,0", "listed twice"), ("x", "or all"), ("", "GPU indices")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            gpu_list(bad)

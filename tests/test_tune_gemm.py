"""The tuner searching matrix products on the CPU, with a stand-in for the GPU: the space comes
from accelerate-matmul's declared options, every point of it is a pipeline the pass takes and
maps back to itself, a tune records and improves, and what was learned at one GEMM shape seeds
another."""

import math
import random
from concurrent.futures import Future

import attrs
import pytest

from kfc.factory.evaluate import Compiled
from kfc.factory.gate import GateResult
from kfc.factory.matmul_space import MatmulSpace
from kfc.factory.offline import SearchPolicy
from kfc.factory.tune import space_for, tune
from kfc.frontend import load_kfc
from kfc.kb.store import KnowledgeBase
from kfc.model.records import Stage
from kfc.model.target import parse_target
from kfc.passes import MATMUL_PIPELINE
from kfc.passes.accelerate_matmul import AccelerateMatmul
from kfc.passes.base import option_range

TARGET = parse_target("sm_90a")
SQUARE = {"M": 4096, "N": 4096, "K": 4096}


class FakeGpu:
    """Times a GEMM candidate by a smooth function of its options: fastest at bn=256, 4 stages,
    a producer warpgroup with one group in flight and group 8; outside the space, slow."""

    n_gpus = 1

    def __init__(self, spec, dims):
        self.space = space_for(spec, dims, TARGET)
        self.calls = 0

    def time_of(self, pipeline):
        c = self.space.config_of(pipeline)
        if c is None:
            return 5000.0
        return 1000.0 * (1 + 0.3 * abs(math.log2(c["bn"] / 256)) + 0.1 * abs(c["stages"] - 4)
                         + 0.2 * (c["producer"] != "warpgroup") + 0.05 * (1 - c["inflight"])
                         + 0.02 * abs(math.log2(c["group"] / 8)) + 0.15 * (c["bm"] != 128))

    def evaluate(self, spec, target, pipeline, cases, timed):
        self.calls += 1
        f = Future()
        f.set_result((Compiled(Stage.COMPILED, "", 160, 0, 197632),
                      GateResult(Stage.TIMED, median_us=self.time_of(pipeline), spread_us=1.0, times_us=(1.0,))))
        return f


@pytest.fixture
def kb(tmp_path):
    k = KnowledgeBase(tmp_path / "kb.sqlite")
    yield k
    k.close()


def test_the_space_is_the_options_accelerate_matmul_declares():
    space = space_for(load_kfc("kernels/gemm.kfc"), SQUARE, TARGET)
    assert isinstance(space, MatmulSpace)
    choices = space.choices()
    for f in attrs.fields(AccelerateMatmul):
        if f.name in ("mma", "copy", "approx"):
            assert f.name not in choices
            continue
        r = option_range(f)
        assert set(choices[f.name]) <= set(r.choices or range(r.lo, r.hi + 1)), f.name
    assert space.canonical(MATMUL_PIPELINE) == space.pipeline(space.default())


def test_every_point_of_the_space_is_a_pipeline_the_pass_takes_and_maps_back():
    space = space_for(load_kfc("kernels/gemm.kfc"), SQUARE, TARGET)
    rng = random.Random(0)
    for _ in range(40):
        c = space.random(rng)
        p = space.pipeline(c)
        assert space.config_of(p) == c
        for d in space.neighbours(c):
            assert space.valid(d) and d != c
    assert space.config_of("canonicalize,accelerate-matmul{mma=wgmma,bm=64}") is None  # another form: opaque
    assert not space.valid({**space.default(), "producer": "mma", "tiles": "persistent"})
    assert not space.valid({**space.default(), "bk": 128, "stages": 6})  # 288 KB of stages
    assert space.default()["store"] == "tma"  # store=auto: 192 KB of stages and 32 KB of staging slots fit
    assert space.valid({**space.default(), "bn": 192, "stages": 5, "store": "direct"})  # 200 KB of stages ...
    assert not space.valid({**space.default(), "bn": 192, "stages": 5, "store": "tma"})  # ... and 32 KB more


def test_operands_tma_cannot_move_leave_the_producer_out_of_the_space():
    space = space_for(load_kfc("kernels/gemm.kfc"), {"M": 33, "N": 65, "K": 17}, TARGET)
    assert space.choices()["producer"] == ("mma",) and space.choices()["tiles"] == ("grid",)
    assert space.choices()["store"] == ("direct",)  # a row of c is 130 bytes: no TMA store
    assert space_for(load_kfc("kernels/gemm.kfc"), SQUARE, TARGET).choices()["store"] == ("direct", "tma")


def test_a_gemm_tune_records_every_candidate_and_keeps_the_best(kb):
    spec = load_kfc("kernels/gemm.kfc")
    gpu = FakeGpu(spec, SQUARE)
    r = tune(spec, TARGET, SQUARE, 12, SearchPolicy(seed=3), kb, gpu)
    assert r.candidates == 12 and not r.interrupted
    trials = kb.trials(run_id=r.run_id)
    assert len({t.proposal.pipeline for t in trials}) == 13
    assert r.best.outcome.median_us == min(t.outcome.median_us for t in trials)
    assert all(gpu.space.config_of(t.proposal.pipeline) is not None for t in trials[1:])


def test_what_one_gemm_shape_learned_seeds_another(kb):
    spec = load_kfc("kernels/gemm.kfc")
    tune(spec, TARGET, SQUARE, 16, SearchPolicy(seed=4), kb, FakeGpu(spec, SQUARE))
    other = {"M": 8192, "N": 1024, "K": 8192}
    seen = []

    class Spy(SearchPolicy):
        def propose(self, ctx, n):
            out = super().propose(ctx, n)
            seen.append((len(ctx.prior), out))
            return out

    tune(spec, TARGET, other, 4, Spy(seed=4), kb, FakeGpu(spec, other))
    n_prior, first = seen[0]
    assert n_prior > 0 and first[0].rationale.startswith("prior from the knowledge base")


def test_on_blackwell_the_space_is_the_tcgen05_kernels():
    space = space_for(load_kfc("kernels/gemm.kfc"), SQUARE, parse_target("sm_100a"))
    choices = space.choices()
    assert choices["bm"] == (128,) and choices["tiles"] == ("grid",) and len(choices["producer"]) == 1
    assert choices["store"] == ("direct",)
    assert len(choices["bn"]) > 1 and len(choices["stages"]) > 1


def test_the_gemm_benchmark_times_the_pipeline_tuned_for_each_shape(tmp_path):
    """python -m bench.gemm --kb: kfc[tuned] is the knowledge base's best at each shape, and the
    default where it records none."""
    from bench.gemm import tuned_pipelines

    spec = load_kfc("kernels/gemm.kfc")
    kb = KnowledgeBase(tmp_path / "kb.sqlite")
    try:
        r = tune(spec, TARGET, SQUARE, 4, SearchPolicy(seed=1), kb, FakeGpu(spec, SQUARE))
    finally:
        kb.close()
    got = tuned_pipelines(str(tmp_path / "kb.sqlite"), "kernels/gemm.kfc", [(4096, 4096, 4096), (16, 8192, 8192)])
    assert got == {(4096, 4096, 4096): r.best.proposal.pipeline, (16, 8192, 8192): None}


def test_the_gemm_self_improvement_experiment_compares_cold_and_warm_tunes_per_seed(tmp_path):
    """bench.self_improvement_gemm: other shapes tuned once, then per seed a cold tune (its own
    knowledge base) and a warm one (a copy of the other shapes'); a second call reads every
    finished tune back instead of tuning again."""
    from bench.self_improvement_gemm import experiment

    spec = load_kfc("kernels/gemm.kfc")
    gpu = FakeGpu(spec, SQUARE)
    rows, curves = experiment(spec, TARGET, (4096, 4096, 4096), [(8192, 8192, 8192)], [0, 1], 6, gpu, tmp_path,
                              log=lambda m: None)
    assert [r["seed"] for r in rows] == [0, 1] and set(curves) == {"seed 0", "seed 1"}
    for r in rows:
        assert r["best_us"] <= min(r["cold_best_us"], r["warm_best_us"]) and r["cold_run"] != r["warm_run"]
        assert r["warm_within_fraction"] == (r["warm_candidates_to_95"] is not None and (
            r["cold_candidates_to_95"] is None or r["warm_candidates_to_95"] <= r["cold_candidates_to_95"] / 3))
    assert all(len(c) == 6 for seed in curves.values() for c in seed.values())
    assert sorted(p.name for p in tmp_path.glob("*.sqlite")) == [
        "kb-cold-seed0.sqlite", "kb-cold-seed1.sqlite", "kb-others.sqlite", "kb-warm-seed0.sqlite",
        "kb-warm-seed1.sqlite"]
    calls = gpu.calls
    again, _ = experiment(spec, TARGET, (4096, 4096, 4096), [(8192, 8192, 8192)], [0, 1], 6, gpu, tmp_path,
                          log=lambda m: None)
    assert gpu.calls == calls and again == rows

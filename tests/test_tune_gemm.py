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
from kfc.model.records import Proposal, Stage
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
    # each run's first candidates kept with the result: the warm run's first is the prior's
    firsts = rows[0]["first_candidates"]
    assert [len(firsts[k]) for k in ("cold", "warm")] == [4, 4]
    assert firsts["warm"][0]["why"].startswith("prior from the knowledge base") and firsts["warm"][0]["us"] > 0
    assert sorted(p.name for p in tmp_path.glob("*.sqlite")) == [
        "kb-cold-seed0.sqlite", "kb-cold-seed1.sqlite", "kb-others.sqlite", "kb-warm-seed0.sqlite",
        "kb-warm-seed1.sqlite"]
    calls = gpu.calls
    again, _ = experiment(spec, TARGET, (4096, 4096, 4096), [(8192, 8192, 8192)], [0, 1], 6, gpu, tmp_path,
                          log=lambda m: None)
    assert gpu.calls == calls and again == rows


class WavesGpu(FakeGpu):
    """Times a candidate as waves of output tiles over 132 SMs, each wave a fixed overhead plus
    its tile's work: at 64 rows 64 x 64 tiles (128 of them, one wave) beat 64 x 128 (64, one
    wave); at 128 rows they need two waves and lose."""

    def __init__(self, spec, dims):
        super().__init__(spec, dims)
        self.dims = dims

    def time_of(self, pipeline):
        c = self.space.config_of(pipeline)
        if c is None:
            return 5000.0
        tiles = -(-self.dims["M"] // c["bm"]) * -(-self.dims["N"] // c["bn"])
        return -(-tiles // 132) * (10.0 + c["bm"] * c["bn"] / 1024) * (1 + 0.01 * abs(c["stages"] - 4))


def test_another_shapes_record_is_replayed_in_the_order_of_its_waves_here(kb):
    """A warm tune at 128 rows replays the 64-row record not fastest first but by the time the
    space's model of waves expects here: 64 x 64 tiles, fastest at 64 rows, fill two waves at 128
    rows, so the 64 x 128 tile (one wave at both) comes first. The knowledge base gives each prior
    trial its shape."""
    spec = load_kfc("kernels/gemm.kfc")
    skinny, here = {"M": 64, "N": 8192, "K": 8192}, {"M": 128, "N": 8192, "K": 8192}
    pipes = {}
    for bn in (64, 128, 256):  # the 64-row record: three tiles of 64 rows, timed by the waves model
        space = space_for(spec, skinny, TARGET)
        pipes[bn] = space.pipeline({**space.default(), "bm": 64, "bn": bn, "stages": 4})

    class Replay(SearchPolicy):  # proposes the three 64-row tiles, then what the search would
        def propose(self, ctx, n):
            return [p for p in (Proposal(pipes[bn], "planted", "test") for bn in (64, 128, 256))
                    if p.pipeline not in {t.proposal.pipeline for t in ctx.history}][:n] or super().propose(ctx, n)

    gpu64 = WavesGpu(spec, skinny)
    tune(spec, TARGET, skinny, 3, Replay(seed=0), kb, gpu64)
    assert gpu64.time_of(pipes[64]) < gpu64.time_of(pipes[128]) < gpu64.time_of(pipes[256])
    seen = []

    class Spy(SearchPolicy):
        def propose(self, ctx, n):
            seen.append(ctx)
            return super().propose(ctx, n)

    gpu128 = WavesGpu(spec, here)
    tune(spec, TARGET, here, 3, Spy(seed=0), kb, gpu128)
    ctx = seen[0]
    # the baseline here, then the 64-row record: the three planted tiles and the default there
    assert [t.shape for t in ctx.prior] == [here] + [skinny] * 4
    order = [(ctx.space.pipeline(c), why) for c, _, why in Spy(seed=0).prior_order(ctx)][1:]
    planted = [p for p, _ in order if p in pipes.values()]
    assert planted == [pipes[128], pipes[256], pipes[64]]  # one wave here first; the two waves last
    assert order[0][0] == pipes[128] and "us expected here" in order[0][1]
    assert gpu128.time_of(pipes[128]) < gpu128.time_of(pipes[64])
    # the planted order also wins here: the first proposal of the warm tune is the 64 x 128 tile
    first = kb.trials(op_id=kb.op_by_fingerprint(ctx.op_fingerprint)["id"], target=TARGET.name, shape=here)[1]
    assert first.proposal.pipeline == pipes[128]


def test_the_waves_model_scales_only_where_it_knows_the_products_dims():
    space = space_for(load_kfc("kernels/gemm.kfc"), SQUARE, TARGET)
    c = {**space.default(), "bm": 128, "bn": 256}
    # 4096^3: 512 tiles, four waves of 132; 8192 x 1024 x 8192: 256 tiles, two waves, twice the K
    assert space.scaled_time(c, 100.0, SQUARE, {"M": 8192, "N": 1024, "K": 8192}) == pytest.approx(100.0)
    assert space.scaled_time(c, 100.0, SQUARE, {"M": 4096, "N": 4096}) is None  # K not named
    assert attrs.evolve(space, roles=None).scaled_time(c, 100.0, SQUARE, SQUARE) is None


def test_the_model_centres_each_shape_of_the_record_on_its_own_mean():
    """Two configurations timed at two shapes, 4096^3 four times slower than 64 rows: centred per
    shape, each trial's deviation is its configuration's 5%, not its shape's factor of four."""
    from kfc.factory.model import TuneContext
    from kfc.model.records import Outcome, Trial

    spec = load_kfc("kernels/gemm.kfc")
    here = {"M": 128, "N": 8192, "K": 8192}
    space = space_for(spec, here, TARGET)
    fast, slow = ({**space.default(), "bm": 64, "bn": bn} for bn in (128, 256))
    cases = [(fast, 50.0, {"M": 64, "N": 8192, "K": 8192}), (slow, 55.0, {"M": 64, "N": 8192, "K": 8192}),
             (fast, 200.0, SQUARE), (slow, 220.0, SQUARE)]
    prior = tuple(Trial(i, Proposal(space.pipeline(c)), Outcome(Stage.TIMED, median_us=us), 7, shape)
                  for i, (c, us, shape) in enumerate(cases))
    ctx = TuneContext("gemm", "fp", {}, TARGET.name, here, space, (), prior)
    devs = [d for _, d, _ in SearchPolicy().observations(ctx)]
    assert len(devs) == 4 and all(abs(d) < 0.06 for d in devs)  # one centre per op would give +-0.7
    _, _, effect, _ = SearchPolicy().fit(ctx)
    assert effect[("bn", 128)] < effect[("bn", 256)]

"""The gate on the GPU: every planted cheat is rejected, including the two whose defence needs
a GPU (work on another stream; a time faster than the memory roofline)."""

import re

import pytest

torch = pytest.importorskip("torch")

import gate_cheats as cheats  # noqa: E402

from kfc.factory.gate import MAX_REPLAY_CALLS, MIN_REPLAY_US, Case, Gate, Problem, time_on_gpu  # noqa: E402
from kfc.model.records import Stage  # noqa: E402

pytestmark = pytest.mark.gpu


def gpu_problem():
    def make_inputs(dims, seed, scale):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = (torch.randn(dims["M"], dims["N"], generator=g, device="cuda") * scale).to(torch.bfloat16)
        return x, torch.randn(dims["N"], generator=g, device="cuda")

    def make_outputs(dims):
        return (torch.full((dims["M"], dims["N"]), float("nan"), dtype=torch.bfloat16, device="cuda"),)

    return Problem(make_inputs, make_outputs, lambda x, w: (cheats.rmsnorm(x, w),), lambda out: 1e-2,
                   lambda dims: 2 * dims["M"] * dims["N"] * 2 + dims["N"] * 4)


CASES = [Case({"M": 64, "N": 1024}, "tuned shape"), Case({"M": 1, "N": 1024}, "unseen shape M=1"),
         Case({"M": 7, "N": 1024}, "unseen shape M=7")]
TIMED = {"M": 8192, "N": 4096}


def gate():
    g = Gate(gpu_problem())
    g.remeasure = lambda fn, dims: time_on_gpu(Gate(gpu_problem()), fn, dims)
    return g


def test_an_honest_candidate_is_timed():
    r = gate().evaluate(cheats.honest, CASES, TIMED)
    assert r.stage is Stage.TIMED, r
    assert 0 < r.roofline_fraction < 1 and r.median_us > 0
    # and as a user calls it, one call at a time after an L2 flush: the same kernel, so the same
    # order of time (on an H100 a kfc rmsnorm's eager time was 0.85 of its back-to-back one)
    assert r.eager_us is not None and 0.3 * r.median_us < r.eager_us < 3 * r.median_us, r
    # each timed replay long enough that the graph's launch after a sync is a small part of it
    m = re.fullmatch(r"graph of (\d+) calls", r.notes)
    assert m, r.notes
    calls = int(m[1])
    assert calls * r.median_us >= MIN_REPLAY_US / 4 or calls > MAX_REPLAY_CALLS // 2, r


@pytest.mark.parametrize("cheat,defence", [
    (cheats.partial_writer, "written"), (cheats.Cacher(), "written"), (cheats.shape_specialist(64), "shapes"),
    (cheats.UninitialisedReader(), "deterministic"), (cheats.input_modifier, "inputs"),
    (cheats.wrong_return, "written"),
])
def test_correctness_cheats_are_rejected_on_the_gpu(cheat, defence):
    r = gate().evaluate(cheat, CASES, TIMED)
    assert r.stage not in (Stage.CORRECT, Stage.TIMED) and r.defence == defence, r


def test_work_on_another_stream_is_rejected():
    r = gate().evaluate(cheats.side_stream, CASES[:1], TIMED)
    assert r.stage is not Stage.TIMED and r.defence == "timed", r
    assert "outside the timed stream" in r.error


def test_a_time_below_the_roofline_is_rejected():
    # 3 seeds x 2 scales + 2 determinism calls + 2 warm-up calls of the 2 rotated sets: 10
    g = Gate(gpu_problem())
    # the re-measure runs in a fresh process, where the cheat starts honest again (2 warm-up calls)
    g.remeasure = lambda fn, dims: time_on_gpu(Gate(gpu_problem()), cheats.LazyOnceWarm(honest_calls=2), dims)
    r = g.evaluate(cheats.LazyOnceWarm(honest_calls=10), CASES[:1], TIMED)
    assert r.stage is not Stage.TIMED and r.defence == "roofline", r

"""The evaluation gate rejects every planted cheat whose defence needs no GPU (CPU tensors);
tests/gpu/test_gate_gpu.py covers the stream and roofline cheats on the GPU."""

import math

import pytest
import torch

from kfc.factory.gate import Case, Gate, GateResult, Problem
from kfc.model.records import Stage

import gate_cheats as cheats


def cpu_problem():
    def make_inputs(dims, seed, scale):
        g = torch.Generator().manual_seed(seed)
        x = (torch.randn(dims["M"], dims["N"], generator=g) * scale).to(torch.bfloat16)
        w = torch.randn(dims["N"], generator=g)
        return x, w

    def make_outputs(dims):
        return (torch.full((dims["M"], dims["N"]), float("nan"), dtype=torch.bfloat16),)

    return Problem(make_inputs, make_outputs, lambda x, w: (cheats.rmsnorm(x, w),), lambda out: 1e-2,
                   lambda dims: 2 * dims["M"] * dims["N"] * 2 + dims["N"] * 4)


CASES = [Case({"M": 8, "N": 96}, "tuned shape"), Case({"M": 1, "N": 96}, "unseen shape M=1"),
         Case({"M": 7, "N": 96}, "unseen shape M=7")]


def evaluate(fn):
    return Gate(cpu_problem()).evaluate(fn, CASES, None)


def test_an_honest_candidate_passes():
    r = evaluate(cheats.honest)
    assert r.stage is Stage.CORRECT and r.error == ""


@pytest.mark.parametrize("cheat,defence,words", [
    (cheats.partial_writer, "written", "unwritten"),
    (cheats.Cacher(), "written", "wrong results"),
    (cheats.shape_specialist(8), "shapes", "unseen shape"),
    (cheats.UninitialisedReader(), "deterministic", "differs between two calls"),
    (cheats.input_modifier, "inputs", "was modified"),
    (cheats.wrong_return, "written", "did not return the output"),
])
def test_each_cheat_is_rejected_by_its_defence(cheat, defence, words):
    r = evaluate(cheat)
    assert r.stage is not Stage.CORRECT and r.stage is not Stage.TIMED, r
    assert r.defence == defence, r
    assert words in r.error, r.error


def test_a_crashing_candidate_is_rejected_not_raised():
    def boom(x, w, out):
        raise RuntimeError("illegal memory access")

    r = evaluate(boom)
    assert r.defence == "written" and "illegal memory access" in r.error


def _fake_timer(us):
    def timer(gate, fn, dims):
        return GateResult(Stage.TIMED, median_us=us, spread_us=0.0, times_us=(us,))
    return timer


def test_faster_than_the_roofline_is_remeasured_then_rejected():
    dims = {"M": 4096, "N": 4096}  # 64 MB: at least ~15 us at 4.25 TB/s
    remeasured = []

    def remeasure(fn, d):
        remeasured.append(d)
        return GateResult(Stage.TIMED, median_us=0.5)

    gate = Gate(cpu_problem(), timer=_fake_timer(0.5), remeasure=remeasure)
    r = gate.evaluate(cheats.honest, [Case({"M": 2, "N": 96})], dims)
    assert remeasured == [dims]
    assert r.defence == "roofline" and "faster than the memory roofline" in r.error and r.stage is Stage.CORRECT


def test_a_fluke_below_the_roofline_is_replaced_by_the_fresh_measurement():
    dims = {"M": 4096, "N": 4096}
    gate = Gate(cpu_problem(), timer=_fake_timer(0.5), remeasure=lambda fn, d: GateResult(Stage.TIMED, median_us=40.0))
    r = gate.evaluate(cheats.honest, [Case({"M": 2, "N": 96})], dims)
    assert r.stage is Stage.TIMED and r.median_us == 40.0
    floor = (2 * 4096 * 4096 * 2 + 4096 * 4) / 4.25e12 * 1e6
    assert math.isclose(r.roofline_fraction, floor / 40.0)


def test_a_plausible_time_is_accepted_with_its_roofline_fraction():
    gate = Gate(cpu_problem(), timer=_fake_timer(100.0))
    r = gate.evaluate(cheats.honest, [Case({"M": 2, "N": 96})], {"M": 4096, "N": 4096})
    assert r.stage is Stage.TIMED and 0 < r.roofline_fraction < 1 and r.bytes_moved == 2 * 4096 * 4096 * 2 + 4096 * 4


def test_a_timed_replay_runs_a_millisecond_of_calls_within_its_cap():
    """time_on_gpu's replays: short batches repeated to MIN_REPLAY_US, long ones once, never past
    MAX_REPLAY_CALLS calls (a candidate whose work escapes the timed stream times as nearly 0)."""
    from kfc.factory.gate import MAX_REPLAY_CALLS, MIN_REPLAY_US, repeats_for

    assert repeats_for(180.0, 1) == 6 and 6 * 180.0 >= MIN_REPLAY_US  # one 256 MB row kernel
    assert repeats_for(100.0, 2) == 10  # two 50 us GEMMs a batch
    assert repeats_for(5000.0, 1) == 1 and repeats_for(MIN_REPLAY_US, 4) == 1
    assert repeats_for(0.0, 32) * 32 == MAX_REPLAY_CALLS and repeats_for(3.0, 32) * 32 <= MAX_REPLAY_CALLS
    assert repeats_for(0.0, 1000) == 1  # a rotation past the cap still runs once

"""A short tune on the GPU end to end: compile workers, a GPU worker process, the gate, the
knowledge base."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def test_a_short_tune_records_and_beats_or_keeps_the_baseline(tmp_path, monkeypatch):
    from kfc.factory.evaluate import Evaluator
    from kfc.factory.model import Stage
    from kfc.factory.offline import SearchPolicy
    from kfc.factory.tune import tune
    from kfc.frontend import load_kfc
    from kfc.kb.store import KnowledgeBase
    from kfc.target import parse_target

    monkeypatch.setenv("KFC_CACHE_DIR", str(tmp_path / "cache"))
    kb = KnowledgeBase(tmp_path / "kb.sqlite")
    spec = load_kfc("kernels/rmsnorm.kfc")
    ev = Evaluator(["0"], timeout_s=300)
    try:
        r = tune(spec, parse_target("sm_90a"), {"M": 4096, "N": 2048}, 4, SearchPolicy(seed=1), kb, ev)
    finally:
        ev.close()
    assert r.candidates == 4 and r.baseline is not None and r.baseline.outcome.stage is Stage.TIMED
    assert r.best is not None and r.best.outcome.median_us <= r.baseline.outcome.median_us
    trials = kb.trials(run_id=r.run_id)
    assert len(trials) == 5  # the baseline and four candidates, each with its outcome

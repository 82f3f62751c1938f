"""A short tune on the GPU end to end: compile workers, a GPU worker process, the gate, the
knowledge base."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def test_a_short_tune_records_and_beats_or_keeps_the_baseline(tmp_path, monkeypatch):
    from kfc.factory.evaluate import Evaluator
    from kfc.model.records import Stage
    from kfc.factory.offline import SearchPolicy
    from kfc.factory.tune import tune
    from kfc.frontend import load_kfc
    from kfc.kb.store import KnowledgeBase
    from kfc.model.target import parse_target

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


def test_a_quantisation_passes_the_gate_against_torchs_cpu_bytes(tmp_path, monkeypatch):
    """Exact outputs (e4m3 codes) are gated against the check block's authority, torch on the
    CPU, not torch's GPU kernels (whose scale divides through a reciprocal)."""
    from kfc.factory.evaluate import Evaluator
    from kfc.model.records import Stage
    from kfc.factory.offline import SearchPolicy
    from kfc.factory.tune import tune
    from kfc.frontend import load_kfc
    from kfc.kb.store import KnowledgeBase
    from kfc.model.target import parse_target

    monkeypatch.setenv("KFC_CACHE_DIR", str(tmp_path / "cache"))
    kb = KnowledgeBase(tmp_path / "kb.sqlite")
    spec = load_kfc("examples/fp8_quant.kfc", {"T": "bf16"})
    assert spec.check.exact_reference == "cpu"
    ev = Evaluator(["0"], timeout_s=300)
    try:
        r = tune(spec, parse_target("sm_90a"), {"M": 4096, "N": 4096}, 1, SearchPolicy(seed=1), kb, ev)
    finally:
        ev.close()
    assert r.baseline is not None and r.baseline.outcome.stage is Stage.TIMED, r.baseline


def test_kfc_tune_killed_with_sigkill_keeps_its_records_and_the_same_command_resumes(tmp_path):
    import os
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    from kfc.model.records import Stage
    from kfc.kb.store import KnowledgeBase

    kb_path, budget = tmp_path / "kb.sqlite", 16
    cmd = [sys.executable, "-m", "kfc", "tune", "kernels/rmsnorm.kfc", "--shape", "M=4096,N=2048", "--budget",
           str(budget), "--kb", str(kb_path), "-o", str(tmp_path / "out")]
    env = dict(os.environ, KFC_CACHE_DIR=str(tmp_path / "cache"))
    child = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    recorded, deadline = 0, time.monotonic() + 300
    try:
        while recorded < 5:  # the baseline and at least four candidates committed
            assert child.poll() is None, f"the tune ended on its own: {child.stderr.read().decode()}"
            assert time.monotonic() < deadline, "the tune recorded nothing for 300 s"
            time.sleep(0.2)
            if kb_path.exists():
                with sqlite3.connect(f"file:{kb_path}?mode=ro", uri=True) as raw:
                    try:
                        recorded = raw.execute("SELECT COUNT(*) FROM outcomes").fetchone()[0]
                    except sqlite3.OperationalError:
                        recorded = 0  # the schema is still being created
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the tune and its GPU worker, mid-run
        child.wait(timeout=30)
    with KnowledgeBase(kb_path, create=False) as kb:
        assert kb.integrity_check() == "ok"
        before = {t.candidate_id: t.outcome for t in kb.trials()}
        assert len(before) >= recorded and all(o.stage is not None for o in before.values())
        (run,) = kb.runs()
        assert run["status"] == "running"
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert again.returncode == 0, again.stderr
    with KnowledgeBase(kb_path, create=False) as kb:
        (run,) = kb.runs()  # resumed, not a second run
        assert run["status"] == "finished"
        after = {t.candidate_id: t.outcome for t in kb.trials()}
        assert all(after[c] == o for c, o in before.items())  # nothing recorded was lost or rewritten
        assert len(kb.trials(run_id=run["id"])) == budget + 1 and kb.pending(run["id"]) == []
        assert any(o.stage is Stage.TIMED for o in after.values())
    assert (tmp_path / "out").is_dir()  # the best kernel was written

"""tests/upstream/kda.py, the runner of fla's and FlashKDA's KDA tests against kfc, on a stand-in
suite: it reports every outcome with its reason, and a run stopped at its limit keeps what it ran."""

import json
import runpy
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parent / "upstream" / "kda.py"

SUITE = '''
import time
import pytest

def test_quick():
    pass

def test_wrong():
    assert 1 == 2, "one is not two"

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass

def test_slow():
    time.sleep(60)

def test_after():
    pass
'''


def _run(tmp_path, monkeypatch, timeout):
    tests = tmp_path / "suite" / "tests"
    tests.mkdir(parents=True)
    (tests / "test_standin.py").write_text(SUITE)
    out = tmp_path / "report.json"
    import bench.provenance

    monkeypatch.setattr(bench.provenance, "RESULTS", tmp_path / "results")  # not the project's results
    monkeypatch.setattr(sys, "argv", ["kda.py", "flashkda", "--tests", str(tests), "--timeout", str(timeout),
                                      "--out", str(out)])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(RUNNER), run_name="__main__")
    return exit_.value.code, json.loads(out.read_text())


def test_a_run_stopped_at_its_limit_keeps_the_outcomes_it_had(tmp_path, monkeypatch, capsys):
    code, report = _run(tmp_path, monkeypatch, timeout=8)
    assert code == 1 and report["pytest_exit"] == "timeout"
    outcomes = {r["test"].split("::")[-1]: r for r in report["cases"]}
    assert set(outcomes) == {"test_quick", "test_wrong", "test_skipped"}  # test_after not reached
    assert outcomes["test_quick"]["outcome"] == "passed"
    assert outcomes["test_wrong"]["outcome"] == "failed" and "one is not two" in outcomes["test_wrong"]["why"]
    assert outcomes["test_skipped"]["outcome"] == "skipped" and "not here" in outcomes["test_skipped"]["why"]
    assert "stopped at its 8 s limit" in capsys.readouterr().out


def test_the_fla_adapter_runs_chunk_kda_as_its_pair_where_asked(tmp_path):
    """--split: the conftest the runner writes above fla's tests sets kfc.nn.kda.FLA_SPLIT, so
    fla's chunk_kda calls run kfc's pair of kernels; without it, not."""
    upstream = runpy.run_path(str(RUNNER))
    tests = tmp_path / "fla-tests"
    tests.mkdir()
    (tests / "conftest.py").write_text("")
    (tests / "test_kda.py").write_text("")
    for split in (True, False):
        where = tmp_path / f"run-{split}"
        where.mkdir()
        upstream["prepare"]("fla", tests, where, split)
        conftest = (where / "conftest.py").read_text()
        assert ("kfc.nn.kda.FLA_SPLIT = True" in conftest) == split
        assert "fla.ops.kda.chunk_kda = kfc.nn.kda.chunk_kda" in conftest

"""The front end, the check runner and the CLI under fuzzing: mutated and truncated versions of
the kernels in kernels/ and of random row programs go through `kfc opt`, `kfc check` and
`kfc compile` in-process. Never an internal error, never a traceback; bad input is exit 2 with
one message at `file:line:col`; every command ends within its time bound.

The example counts add up to more than 2000 in CI; KFC_FUZZ_EXAMPLES scales them for a longer
hunt (the search is derandomized, so CI sees the same inputs every run). Mutants often generate
the same kernel: the suite's build cache (conftest.py) runs nvcc once for each.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_inputs import mutated, row_programs
from kfc.cli import main

REPO = Path(__file__).resolve().parent.parent
SEEDS = {p.name: p.read_text() for p in sorted((REPO / "kernels").glob("*.kfc"))}
SCALE = float(os.environ.get("KFC_FUZZ_EXAMPLES", "1"))
LOCATED = re.compile(r"^\S+:\d+:\d+: error: \S")
TIME_BOUND_S = 60.0  # per command: parse, interpret, reference and nvcc included
# examples per test in CI (at least 2000 in all)
EXAMPLES = {"kernels-opt-check": 900, "kernels-compile": 350, "programs": 300, "programs-mutated": 500}

pytestmark = pytest.mark.slow  # minutes: run first (conftest.py)

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


OUTCOMES: Counter = Counter()  # (command, exit status) over every example this process ran
# the same for the random row programs alone, per test: (test, command, exit status)
GENERATED: Counter = Counter()
PROGRAM_TESTS = 2  # the random row programs' examples split over two tests, which two workers run at once


@pytest.fixture(scope="module", autouse=True)
def reached_deep_stages():
    """The fuzzer is worth its time only if inputs get past the parser: at full scale, many of
    the random row programs must check and compile successfully (a summary is printed either
    way). Counted per test, so it holds however pytest-xdist spreads this module's tests."""
    yield
    print("\nfuzz outcomes (command, exit status): " + ", ".join(f"{c} {k}: {n}" for (c, k), n in sorted(OUTCOMES.items())))
    per_test = EXAMPLES["programs"] // PROGRAM_TESTS
    for test in {t for t, _, _ in GENERATED}:
        ran = Counter({(c, k): n for (t, c, k), n in GENERATED.items() if t == test})
        if SCALE >= 1 and sum(ran.values()) >= 3 * per_test:
            assert ran[("check", 0)] >= 2 * per_test // 3 and ran[("compile", 0)] >= per_test // 3, (test, ran)


def run(argv: list[str]) -> tuple[int, str, float]:
    out, err = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue(), time.perf_counter() - started


def assert_well_behaved(argv: list[str], source: bytes, path: Path) -> int:
    code, err, took = run(argv)
    OUTCOMES[(argv[0], code)] += 1
    shown = source.decode(errors="replace")[:3000]
    context = f"kfc {' '.join(argv)}\n--- input ---\n{shown}\n--- stderr ---\n{err}"
    assert "Traceback" not in err, context
    assert code in (0, 1, 2), f"exit {code}\n{context}"
    assert took < TIME_BOUND_S, f"{took:.1f} s\n{context}"
    if code == 2:
        first = err.splitlines()[0] if err else ""
        assert first.startswith(f"{path}:") and LOCATED.match(first), f"not located at file:line:col\n{context}"
        assert err.count(": error: ") == 1, context
    return code


def commands(path: Path, out: Path) -> list[list[str]]:
    return [["opt", str(path)],
            # the first instance: a kernel generic over several dtypes is one input here, not eight
            ["check", str(path), "--budget", "2048", "--seed", "5", "--reference-timeout", "30", "--first"],
            ["compile", str(path), "-o", str(out), "--target", "sm_90a"]]


def fuzz_one(source: bytes, workdir: Path, name: str, which=(0, 1, 2)) -> None:
    path = workdir / name
    path.write_bytes(source)
    cmds = commands(path, workdir / "out")
    for k in which:
        assert_well_behaved(cmds[k], source, path)


@settings(FUZZ, max_examples=int(EXAMPLES["kernels-opt-check"] * SCALE))
@given(st.sampled_from(sorted(SEEDS)), st.data())
def test_mutated_kernels_through_opt_and_check(workdir, seed, data):
    source = data.draw(mutated(SEEDS[seed]))
    fuzz_one(source, workdir, "mutant.kfc", which=(0, 1))


@settings(FUZZ, max_examples=int(EXAMPLES["kernels-compile"] * SCALE))
@given(st.sampled_from(sorted(SEEDS)), st.data())
def test_mutated_kernels_through_compile(workdir, seed, data):
    source = data.draw(mutated(SEEDS[seed]))
    fuzz_one(source, workdir, "mutant.kfc", which=(2,))


def check_and_compile(test: str, source: str, workdir: Path) -> None:
    path = workdir / f"{test}.kfc"
    path.write_text(source)
    for argv in commands(path, workdir / f"out-{test}"):
        code = assert_well_behaved(argv, source.encode(), path)
        GENERATED[(test, argv[0], code)] += 1
        if argv[0] == "opt":
            assert code == 0, f"a generated program is valid\n{source}"


# two tests with different names: hypothesis derandomizes each from its own name, so their
# programs differ
@settings(FUZZ, max_examples=int(EXAMPLES["programs"] // PROGRAM_TESTS * SCALE))
@given(row_programs())
def test_random_row_programs_check_and_compile(workdir, source):
    check_and_compile("gen", source, workdir)


@settings(FUZZ, max_examples=int(EXAMPLES["programs"] // PROGRAM_TESTS * SCALE))
@given(row_programs())
def test_more_random_row_programs_check_and_compile(workdir, source):
    check_and_compile("gen2", source, workdir)


@settings(FUZZ, max_examples=int(EXAMPLES["programs-mutated"] * SCALE))
@given(row_programs(), st.data())
def test_mutated_random_programs(workdir, source, data):
    fuzz_one(data.draw(mutated(source)), workdir, "genmut.kfc")


def test_the_fuzzer_runs_at_least_2000_examples():
    assert sum(EXAMPLES.values()) >= 2000

"""The reference runs in a child process: every way it can fail is one clear error at the
`reference` line; it sees no secrets and works in a scratch folder; `kfc compile` and `kfc opt`
never run it, `kfc check` does."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from kfc.check.runner import check_op, run_reference
from kfc.check.sandbox import Limits, ReferenceFailed, ReferenceSandbox
from kfc.cli import main
from kfc.diagnostics import KfcError
from kfc.frontend import parse_kfc

pytestmark = pytest.mark.xdist_group("sandbox")  # on one pytest-xdist worker: it starts one reference child

OP = """op twice(x: f32[M, N], s: f32 = 2.0) -> (y: f32[M, N]) {{
  parallel m in 0..M {{ y[m, :] = x[m, :] * s }}
}}
check {{
  reference = {ref}
  shapes = [{{M: 3, N: 5}}]
}}
"""


def source(ref: str) -> str:
    return OP.format(ref=json.dumps(ref))


def spec_with(ref: str, path: str = "t.kfc"):
    return parse_kfc(source(ref), path)


def reference_error(ref: str, limits: Limits | None = None, box: ReferenceSandbox | None = None) -> ReferenceFailed:
    spec = spec_with(ref)
    x = np.random.default_rng(0).normal(size=(3, 5)).astype(np.float32)
    with pytest.raises(ReferenceFailed) as info:
        run_reference(spec, {"x": x, "s": 2.0}, {"M": 3, "N": 5}, limits=limits, sandbox=box)
    e = info.value
    assert e.span is not None and e.span.line == 5, "the error names the reference line"
    assert "Traceback" not in e.render() and e.hint
    return e


@pytest.fixture(scope="module")
def box():
    b = ReferenceSandbox(Limits(timeout_s=20))
    yield b
    b.close()


def test_a_right_reference_gives_its_outputs(box):
    spec = spec_with("x * s")
    x = np.random.default_rng(1).normal(size=(3, 5)).astype(np.float32)
    [y] = run_reference(spec, {"x": x, "s": 2.0}, {"M": 3, "N": 5}, sandbox=box)
    assert y.dtype == np.float64 and np.array_equal(y, x.astype(np.float64) * 2)


@pytest.mark.parametrize("ref, words", [
    ("exit(0)", "called exit(0)"),
    ("__import__('sys').exit(3)", "called exit(3)"),
    ("1 / 0", "raised ZeroDivisionError"),
    ("None", "returned None"),
    ("(x, x)", "returned 2 value(s) for 1 output(s)"),
    ("x.sum(-1)", "has shape [3]; the op's y is [3, 5]"),
    ("'text'", "returned a str for output 'y'"),
    ("{'z': x}", "without 'y'"),
])
def test_each_failure_is_one_clear_error(box, ref, words):
    e = reference_error(ref, box=box)
    assert words in e.message, e.message


def test_a_crash_by_signal_is_reported_and_the_next_call_starts_afresh(box):
    e = reference_error("__import__('os').kill(__import__('os').getpid(), 11)", box=box)
    assert "crashed (signal SIGSEGV)" in e.message
    e = reference_error("__import__('os')._exit(0)", box=box)
    assert "exited (status 0) before returning the outputs" in e.message
    test_a_right_reference_gives_its_outputs(box)


def test_an_endless_reference_is_stopped_at_the_time_limit():
    b = ReferenceSandbox(Limits(timeout_s=1.5))
    try:
        e = reference_error("[0 for _ in iter(int, 1)]", box=b)
        assert "did not finish within 1.5 s" in e.message and "--reference-timeout" in e.hint
    finally:
        b.close()


def test_a_reference_that_exhausts_memory_is_stopped():
    b = ReferenceSandbox(Limits(timeout_s=60, memory_bytes=256 << 20))
    try:
        e = reference_error("torch.ones(1 << 33)", box=b)  # 32 GiB
        assert "memory" in e.message and "--reference-memory" in e.hint
    finally:
        b.close()


def test_the_reference_sees_no_secrets_and_a_scratch_folder(box, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-do-not-leak")
    monkeypatch.setenv("KFC_SESSION_TOKEN", "tok")
    box.close()  # the environment is the child's at its start
    probe = ("x * 0 + float(len(__import__('os').environ.get('ANTHROPIC_API_KEY', '')) "
             "+ len(__import__('os').environ.get('KFC_SESSION_TOKEN', '')) "
             "+ 100 * (__import__('os').getcwd() == " + repr(os.getcwd()) + "))")
    spec = spec_with(probe)
    x = np.ones((3, 5), np.float32)
    [y] = run_reference(spec, {"x": x, "s": 2.0}, {"M": 3, "N": 5}, sandbox=box)
    assert np.all(y == 0), "the child saw a secret or ran in kfc's working folder"
    scratch = box.scratch
    assert scratch and Path(scratch).is_dir()
    spec = spec_with("open('left-behind.txt', 'w').write('x') * 0 + x")
    run_reference(spec, {"x": x, "s": 2.0}, {"M": 3, "N": 5}, sandbox=box)
    assert (Path(scratch) / "left-behind.txt").exists() and not Path("left-behind.txt").exists()
    box.close()
    assert not Path(scratch).exists(), "the scratch folder outlived the child"


def test_a_function_reference_is_imported_in_the_child_with_its_error_line(box, tmp_path, monkeypatch):
    (tmp_path / "myref.py").write_text(textwrap.dedent("""\
        def good(x, s):
            return x * s

        def bad(x, s):
            return x.nope
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    box.close()
    spec = spec_with("myref:good")
    x = np.ones((3, 5), np.float32)
    [y] = run_reference(spec, {"x": x, "s": 2.0}, {"M": 3, "N": 5}, sandbox=box)
    assert np.all(y == 2)
    e = reference_error("myref:bad", box=box)
    assert "AttributeError" in e.message and f"{tmp_path / 'myref.py'}:5" in e.message
    e = reference_error("myref:missing", box=box)
    assert "has no function 'missing'" in e.message
    e = reference_error("nosuchmodule_kfc:f", box=box)
    assert "cannot import the reference module 'nosuchmodule_kfc'" in e.message


def test_gpu_style_torch_inputs_travel_too(box):
    spec = spec_with("x * s")
    x = torch.randn(3, 5, dtype=torch.bfloat16)
    [y] = run_reference(spec, {"x": x, "s": 3.0}, {"M": 3, "N": 5}, sandbox=box)
    assert np.array_equal(y, (x * 3.0).double().numpy())


def test_kfc_check_reports_a_failing_reference_with_exit_2(tmp_path, capsys):
    f = tmp_path / "ex.kfc"
    f.write_text(source("exit(0)"))
    assert main(["check", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{f}:5:") and "called exit(0)" in err and "Traceback" not in err


def test_compile_and_opt_never_run_the_reference_and_check_does(tmp_path):
    marker = tmp_path / "ran"
    ref = f"open({str(marker)!r}, 'w').write('1') * 0 + x * s"
    f = tmp_path / "probe.kfc"
    f.write_text(source(ref))
    spec = parse_kfc(f.read_text(), str(f))
    assert "open(" in spec.check.reference
    assert main(["opt", str(f), "--shape", "N=5"]) == 0
    assert main(["compile", str(f), "--target", "sm_90a", "-o", str(tmp_path / "out")]) == 0
    assert not marker.exists(), "kfc opt or kfc compile ran the reference"
    assert main(["check", str(f)]) == 0
    assert marker.exists(), "kfc check did not run the reference"


def test_check_op_runs_the_reference_in_the_child():
    spec = spec_with("torch.tensor(float(__import__('os').getpid())).expand(3, 5) * 0 + x * s")
    results = check_op(spec, seeds=[0])
    assert all(r.ok for r in results)


def test_limits_are_checked():
    with pytest.raises(KfcError, match="must be positive"):
        Limits(timeout_s=0)
    with pytest.raises(KfcError, match="at least 64 MiB"):
        Limits(memory_bytes=1000)


@pytest.mark.parametrize("how", ["a plain child", "a child that left the session (setsid)"])
def test_what_a_reference_starts_ends_with_its_process(tmp_path, how):
    """A reference that leaves a process behind, even one detached into its own session: the
    reference's child process is its subreaper, and closing the sandbox ends it."""
    marker = f"kfc-orphan-{os.getpid()}-{len(how)}"
    script = tmp_path / f"{marker}.sh"
    script.write_text("sleep 600\n")
    start = (f"__import__('subprocess').Popen(['sh', '-c', '(setsid sh {script} &) ; exit 0']).wait()"
             if "setsid" in how else f"__import__('subprocess').Popen(['sh', '{script}'])")
    box = ReferenceSandbox(Limits(timeout_s=30))
    try:
        x = np.ones((3, 5), np.float32)
        out = run_reference(spec_with(f"({start}, x * s)[1]"), {"x": x, "s": 2.0}, {"M": 3, "N": 5}, sandbox=box)
        assert np.array_equal(out[0], 2 * x)
        # the shell it started may not have run yet on a loaded machine: wait for it a while
        started = time.monotonic() + 10
        while not _running(marker) and time.monotonic() < started:
            time.sleep(0.05)
        assert _running(marker), "the reference's process started"
    finally:
        box.close()
    deadline = time.monotonic() + 10
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(marker), f"{how} outlived the sandbox"


def _running(marker: str) -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in cmdline and b"sh\x00" in cmdline:
                return True
    return False

"""The command line: exit codes, outputs, help that teaches, and no tracebacks."""

import subprocess
import sys

import pytest

from kfc.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "kfc.cli", *args], capture_output=True, text=True)


def test_check_passes_and_prints_a_table(capsys):
    assert main(["check", "kernels/softmax.kfc", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "rel RMSE" in out and "passed" in out and "softmax" in out


def test_check_with_explicit_shape(capsys):
    assert main(["check", "kernels/rmsnorm.kfc", "--shape", "M=2,N=33", "--seed", "1"]) == 0
    assert "M=2, N=33" in capsys.readouterr().out


def test_check_first_takes_the_first_instance_alone(capsys):
    """rmsnorm<T: bf16 | f16 | f32>: every dtype by default, bf16 alone with --first."""
    assert main(["check", "kernels/rmsnorm.kfc", "--shape", "M=2,N=33", "--seed", "1"]) == 0
    every = capsys.readouterr().out
    assert main(["check", "kernels/rmsnorm.kfc", "--shape", "M=2,N=33", "--seed", "1", "--first"]) == 0
    first = capsys.readouterr().out
    assert all(f"y: {t} " in every for t in ("bf16", "f16", "f32")) and "passed: 6 output" in every
    assert "y: bf16 " in first and "y: f16 " not in first and "passed: 2 output" in first


def test_failing_check_exits_1(tmp_path, capsys):
    bad = tmp_path / "bad.kfc"
    bad.write_text(open("kernels/rmsnorm.kfc").read().replace("rsqrt(mean(xr * xr) + eps)", "rsqrt(mean(xr * xr) + 1.0)"))
    assert main(["check", str(bad), "--seed", "0"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out
    # the op as written fails as its final IR does: no pass is blamed
    assert "the op as written departs from the reference too" in out and "the final IR departs" not in out


def test_opt_round_trips_through_a_file(tmp_path, capsys):
    out = tmp_path / "kda.kir"
    assert main(["opt", "kernels/kda_fwd.kfc", "-o", str(out)]) == 0
    assert main(["opt", str(out)]) == 0
    assert capsys.readouterr().out == out.read_text()


def test_opt_specialises(capsys):
    assert main(["opt", "kernels/gemm.kfc", "--shape", "M=4,N=8,K=16"]) == 0
    text = capsys.readouterr().out
    assert "bf16[4, 16] @global" in text and "tile.dim" not in text


def test_bad_shape_flag_is_reported():
    r = run_cli("opt", "kernels/gemm.kfc", "--shape", "Q=3")
    assert r.returncode == 2 and "not a dimension" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [["--help"], ["check", "--help"], ["opt", "--help"]])
def test_help_teaches(args):
    r = run_cli(*args)
    assert r.returncode == 0
    assert "example" in r.stdout


def test_no_command_prints_help_and_exits_2():
    r = run_cli()
    assert r.returncode == 2 and "COMMAND" in r.stdout


def test_missing_file_is_one_clear_message():
    r = run_cli("check", "kernels/nope.kfc")
    assert r.returncode == 2
    assert r.stderr.startswith("kfc: error: no such file: kernels/nope.kfc")
    assert "Traceback" not in r.stderr


def test_bad_program_exits_2_with_location(tmp_path):
    f = tmp_path / "bad.kfc"
    f.write_text("op f(x: f32[N]) -> (y: f32[N]) {\n  y = x +\n}\n")
    r = run_cli("opt", str(f))
    assert r.returncode == 2
    assert r.stderr.startswith(f"{f}:3:1: error: syntax error")
    assert "^" in r.stderr and "hint:" in r.stderr and "Traceback" not in r.stderr


def test_carriage_return_does_not_shift_error_lines(tmp_path):
    # the parser counts lines by "\n" alone: a lone "\r" must not make the report point past a line
    f = tmp_path / "cr.kfc"
    f.write_bytes(b'\t\r# note\nop f(x: f32[N]) -> (y: f32[N]) {\n  y = x\n}\ncheck {\n  reference = "')
    r = run_cli("opt", str(f))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"{f}:6:15: error: syntax error: unterminated string"), r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


def test_output_file_not_left_half_written_on_error(tmp_path):
    f = tmp_path / "bad.kfc"
    f.write_text("op f(x: f32[N]) -> (y: f32[N]) { y = exp(x, x) }\n")
    out = tmp_path / "out.kir"
    r = run_cli("opt", str(f), "-o", str(out))
    assert r.returncode == 2 and not out.exists()
    assert list(tmp_path.iterdir()) == [f]


def test_main_called_again_parses_afresh(capsys, tmp_path):
    """One parser serves every call in a process: an option given once is given once each time,
    and one given twice is refused each time."""
    from kfc import cli

    for _ in range(2):
        assert main(["opt", "kernels/rmsnorm.kfc", "--dtype", "T=f16", "-o", str(tmp_path / "a.kir")]) == 0
        assert main(["opt", "kernels/rmsnorm.kfc", "-o", str(tmp_path / "b.kir"), "-o", str(tmp_path / "c.kir")]) == 2
        assert "given twice" in capsys.readouterr().err
    assert cli._parser() is cli._parser()
    assert "f16" in (tmp_path / "a.kir").read_text() and not (tmp_path / "b.kir").exists()


def test_compile_says_when_a_shape_it_was_given_stays_a_run_time_dim(tmp_path, capsys):
    """The row count (or a dim the parallel loop's bounds read) is never fixed at compile time:
    a --shape that gives it is said to be left to each call, not dropped in silence."""
    assert main(["compile", "kernels/rmsnorm.kfc", "--shape", "M=1024,N=4096", "-o", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "dims N=4096; run-time dims M" in out and "--shape M=1024 not fixed: a run-time dim" in out
    assert main(["compile", "kernels/rmsnorm.kfc", "--shape", "N=4096", "-o", str(tmp_path / "b")]) == 0
    assert "not fixed" not in capsys.readouterr().out


def test_rows_of_f64_are_refused_by_compile_at_the_load_and_left_unchecked_by_check(tmp_path, capsys):
    """A row kernel moves and sums 4-byte elements: f64 rows are refused where they are loaded,
    and kfc check says the final IR was not checked instead of failing it (its sums were f32)."""
    path = tmp_path / "f64.kfc"
    path.write_text("""op f64op(x: f64[M, N]) -> (y: f64[M]) {
  parallel m in 0..M {
    xr = x[m, :]
    y[m] = sqrt(sum(xr * xr))
  }
}
check {
  reference = "x.norm(dim=-1)"
  shapes = [{M: 5, N: 300}]
}
""")
    assert main(["compile", str(path), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3:10: error: rows of f64 are not supported yet" in err and "Traceback" not in err
    assert main(["check", str(path), "--seed", "0"]) == 0
    assert "final IR of f64op not checked: rows of f64" in capsys.readouterr().out


def test_verify_each_on_ir_text_asks_for_the_sizes_it_lacks(tmp_path, capsys):
    """IR text has no check block to take sizes from: --verify-each names the dims to give
    (drawing inputs of a symbolic size was an internal error)."""
    assert main(["opt", "kernels/rmsnorm.kfc", "--dtype", "T=f32"]) == 0
    path = tmp_path / "rms.kir"
    path.write_text(capsys.readouterr().out)
    assert main(["opt", str(path), "-p", "canonicalize", "--verify-each"]) == 2
    err = capsys.readouterr().err
    assert "needs a size for M, N" in err and "--shape M=8,N=8" in err and "Traceback" not in err
    assert main(["opt", str(path), "-p", "canonicalize", "--verify-each", "--shape", "M=3,N=64"]) == 0

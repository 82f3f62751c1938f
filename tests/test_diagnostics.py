"""Golden tests for bad input: every `tests/golden/diagnostics/NAME.kfc` must fail with exactly the
message in `NAME.expected` (what `kfc opt tests/golden/diagnostics/NAME.kfc` prints to stderr,
run from the repository root).

To regenerate the expected files after a deliberate change to a message:

    KFC_UPDATE_GOLDEN=1 pytest tests/test_diagnostics.py

then read the diff: every message must point at the right place and end with a useful hint.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kfc.diagnostics import KfcError
from kfc.frontend import load_kfc

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden" / "diagnostics"
CASES = sorted(GOLDEN.glob("*.kfc"))
UPDATE = os.environ.get("KFC_UPDATE_GOLDEN") == "1"

# `file:line:col: error: ...` for a problem in the text, `kfc: error: ...` for one with the file itself
LOCATED = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?P<col>\d+): error: \S")


def rel(path: Path) -> str:
    """The path as the tests pass it, relative to the repository root."""
    return path.relative_to(REPO).as_posix()


def render(path: Path) -> str:
    """What `kfc opt` prints to stderr for this file: the rendered error and a newline."""
    with pytest.raises(KfcError) as info:
        load_kfc(rel(path))
    return info.value.render() + "\n"


@pytest.fixture
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_golden_diagnostic(case: Path, at_repo_root) -> None:
    got = render(case)
    expected_file = case.with_suffix(".expected")
    if UPDATE:
        expected_file.write_text(got)
    assert expected_file.exists(), f"{rel(expected_file)} is missing; run with KFC_UPDATE_GOLDEN=1 and review it"
    assert got == expected_file.read_text()


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_golden_message_shape(case: Path, at_repo_root) -> None:
    """One error, at this file, with the offending line, a caret under it and a hint."""
    text = render(case)
    lines = text.rstrip("\n").split("\n")
    m = LOCATED.match(lines[0])
    assert m, lines[0]
    assert m["file"] == rel(case)
    line, col = int(m["line"]), int(m["col"])
    source = case.read_text().splitlines()
    assert 1 <= line <= max(len(source), 1)
    assert len(lines) == 4, text  # header, source line, caret, hint
    assert lines[1] == "    " + source[line - 1].expandtabs(4)
    assert re.fullmatch(r" {4}( *)\^~*", lines[2]), lines[2]
    assert lines[2].index("^") - 4 == len(source[line - 1][:col - 1].expandtabs(4))  # under the column, tabs expanded
    assert lines[3].startswith("hint: ") and len(lines[3]) > len("hint: ") + 10
    assert text.count(": error: ") == 1


def test_every_case_has_a_reviewed_expected_file() -> None:
    expected = {p.stem for p in GOLDEN.glob("*.expected")}
    cases = {p.stem for p in CASES}
    assert cases - expected == set(), "cases without an .expected file"
    assert expected - cases == set(), ".expected files without a case"
    for stem in sorted(expected):
        body = (GOLDEN / f"{stem}.expected").read_text()
        assert "\nhint: " in body, f"{stem}.expected has no hint"
        assert body.endswith("\n") and not body.endswith("\n\n"), f"{stem}.expected: one trailing newline"


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 30


# --- the CLI: exit status 2, no traceback, the message first -----------------------------------

CLI_CASES = ["syntax_unexpected_token", "syntax_unexpected_eof", "unknown_function", "dtype_mismatch_bf16_f32",
             "carry_changes_type", "store_wrong_shape", "output_never_written", "check_unknown_key",
             "targets_unknown"]


def run_opt(arg: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "KFC_DEBUG"}
    return subprocess.run([sys.executable, "-m", "kfc.cli", "opt", arg], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=env)


@pytest.mark.parametrize("name", CLI_CASES)
def test_cli_golden(name: str) -> None:
    path = GOLDEN / f"{name}.kfc"
    r = run_opt(rel(path))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""
    assert r.stderr.startswith(f"{rel(path)}:")
    assert LOCATED.match(r.stderr)
    assert r.stderr == path.with_suffix(".expected").read_text()


def test_cli_nonexistent_file() -> None:
    r = run_opt("tests/golden/diagnostics/no_such_file.kfc")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("kfc: error: no such file: tests/golden/diagnostics/no_such_file.kfc")
    assert "hint: " in r.stderr


def test_cli_directory() -> None:
    r = run_opt("tests/golden/diagnostics")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("kfc: error: tests/golden/diagnostics is a directory")
    assert "hint: " in r.stderr


def test_a_byte_order_mark_is_dropped_and_columns_count_from_after_it(tmp_path: Path) -> None:
    """A .kfc file saved with a UTF-8 BOM (some Windows editors write one) reads as the same text."""
    src = (GOLDEN / "negative_index.kfc").read_bytes()
    ok = tmp_path / "ok.kfc"
    ok.write_bytes(b"\xef\xbb\xbf" + (REPO / "kernels" / "softmax.kfc").read_bytes())
    assert run_opt(str(ok)).returncode == 0
    bad = tmp_path / "bad.kfc"
    bad.write_bytes(b"\xef\xbb\xbf" + src)
    r = run_opt(str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr == (GOLDEN / "negative_index.expected").read_text().replace(rel(GOLDEN / "negative_index.kfc"),
                                                                             str(bad))
    torn = tmp_path / "torn.kfc"
    torn.write_bytes(b"\xef\xbb\xbfop f(\xff")
    assert run_opt(str(torn)).stderr.startswith(f"{torn}:1:6: error: the file is not UTF-8 text")


def test_cli_ir_text_with_undefined_value(tmp_path: Path) -> None:
    ok = run_opt("kernels/softmax.kfc")
    assert ok.returncode == 0, ok.stderr
    assert "%e = tile.exp %5 " in ok.stdout
    bad = tmp_path / "softmax.kir"
    bad.write_text(ok.stdout.replace("%e = tile.exp %5 ", "%e = tile.exp %nope "))
    r = run_opt(str(bad))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"{bad}:")
    assert "undefined value %nope" in lines[0]
    line, col = map(int, lines[0][len(str(bad)) + 1:].split(":")[:2])
    assert bad.read_text().splitlines()[line - 1][col - 1:].startswith("%nope")
    assert lines[-1].startswith("hint: ")


SIZED = """op chunks<C: 4 | 2>(x: f32[N, C]) -> (y: f32[N]) {
  parallel n in 0..N {
    y[n] = sum(x[n, 0:C], axis=0)
  }
}
"""


def test_a_size_type_parameter_is_a_constant_where_it_is_used():
    """`<C: 4 | 2>`: a dim of C is that size, a slice of C elements has a constant size."""
    from kfc.frontend import parse_kfc
    spec = parse_kfc(SIZED, "sized.kfc")
    x = next(a for a in spec.func.args if a.name == "x")
    assert x.ttype.shape[1] == 4 and spec.dtypes == {"C": "4"}
    assert parse_kfc(SIZED, "sized.kfc", {"C": "2"}).func.args[0].ttype.shape[1] == 2


@pytest.mark.parametrize("header,bound,message", [
    ("<C: 4 | bf16>", None, "type parameter C takes sizes; 'bf16' is not one"),
    ("<C: 4 | 4>", None, "sizes are positive and each listed once, not 4"),
    ("<C: 4 | 2>", {"C": "8"}, "type parameter C takes 4 | 2, not 8"),
])
def test_a_size_type_parameter_is_refused_clearly(header, bound, message):
    from kfc.frontend import parse_kfc
    with pytest.raises(KfcError, match=re.escape(message)):
        parse_kfc(SIZED.replace("<C: 4 | 2>", header), "sized.kfc", bound)


def test_a_text_parsed_again_reuses_its_tree_and_an_error_stays_an_error():
    from kfc.frontend.spec import parse_kfc, syntax_tree
    from kfc.ir.printer import print_ir

    text = Path("kernels/rmsnorm.kfc").read_text()
    first = parse_kfc(text, "rmsnorm.kfc", {"T": "bf16"})
    hits = syntax_tree.cache_info().hits
    again = parse_kfc(text, "rmsnorm.kfc", {"T": "f16"})  # another binding of the same text
    assert syntax_tree.cache_info().hits == hits + 1
    assert "bf16" in print_ir(first.func) and "f16" in print_ir(again.func) and "bf16" not in print_ir(again.func)
    deep = "op f(x: f32[N]) -> (y: f32[N]) {\n  y[:] = " + "(" * 300 + "x[:]" + ")" * 300 + "\n}\n"
    for _ in range(2):  # refused each time, never served from the cache
        with pytest.raises(KfcError, match="nests more than"):
            parse_kfc(deep, "deep.kfc")


def test_an_unsigned_constant_takes_the_unsigned_range(tmp_path):
    """u8 constants are 0 to 255 (the signed range was applied to every integer dtype: x + 200
    on u8 was refused and x + -1 accepted)."""
    for value, fits in ((200, True), (255, True), (256, False), (-1, False)):
        path = tmp_path / f"u8_{value}.kfc".replace("-", "m")
        path.write_text(f"op f(x: u8[N]) -> (y: u8[N]) {{\n  y = x + {value}\n}}\n")
        if fits:
            load_kfc(str(path))
        else:
            with pytest.raises(KfcError, match=f"{value} does not fit in u8 \\(range 0 to 255\\)"):
                load_kfc(str(path))

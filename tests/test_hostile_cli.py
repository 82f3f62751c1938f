"""Hostile inputs at the command line, each one clear error (exit 2, one message, no traceback)
or a correct run: a shape past what kernels index, a cache folder that is a file, GPUs that are
not there, an output sized only by an optional input, a slice no tile holds, a summed value of
the wrong shape (its dims shown as written)."""

import pytest

from kfc.cli import main
from kfc.diagnostics import KfcError
from kfc.frontend.spec import parse_kfc

HUGE = "M=4611686018427387904,N=4611686018427387904"


def one_error(capsys, argv, *words) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, (rc, err)
    assert "Traceback" not in err and err.count("error:") == 1, err
    for w in words:
        assert w in err, (w, err)
    return err


def test_a_check_shape_given_on_the_command_line_is_held_to_the_check_blocks_limits(capsys):
    err = one_error(capsys, ["check", "kernels/rmsnorm.kfc", "--shape", HUGE], "2**63 - 1", "--shape")
    assert err.startswith("kernels/rmsnorm.kfc:")


def test_a_cache_folder_that_is_a_file_is_one_error(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    for where in (blocker, blocker / "below"):
        monkeypatch.setenv("KFC_CACHE_DIR", str(where))
        one_error(capsys, ["warm", "kernels/rmsnorm.kfc", "--target", "sm_90a", "--shape", "N=256"],
                  "is a file, not a folder")


def test_gpus_that_are_not_there_are_refused_before_anything_is_recorded(tmp_path, capsys):
    kb = tmp_path / "kb.sqlite"
    one_error(capsys, ["tune", "kernels/rmsnorm.kfc", "--shape", "M=64,N=256", "--gpus", "99", "--kb", str(kb)],
              "--gpus names GPU 99")
    assert not kb.exists()


def test_an_output_sized_only_by_an_optional_input_is_refused_where_it_is_declared():
    with pytest.raises(KfcError) as e:
        parse_kfc("op f(x: f32[M, N], b: f32[K]?) -> (y: f32[M, K]) {\n"
                  "  parallel m in 0..M { y[m, :] = b + sum(x[m, :]) }\n}", "t.kfc")
    assert str(e.value.span).startswith("t.kfc:1:") and "only the optional input b" in e.value.message


def test_a_slice_no_tile_holds_is_refused_before_the_interpreter_allocates_it():
    with pytest.raises(KfcError) as e:
        parse_kfc("op f(x: f32[M, N]) -> (y: f32[M]) {\n  parallel m in 0..M {\n"
                  "    y[m] = sum(x[m, 0:9223372036854775807])\n  }\n}", "t.kfc")
    assert str(e.value.span).startswith("t.kfc:3:") and "more than a tile holds" in e.value.message


def test_dims_in_messages_are_written_as_in_kfc():
    with pytest.raises(KfcError) as e:
        parse_kfc("op f(x: f32[M, N]) -> (dw: f32[N]) {\n  parallel m in 0..M {\n"
                  "    dw[:] += f32(x[m, 0:2])\n  }\n}", "t.kfc")
    assert "SymDim" not in e.value.message and "[N]" in e.value.message


def nested(kind: str, n: int) -> str:
    e = "x[m, :]"
    for _ in range(n):
        e = {"call": f"abs({e})", "paren": f"({e})"}[kind]
    return f"op deep(x: f32[M, N]) -> (y: f32[M, N]) {{\n  parallel m in 0..M {{\n    y[m, :] = {e}\n  }}\n}}\n"


@pytest.mark.parametrize("kind", ["call", "paren"])
def test_a_call_and_a_parenthesis_each_count_one_level(kind):
    parse_kfc(nested(kind, 190), "t.kfc")  # the op, its loop, its body and the index take the rest
    with pytest.raises(KfcError) as e:
        parse_kfc(nested(kind, 200), "t.kfc")
    assert "nests more than 200 levels" in e.value.message and str(e.value.span).startswith("t.kfc:3:")


def test_a_check_pipeline_that_does_not_parse_is_an_error_not_a_note(capsys):
    one_error(capsys, ["check", "kernels/rmsnorm.kfc", "-p", "canonicalize,bogus"], "unknown pass 'bogus'")

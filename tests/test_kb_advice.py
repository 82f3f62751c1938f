"""The knowledge base at compile time (kfc.kb.advice): `kfc compile` of an op the knowledge base
has never seen starts from the record of the most alike op, at the nearest shape, among those
that beat their op's default by 5% as a user calls them (eagerly); it says which record it used,
falls back to the default where the record does not apply, reads the default knowledge base
where it exists, and with --no-kb consults nothing."""

import json

import pytest

from kfc.cli import main
from kfc.frontend import load_kfc
from kfc.kb.advice import advise, shape_distance
from kfc.kb.fingerprint import op_features, op_fingerprint
from kfc.kb.store import KnowledgeBase
from kfc.model.records import Outcome, Proposal, Stage

SM = "sm_90a"
TUNED = "canonicalize,cse,dce,stage-rows,tile{threads=128},lower-reductions,fuse-reductions,lower-ptx,canonicalize,cse,dce"
WIDER = "canonicalize,cse,dce,stage-rows,tile{threads=512},lower-reductions,fuse-reductions,lower-ptx,canonicalize,cse,dce"
SLOWER = "canonicalize,cse,dce,tile{threads=64},lower-reductions,lower-ptx"
# a record that cannot apply to a row op: it asks for a tensor-core pass
FOREIGN = "canonicalize,accelerate-matmul,lower-ptx"

# an op kfc has no record of, alike to rmsnorm (a row sum of squares, a scale)
NEW_OP = """op scaled_rms(x: bf16[M, N], w: f32[N]) -> (y: bf16[M, N]) {
  parallel m in 0..M {
    xr = f32(x[m, :])
    y[m, :] = bf16(xr * rsqrt(mean(xr * xr) + 1e-5) * w * 0.5)
  }
}
check {
  reference = "(x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * w * 0.5).to(x.dtype)"
  shapes = [{M: 64, N: 4096}]
}
"""


def record(kb, name, path, rows):
    """Timed candidates of the op in `path`: (shape, pipeline, median us, speedup over its default
    back to back, speedup eagerly; None where the tune timed only back to back)."""
    func = load_kfc(path, {"T": "bf16"}).func
    op = kb.op_id(op_fingerprint(func), name, op_features(func))
    run = kb.start_run(op, SM, rows[0][0], "offline", len(rows), {})
    ids = []
    for shape, pipeline, us, speedup, eager in rows:
        cid = kb.add_candidate(run, op, SM, shape, Proposal(pipeline, "", "test", None))
        kb.record_outcome(cid, Outcome(Stage.TIMED, median_us=us, speedup=speedup,
                                       eager_us=None if eager is None else us * 1.1, eager_speedup=eager))
        ids.append(cid)
    kb.finish_run(run, "finished")
    return ids


@pytest.fixture
def kb_path(tmp_path):
    path = tmp_path / "kb.sqlite"
    with KnowledgeBase(path) as kb:
        ids = record(kb, "rmsnorm", "kernels/rmsnorm.kfc", [
            ({"M": 32768, "N": 4096}, TUNED, 50.0, 1.2, 1.15),
            ({"M": 32768, "N": 65536}, WIDER, 900.0, 1.1, 1.1),
            ({"M": 32768, "N": 4096}, SLOWER, 80.0, 0.7, 0.7),  # slower than its default: never advised
            ({"M": 64, "N": 4096}, SLOWER, 1.0, 1.03, 1.03),  # at the very shape, but within the timing's noise
            # faster back to back only: what a user calling it would not see
            ({"M": 64, "N": 4096}, SLOWER, 1.0, 1.3, 0.95),
            ({"M": 64, "N": 4096}, SLOWER, 1.0, 1.3, None),  # timed back to back only (an older tune)
        ])
        record(kb, "softmax", "kernels/softmax.kfc", [({"M": 32768, "N": 4096}, FOREIGN, 10.0, 9.0, 9.0)])
    return path, ids


def test_shapes_are_near_by_the_ratio_of_each_dim():
    assert shape_distance({"N": 4096}, {"N": 4096}) == 0
    assert shape_distance({"M": 64, "N": 4096}, {"M": 32768, "N": 8192}) == 9 + 1
    assert shape_distance({"N": 4096}, {"N": 4096, "K": 8}) == 1


def test_a_new_op_starts_from_the_most_alike_ops_record_at_the_nearest_shape(kb_path, tmp_path):
    kb_path, _ = kb_path
    func = load_kfc(_write(tmp_path, NEW_OP)).func
    near_4k = advise(kb_path, func, SM, {"M": 64, "N": 4096})
    assert near_4k.pipeline == TUNED and near_4k.op_name == "rmsnorm" and near_4k.similarity < 1.0
    assert "rmsnorm's" in near_4k.describe() and "1.15x its default eagerly" in near_4k.describe()
    assert advise(kb_path, func, SM, {"M": 64, "N": 50000}).pipeline == WIDER
    assert advise(kb_path, func, "sm_100a", {"M": 64, "N": 4096}) is None  # nothing recorded for that target
    assert advise(tmp_path / "none.sqlite", func, SM, {"M": 64, "N": 4096}) is None


def test_kfc_compile_says_which_record_it_used_and_without_kb_consults_nothing(kb_path, tmp_path, capsys):
    kb_path, ids = kb_path
    src = _write(tmp_path, NEW_OP)
    assert main(["compile", src, "--kb", str(kb_path), "-o", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert f"from the knowledge base: candidate {ids[0]}, rmsnorm's" in out
    assert json.loads((tmp_path / "a" / "report.json").read_text())["pipeline"] == TUNED
    assert main(["compile", src, "-o", str(tmp_path / "b")]) == 0  # the default knowledge base: none there
    out = capsys.readouterr().out
    assert "knowledge base" not in out
    assert json.loads((tmp_path / "b" / "report.json").read_text())["pipeline"] != TUNED


def test_the_default_knowledge_base_is_read_where_it_exists_and_no_kb_turns_it_off(kb_path, tmp_path, capsys,
                                                                                  monkeypatch):
    kb_path, ids = kb_path
    monkeypatch.setenv("KFC_KB", str(kb_path))
    src = _write(tmp_path, NEW_OP)
    assert main(["compile", src, "-o", str(tmp_path / "a")]) == 0
    assert f"from the knowledge base: candidate {ids[0]}, rmsnorm's" in capsys.readouterr().out
    assert json.loads((tmp_path / "a" / "report.json").read_text())["pipeline"] == TUNED
    assert main(["compile", src, "--no-kb", "-o", str(tmp_path / "b")]) == 0
    assert "knowledge base" not in capsys.readouterr().out
    assert json.loads((tmp_path / "b" / "report.json").read_text())["pipeline"] != TUNED
    assert main(["compile", src, "--no-kb", "--from-kb"]) == 2
    assert "either --from-kb or --no-kb" in capsys.readouterr().err
    assert main(["compile", src, "--no-kb", "--kb", str(kb_path)]) == 2
    assert "either --kb or --no-kb" in capsys.readouterr().err


def test_kfc_package_builds_from_the_record_kfc_compile_would_use_and_says_so(kb_path, tmp_path, capsys,
                                                                               monkeypatch):
    """kfc package ships the kernels kfc.load would compile: the default knowledge base's advice
    where it gives one (named in the progress and in report.json), none with --no-kb or -p."""
    kb_path, ids = kb_path
    monkeypatch.setenv("KFC_KB", str(kb_path))
    src = _write(tmp_path, NEW_OP)
    assert main(["package", src, "--shape", "N=4096", "-o", str(tmp_path / "a")]) == 0
    assert f"from the knowledge base: candidate {ids[0]}, rmsnorm's" in capsys.readouterr().err
    (kernel,) = json.loads((tmp_path / "a" / "report.json").read_text())["kernels"]
    assert kernel["pipeline"] == TUNED and f"candidate {ids[0]}" in kernel["advised"]
    assert main(["package", src, "--shape", "N=4096", "--no-kb", "-o", str(tmp_path / "b")]) == 0
    assert "knowledge base:" not in capsys.readouterr().err
    (kernel,) = json.loads((tmp_path / "b" / "report.json").read_text())["kernels"]
    assert kernel["pipeline"] != TUNED and kernel["advised"] is None
    assert main(["package", src, "--no-kb", "--kb", str(kb_path), "-o", str(tmp_path / "c")]) == 2
    assert "either --kb or --no-kb" in capsys.readouterr().err


def test_an_unreadable_default_knowledge_base_is_said_once_and_the_default_compiles(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "kb.sqlite"
    bad.write_text("not a knowledge base" * 100)
    monkeypatch.setenv("KFC_KB", str(bad))
    src = _write(tmp_path, NEW_OP)
    assert main(["compile", src, "-o", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert f"not using the default knowledge base {bad}" in err and "--no-kb" in err
    assert main(["compile", src, "--kb", str(bad), "-o", str(tmp_path / "b")]) == 2  # named: an error


def test_a_record_that_does_not_apply_falls_back_to_the_default(tmp_path, capsys):
    path = tmp_path / "kb.sqlite"
    with KnowledgeBase(path) as kb:
        record(kb, "softmax", "kernels/softmax.kfc", [({"M": 32768, "N": 4096}, FOREIGN, 10.0, 9.0, 9.0)])
    assert main(["compile", "kernels/softmax.kfc", "--dtype", "T=bf16", "--kb", str(path),
                 "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "does not apply here" in out and "the default pipeline instead" in out


def _write(tmp_path, text):
    path = tmp_path / "op.kfc"
    path.write_text(text)
    return str(path)

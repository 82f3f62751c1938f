"""What a stored result says about the code that produced it (kfc.provenance, bench.provenance):
the commit, and a digest of the sources as they ran, which tells two trees apart where the
commit cannot (a copy sent to the GPU machine, a dirty tree)."""

import json

import kfc.provenance as provenance


def _tree(root, kernel="op k() {}\n"):
    (root / "kfc" / "codegen").mkdir(parents=True)
    (root / "kernels").mkdir()
    (root / "kfc" / "__init__.py").write_text("")
    (root / "kfc" / "codegen" / "emit.py").write_text("X = 1\n")
    (root / "kernels" / "k.kfc").write_text(kernel)


def test_the_digest_names_the_sources_and_nothing_else(tmp_path, monkeypatch):
    _tree(tmp_path / "a")
    _tree(tmp_path / "b")
    monkeypatch.setattr(provenance, "_ROOT", tmp_path / "a")
    first = provenance.source_digest()
    (tmp_path / "a" / "notes.txt").write_text("not code")           # neither a file outside the sources
    (tmp_path / "a" / "kfc" / "codegen" / "emit.pyc").write_bytes(b"\0")  # nor a build product
    assert provenance.source_digest() == first and len(first) == 16
    monkeypatch.setattr(provenance, "_ROOT", tmp_path / "b")
    assert provenance.source_digest() == first                      # the same code elsewhere: the same digest
    (tmp_path / "b" / "kernels" / "k.kfc").write_text("op k() { }\n")
    assert provenance.source_digest() != first                      # one byte of a kernel changed
    (tmp_path / "b" / "kernels" / "k.kfc").write_text("op k() {}\n")
    (tmp_path / "b" / "kfc" / "codegen" / "emit.py").rename(tmp_path / "b" / "kfc" / "codegen" / "emit2.py")
    assert provenance.source_digest() != first                      # a file renamed


def test_a_stored_result_records_the_digest(tmp_path, monkeypatch):
    import bench.provenance

    monkeypatch.setattr(bench.provenance, "RESULTS", tmp_path / "results")
    path = bench.provenance.save("probe", {"cases": []})
    doc = json.loads(path.read_text())
    assert doc["kfc_sources"] == provenance.source_digest() and doc["kfc_commit"]

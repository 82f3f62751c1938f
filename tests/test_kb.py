"""The knowledge base: round trips, resume, best, prior, lessons, export; crash safety under
SIGKILL; concurrent connections; op fingerprints and similarity; the pass-sequence graph; and
the `kfc kb` commands."""

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kfc.diagnostics import KfcError
from kfc.model.records import Outcome, Proposal, Stage, Trial
from kfc.frontend import load_kfc
from kfc.ir import parse_ir, print_ir
from kfc.kb.cli import add_commands, convergence
from kfc.kb.fingerprint import op_features, op_fingerprint
from kfc.kb.graph import END, START, best_steps, pipeline_graph, step_payoff
from kfc.kb.op_similarity import similarity
from kfc.kb.store import SCHEMA_VERSION, KnowledgeBase, canonical_shape, default_path

pytestmark = pytest.mark.xdist_group("kb")  # on one pytest-xdist worker: it starts one PostgreSQL server

SM = "sm_90a"
SHAPE = {"N": 4096}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def timed(us, speedup=None, **kw):
    return Outcome(Stage.TIMED, median_us=us, speedup=speedup, **kw)


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory):
    import pg_server as pg

    return pg.start(tmp_path_factory.mktemp("postgres"))


@pytest.fixture(params=["sqlite", "postgresql"])
def kb_location(request, tmp_path):
    """An SQLite file's path or an empty PostgreSQL database's URL: every test of the store's
    behaviour runs on both."""
    if request.param == "sqlite":
        return tmp_path / "kb.sqlite"
    import pg_server as pg

    return pg.fresh_database(request.getfixturevalue("pg_server"))


@pytest.fixture
def kb(kb_location):
    with KnowledgeBase(kb_location) as k:
        yield k


def features_of(name):
    return op_features(load_kfc(f"kernels/{name}.kfc").func)


def fp_of(name):
    return op_fingerprint(load_kfc(f"kernels/{name}.kfc").func)


def add(kb, run, op, pipeline, outcome=None, shape=SHAPE, target=SM, proposer="test", parent=None, config=None):
    cid = kb.add_candidate(run, op, target, shape, Proposal(pipeline, f"why {pipeline}", proposer, parent), config)
    if outcome is not None:
        kb.record_outcome(cid, outcome)
    return cid


# --- the store -----------------------------------------------------------------------------------


def test_opens_in_wal_with_schema_version(kb):
    if not kb.is_postgres:  # a file: write-ahead log and foreign keys on
        assert kb.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert kb.conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert kb.conn.execute("SELECT version FROM kfc_schema").fetchone()[0] == SCHEMA_VERSION
    assert kb.integrity_check() == "ok"


def test_a_version_1_knowledge_base_is_migrated_and_keeps_its_records(kb_location):
    with KnowledgeBase(kb_location) as kb:
        op = kb.op_id("0123456789abcdef", "rmsnorm", {})
        run = kb.start_run(op, "sm_90a", {"M": 8, "N": 64}, "offline", 1, {})
        cid = kb.add_candidate(run, op, "sm_90a", {"M": 8, "N": 64}, Proposal("canonicalize", "", "test", None))
        kb.record_outcome(cid, Outcome(Stage.TIMED, median_us=5.0, speedup=1.1))
        with kb._write() as conn:  # as version 1 wrote it: no eager figures
            conn.execute("ALTER TABLE outcomes DROP COLUMN eager_us")
            conn.execute("ALTER TABLE outcomes DROP COLUMN eager_speedup")
            conn.execute("DELETE FROM kfc_schema")
            conn.execute("INSERT INTO kfc_schema(version, created_utc) VALUES (1, 'then')")
    with KnowledgeBase(kb_location, create=False) as kb:  # a reader leaves it as it is, an older kfc's still
        assert kb.version == 1 and kb.trials(run_id=run)[0].outcome.eager_us is None
        assert kb.candidates(run_id=run)[0]["eager_speedup"] is None
    with KnowledgeBase(kb_location) as kb:
        assert [r[0] for r in kb.conn.execute("SELECT version FROM kfc_schema ORDER BY version")] == [1, 2]
        (t,) = kb.trials(run_id=run)
        assert (t.outcome.median_us, t.outcome.speedup, t.outcome.eager_us) == (5.0, 1.1, None)
        cid = kb.add_candidate(run, op, "sm_90a", {"M": 8, "N": 64}, Proposal("cse", "", "test", None))
        kb.record_outcome(cid, Outcome(Stage.TIMED, median_us=4.0, eager_us=6.0, eager_speedup=1.2))
        assert kb.trials(run_id=run)[-1].outcome.eager_speedup == 1.2


def test_default_path_follows_kfc_kb(monkeypatch, tmp_path):
    monkeypatch.setenv("KFC_KB", str(tmp_path / "x" / "kb.sqlite"))
    assert default_path() == tmp_path / "x" / "kb.sqlite"
    with KnowledgeBase() as k:
        assert k.path == tmp_path / "x" / "kb.sqlite"
    assert (tmp_path / "x" / "kb.sqlite").exists()
    monkeypatch.delenv("KFC_KB")
    assert str(default_path()).endswith(os.path.join(".cache", "kfc", "kb.sqlite"))


def test_op_id_gets_or_creates(kb):
    a = kb.op_id("0123456789abcdef", "rmsnorm", {"ops": {"tile.add": 1}})
    b = kb.op_id("fedcba9876543210", "gemm", {})
    assert a != b
    assert kb.op_id("0123456789abcdef", "renamed", {}) == a  # existing: the first record stands
    assert kb.op(a) == {**kb.op(a), "name": "rmsnorm", "features": {"ops": {"tile.add": 1}}}
    assert kb.op_by_fingerprint("fedcba9876543210")["id"] == b
    assert [o["name"] for o in kb.ops()] == ["rmsnorm", "gemm"] and kb.ops("gemm")[0]["id"] == b


def test_runs_round_trip(kb):
    op = kb.op_id("0123456789abcdef", "rmsnorm", {})
    env = {"gpu": "NVIDIA H200", "driver": "570.1", "toolchain": "cuda 12.8", "kfc_commit": "abc123", "host": "h1"}
    run = kb.start_run(op, SM, {"N": 4096, "M": 8}, "offline", 32, env)
    (r,) = kb.runs()
    assert (r["id"], r["op_id"], r["target"], r["policy"], r["budget"], r["status"]) == (run, op, SM, "offline", 32,
                                                                                          "running")
    assert r["shape"] == {"M": 8, "N": 4096} and r["finished_utc"] is None
    assert (r["gpu"], r["driver"], r["toolchain"], r["kfc_commit"]) == ("NVIDIA H200", "570.1", "cuda 12.8", "abc123")
    assert r["env"] == env and r["op_name"] == "rmsnorm"
    add(kb, run, op, "canonicalize", timed(5.0, 1.0), shape={"M": 8, "N": 4096})
    add(kb, run, op, "cse", Outcome(Stage.PARSED, error="boom"), shape={"M": 8, "N": 4096})
    add(kb, run, op, "dce", None, shape={"M": 8, "N": 4096})
    kb.finish_run(run, "finished", "3 candidates")
    (r,) = kb.runs(op)
    assert r["status"] == "finished" and r["notes"] == "3 candidates" and r["finished_utc"]
    assert (r["candidates"], r["evaluated"], r["timed"], r["best_us"]) == (3, 2, 1, 5.0)
    assert kb.runs(op + 1) == []
    with pytest.raises(KfcError, match="bad run status"):
        kb.finish_run(run, "done")
    with pytest.raises(KfcError, match="no run 99"):
        kb.finish_run(99, "failed")
    with pytest.raises(KfcError, match="no op 42"):
        kb.start_run(42, SM, SHAPE, "offline", 1, {})


def test_candidates_and_outcomes_round_trip(kb):
    op = kb.op_id("0123456789abcdef", "rmsnorm", {})
    run = kb.start_run(op, SM, SHAPE, "offline", 8, {})
    full = Outcome(Stage.TIMED, error="", registers=40, spills=0, smem_bytes=1024, median_us=12.5, spread_us=0.25,
                   bytes_moved=1 << 20, flops=12345, roofline_fraction=0.8, speedup=1.25, times_us=(12.0, 12.5, 13.0),
                   notes="re-measured")
    first = add(kb, run, op, "canonicalize,cse", full, config={"threads": 128, "fuse": True})
    child = add(kb, run, op, "canonicalize", Outcome(Stage.VERIFIED, error="ptxas: too many registers"),
                parent=first, proposer="mutate")
    (t1, t2) = kb.trials()
    assert t1 == Trial(first, Proposal("canonicalize,cse", "why canonicalize,cse", "test", None), full, op)
    assert t2.candidate_id == child and t2.proposal.parent == first and t2.proposal.proposer == "mutate"
    assert t2.outcome.stage is Stage.VERIFIED and t2.outcome.error == "ptxas: too many registers"
    assert t2.outcome.median_us is None and t2.outcome.times_us == ()
    c = kb.candidates(run_id=run)
    assert c[0]["config"] == {"threads": 128, "fuse": True} and c[1]["config"] is None
    with pytest.raises(KfcError, match="already has an outcome"):
        kb.record_outcome(first, timed(1.0))
    kb.record_outcome(child, timed(9.0), replace=True)
    assert kb.trials()[1].outcome.median_us == 9.0
    with pytest.raises(KfcError, match="no candidate 77"):
        kb.record_outcome(77, timed(1.0))
    with pytest.raises(KfcError, match="no parent candidate 55"):
        add(kb, run, op, "cse", parent=55)


def test_trials_filter_and_order(kb):
    op = kb.op_id("0123456789abcdef", "rmsnorm", {})
    other = kb.op_id("fedcba9876543210", "gemm", {})
    r1 = kb.start_run(op, SM, SHAPE, "offline", 8, {})
    r2 = kb.start_run(op, "sm_100a", {"N": 256}, "offline", 8, {})
    ids = [add(kb, r1, op, "canonicalize", timed(3.0)),
           add(kb, r2, op, "cse", timed(2.0), target="sm_100a", shape={"N": 256}),
           add(kb, r1, op, "dce", Outcome(Stage.COMPILED, error="spills")),
           add(kb, r1, other, "cse", timed(1.0))]
    add(kb, r1, op, "lower-ptx")  # no outcome: not a trial
    assert [t.candidate_id for t in kb.trials()] == ids
    assert [t.candidate_id for t in kb.trials(op_id=op)] == ids[:3]
    assert [t.candidate_id for t in kb.trials(run_id=r1)] == [ids[0], ids[2], ids[3]]
    assert [t.candidate_id for t in kb.trials(target="sm_100a")] == [ids[1]]
    assert [t.candidate_id for t in kb.trials(op_id=op, target=SM, shape={"N": 4096})] == [ids[0], ids[2]]
    assert kb.trials(shape={"N": 5}) == []
    assert canonical_shape({"N": 1, "M": 2}) == canonical_shape({"M": 2, "N": 1}) == '{"M":2,"N":1}'
    with pytest.raises(KfcError, match="bad shape entry"):
        canonical_shape({"N": "big"})


def test_tried_resumes_after_reopening(tmp_path):
    path = tmp_path / "kb.sqlite"
    with KnowledgeBase(path) as k:
        op = k.op_id("0123456789abcdef", "rmsnorm", {})
        run = k.start_run(op, SM, SHAPE, "offline", 8, {})
        add(k, run, op, "canonicalize,cse", timed(3.0))
        add(k, run, op, "cse , dce", Outcome(Stage.PARSED, error="x"))  # non-canonical text, evaluated
        add(k, run, op, "lower-ptx")  # pending: the process died evaluating it
        add(k, run, op, "dce", timed(1.0), shape={"N": 8})  # another shape
    with KnowledgeBase(path, create=False) as k:
        op = k.op_by_fingerprint("0123456789abcdef")["id"]
        tried = k.tried(op, SM, {"N": 4096})
        assert tried == {"canonicalize,cse", "cse , dce", "cse,dce"}
        assert k.tried(op, SM, SHAPE, include_pending=True) == tried | {"lower-ptx"}
        assert k.tried(op, "sm_100a", SHAPE) == set()


def test_best_picks_the_fastest_timed(kb):
    op = kb.op_id("0123456789abcdef", "rmsnorm", {})
    run = kb.start_run(op, SM, SHAPE, "offline", 8, {})
    assert kb.best(op, SM, SHAPE) is None
    add(kb, run, op, "canonicalize", timed(5.0, 1.0))
    fast = add(kb, run, op, "cse", timed(2.0, 2.5))
    add(kb, run, op, "dce", timed(2.0, 2.5))  # a tie: the earlier one wins
    add(kb, run, op, "lower-ptx", Outcome(Stage.CORRECT, median_us=0.5))  # faster, but not TIMED
    add(kb, run, op, "canonicalize,dce", Outcome(Stage.VERIFIED, error="failed"))
    add(kb, run, op, "cse,cse", timed(1.0), shape={"N": 8})  # other shape
    add(kb, run, op, "cse,dce", timed(1.0), target="sm_100a")  # other target
    best = kb.best(op, SM, SHAPE)
    assert best.candidate_id == fast and best.outcome.median_us == 2.0
    assert kb.best_by_fingerprint("0123456789abcdef", SM, SHAPE) == best
    assert kb.best_by_fingerprint("ffffffffffffffff", SM, SHAPE) is None


def test_similar_ops_and_prior(kb):
    names = ("rmsnorm", "layernorm", "gemm", "softmax")
    ops = {n: kb.op_id(fp_of(n), n, features_of(n)) for n in names}
    runs = {n: kb.start_run(ops[n], SM, SHAPE, "offline", 8, {}) for n in names}
    own = add(kb, runs["layernorm"], ops["layernorm"], "canonicalize,cse", timed(9.0))
    own_fast = add(kb, runs["layernorm"], ops["layernorm"], "cse", timed(4.0))
    add(kb, runs["layernorm"], ops["layernorm"], "dce", Outcome(Stage.VERIFIED, error="no"))
    rms = add(kb, runs["rmsnorm"], ops["rmsnorm"], "cse,dce", timed(1.0))
    rms_fast = add(kb, runs["rmsnorm"], ops["rmsnorm"], "cse", timed(0.5))  # own_fast's pipeline: another op's fact
    add(kb, runs["rmsnorm"], ops["rmsnorm"], "cse , dce", timed(3.0))  # rms's pipeline again: listed once
    add(kb, runs["rmsnorm"], ops["rmsnorm"], "lower-ptx", timed(0.1), shape={"N": 8})  # other shape
    sm = add(kb, runs["softmax"], ops["softmax"], "canonicalize", timed(2.0))
    add(kb, runs["gemm"], ops["gemm"], "dce,dce", timed(0.1))  # gemm is not like layernorm

    similar = kb.similar_ops(features_of("layernorm"))
    assert similar[0] == (ops["layernorm"], "layernorm", 1.0)
    assert [s[1] for s in similar] == ["layernorm", "rmsnorm", "softmax"]
    assert all(0.5 <= s[2] <= 1.0 for s in similar)
    others = kb.similar_ops(features_of("layernorm"), exclude_fingerprint=fp_of("layernorm"))
    assert others[0][1] == "rmsnorm" and all(s[1] != "layernorm" for s in others)
    assert len(kb.similar_ops(features_of("layernorm"), k=1)) == 1

    prior = kb.prior(fp_of("layernorm"), features_of("layernorm"), SM, SHAPE)
    assert [t.candidate_id for t in prior] == [own_fast, own, rms_fast, rms, sm]
    assert {t.op_id for t in prior} == {ops["layernorm"], ops["rmsnorm"], ops["softmax"]}
    # k is per op: each op's best k
    assert [t.candidate_id for t in kb.prior(fp_of("layernorm"), features_of("layernorm"), SM, SHAPE, k=1)] == \
        [own_fast, rms_fast, sm]
    # a new op: only similar ops' trials
    new_features = dict(features_of("layernorm"), loads=4)
    assert kb.prior("0000000000000000", new_features, SM, SHAPE)[0].candidate_id == own_fast
    assert kb.prior(fp_of("layernorm"), features_of("layernorm"), "sm_100a", SHAPE) == []


def test_lessons(kb):
    op = kb.op_id("0123456789abcdef", "rmsnorm", {})
    other = kb.op_id("fedcba9876543210", "gemm", {})
    run = kb.start_run(op, SM, SHAPE, "offline", 8, {})
    c1 = add(kb, run, op, "cse", timed(1.0))
    c2 = add(kb, run, op, "dce", timed(2.0))
    l1 = kb.add_lesson(op, "vec=8 beats vec=4 at N=4096", [c1, c2], "critic")
    l2 = kb.add_lesson(None, "cluster>1 needs threads>=32", [], "person")
    l3 = kb.add_lesson(other, "gemm lesson", [c2], "critic")
    mine = kb.lessons(op)
    assert [m["id"] for m in mine] == [l1, l2]
    assert mine[0] == {**mine[0], "op_id": op, "op_name": "rmsnorm", "text": "vec=8 beats vec=4 at N=4096",
                       "evidence": [c1, c2], "author": "critic"}
    assert mine[1]["op_id"] is None and mine[1]["op_name"] is None
    assert [m["id"] for m in kb.lessons()] == [l1, l2, l3]
    with pytest.raises(KfcError, match="no evidence candidate 999"):
        kb.add_lesson(op, "cites nothing real", [999], "critic")
    with pytest.raises(KfcError, match="non-empty"):
        kb.add_lesson(op, "  ", [], "critic")
    assert len(kb.lessons()) == 3  # the failed ones wrote nothing


def test_export_is_json_of_everything(kb):
    op = kb.op_id("0123456789abcdef", "rmsnorm", {"ops": {"tile.add": 1}})
    run = kb.start_run(op, SM, SHAPE, "offline", 8, {"gpu": "H200"})
    c = add(kb, run, op, "cse", timed(1.0, 1.5, times_us=(1.0, 1.1)), config={"vec": 8})
    add(kb, run, op, "dce")
    kb.add_lesson(op, "a lesson", [c], "me")
    data = json.loads(json.dumps(kb.export()))
    assert data["schema_version"] == SCHEMA_VERSION
    assert [len(data[t]) for t in ("ops", "runs", "candidates", "outcomes", "lessons")] == [1, 1, 2, 1, 1]
    assert data["ops"][0]["features"] == {"ops": {"tile.add": 1}}
    assert data["runs"][0]["shape"] == SHAPE and data["runs"][0]["env"] == {"gpu": "H200"}
    assert data["candidates"][0]["config"] == {"vec": 8} and data["candidates"][0]["pipeline"] == "cse"
    assert data["outcomes"][0] == {**data["outcomes"][0], "candidate_id": c, "stage": "timed", "speedup": 1.5,
                                   "times_us": [1.0, 1.1]}
    assert data["lessons"][0]["evidence"] == [c]


def test_bad_files_are_clear_errors(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not a database at all" * 100)
    with pytest.raises(KfcError, match="not a kfc knowledge base"):
        KnowledgeBase(text)
    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as c:
        c.execute("CREATE TABLE t(x)")
    with pytest.raises(KfcError, match="SQLite database but not a kfc knowledge base"):
        KnowledgeBase(other)
    newer = tmp_path / "newer.sqlite"
    KnowledgeBase(newer).close()
    with sqlite3.connect(newer) as c:
        c.execute("UPDATE kfc_schema SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(KfcError, match=f"schema version {SCHEMA_VERSION + 1}"):
        KnowledgeBase(newer)
    with pytest.raises(KfcError, match="no knowledge base at"):
        KnowledgeBase(tmp_path / "missing.sqlite", create=False)
    assert not (tmp_path / "missing.sqlite").exists()
    with pytest.raises(KfcError, match="is a directory"):
        KnowledgeBase(tmp_path)
    with pytest.raises(KfcError, match="cannot create the folder"):
        KnowledgeBase(text / "kb.sqlite")  # under a regular file


# --- crash safety and concurrency -----------------------------------------------------------------

CHILD = r"""
import sys
from kfc.kb.store import KnowledgeBase
from kfc.model.records import Outcome, Proposal, Stage
kb = KnowledgeBase(sys.argv[1])
op = kb.op_id("0123456789abcdef", "rmsnorm", {"ops": {"tile.add": 1}})
run = kb.start_run(op, "sm_90a", {"N": 4096}, "crash-test", 100000, {"gpu": "none"})
i = 0
while True:
    cid = kb.add_candidate(run, op, "sm_90a", {"N": 4096}, Proposal(f"canonicalize{{}}-{i}", "r" * 200, "child"),
                           {"i": i})
    kb.record_outcome(cid, Outcome(Stage.TIMED, median_us=1.0 + i, times_us=tuple(float(j) for j in range(64))))
    print(cid, flush=True)
    i += 1
"""


def test_sigkill_mid_run_loses_nothing_committed(tmp_path):
    from killed_child import run_and_kill

    path = tmp_path / "kb.sqlite"
    printed, _ = run_and_kill(CHILD, [str(path)], after=40)
    # a plain connection first: the file (with its WAL) is a sound database
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with KnowledgeBase(path, create=False) as k:
        assert k.integrity_check() == "ok"
        trials = {t.candidate_id: t for t in k.trials()}
        missing = [cid for cid in printed if cid not in trials]
        assert not missing, f"committed but lost: {missing}"
        for cid in printed:
            assert trials[cid].outcome.stage is Stage.TIMED and len(trials[cid].outcome.times_us) == 64
        (run,) = k.runs()
        assert run["status"] == "running"  # killed: nobody closed it
        assert run["candidates"] >= len(printed)
        # and the file takes new writes
        op = k.op_by_fingerprint("0123456789abcdef")["id"]
        k.finish_run(run["id"], "interrupted")
        add(k, None, op, "cse", timed(1.0))


def test_concurrent_writers_and_reader(kb_location):
    path = kb_location
    with KnowledgeBase(path) as k:
        op = k.op_id("0123456789abcdef", "rmsnorm", {})
    n = 60
    errors = []

    def writer(tag):
        try:
            with KnowledgeBase(path) as w:
                run = w.start_run(op, SM, SHAPE, f"writer-{tag}", n, {})
                for i in range(n):
                    add(w, run, op, f"{tag}-{i}", timed(float(i + 1)))
                w.finish_run(run, "finished")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    seen = []
    with KnowledgeBase(path) as reader:
        while any(t.is_alive() for t in threads):
            trials = reader.trials(op_id=op)
            assert all(t.outcome.stage is Stage.TIMED for t in trials)
            seen.append(len(trials))
        for t in threads:
            t.join()
        assert not errors, errors
        assert seen == sorted(seen)  # a reader never sees a count go back
        trials = reader.trials(op_id=op)
        assert len(trials) == 2 * n
        assert {t.proposal.pipeline for t in trials} == {f"{tag}-{i}" for tag in "ab" for i in range(n)}
        assert [r["status"] for r in reader.runs()] == ["finished", "finished"]
        assert reader.integrity_check() == "ok"


def test_a_postgresql_knowledge_base_is_shared_and_reopened(pg_server):
    import pg_server as pg

    url = pg.fresh_database(pg_server)
    with KnowledgeBase(url) as a, KnowledgeBase(url) as b:
        op = a.op_id("0123456789abcdef", "rmsnorm", {})
        assert b.op_id("0123456789abcdef", "rmsnorm", {}) == op  # one op, whoever asks
        run = a.start_run(op, SM, SHAPE, "search", 2, {"gpu": "H200"})
        cid = add(a, run, op, "cse", timed(2.5))
        assert [t.candidate_id for t in b.trials(op_id=op)] == [cid]
        with pytest.raises(KfcError, match="already has an outcome"):
            b.record_outcome(cid, timed(1.0))
        b.record_outcome(cid, timed(1.0), replace=True)
    with KnowledgeBase(url) as again:
        assert again.best(op, SM, SHAPE).outcome.median_us == 1.0
        assert again.is_postgres and again.integrity_check() == "ok"


def test_postgresql_errors_are_clear(monkeypatch):
    with pytest.raises(KfcError, match="cannot connect to the knowledge base postgresql://kfc:\\*\\*\\*@127.0.0.1:1/"):
        KnowledgeBase("postgresql://kfc:secret@127.0.0.1:1/kfc")
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(KfcError, match="needs psycopg") as info:
        KnowledgeBase("postgresql://kfc@127.0.0.1/kfc")
    assert "pip install 'kfc[cluster]'" in info.value.hint


def test_sqlite_statements_in_postgresql_words():
    from kfc.kb.postgres import translate, translate_schema

    assert translate("SELECT * FROM ops WHERE id = ?") == ("SELECT * FROM ops WHERE id = %s", False)
    text, returns = translate("INSERT OR IGNORE INTO ops(fingerprint, name) VALUES (?, ?)")
    assert text == "INSERT INTO ops(fingerprint, name) VALUES (%s, %s) ON CONFLICT DO NOTHING RETURNING id" and returns
    text, returns = translate("INSERT OR REPLACE INTO outcomes(candidate_id, stage, notes) VALUES (?, ?, ?)")
    assert text.endswith("ON CONFLICT (candidate_id) DO UPDATE SET stage = EXCLUDED.stage, notes = EXCLUDED.notes")
    assert not returns
    assert translate_schema("id INTEGER PRIMARY KEY AUTOINCREMENT, n INTEGER, x REAL") == \
        "id BIGSERIAL PRIMARY KEY, n BIGINT, x DOUBLE PRECISION"


# --- fingerprints --------------------------------------------------------------------------------


def test_fingerprint_ignores_value_names():
    func = load_kfc("kernels/rmsnorm.kfc").func
    text = print_ir(func)
    renamed = re.sub(r"%([A-Za-z0-9_.]+)", lambda m: f"%v_{m.group(1).replace('.', '_')}", text)
    assert renamed != text and "%v_xr" in renamed
    other = parse_ir(renamed, "renamed.kir")
    assert print_ir(other) != text
    assert op_fingerprint(other) == op_fingerprint(func) == op_fingerprint(load_kfc("kernels/rmsnorm.kfc").func)
    assert re.fullmatch(r"[0-9a-f]{16}", op_fingerprint(func))
    # the function's name is not structure either
    assert op_fingerprint(parse_ir(text.replace("@rmsnorm", "@rms_norm_copy"))) == op_fingerprint(func)


def test_fingerprint_sees_structure():
    func = load_kfc("kernels/rmsnorm.kfc").func
    text = print_ir(func)
    fps = {op_fingerprint(func), op_fingerprint(load_kfc("kernels/layernorm.kfc").func),
           op_fingerprint(load_kfc("kernels/rmsnorm.kfc", {"T": "f16"}).func),
           op_fingerprint(parse_ir(text.replace('kind = "mean"', 'kind = "sum"'))),
           op_fingerprint(parse_ir(text.replace("tile.rsqrt", "tile.sqrt")))}
    assert len(fps) == 5


def test_features_and_similarity():
    rms, ln, gemm, kda = (features_of(n) for n in ("rmsnorm", "layernorm", "gemm", "kda_fwd"))
    assert json.loads(json.dumps(rms)) == rms
    assert rms["ops"]["tile.reduce"] == 1 and rms["reductions"] == 1 and ln["reductions"] == 2
    assert rms["loads"] == 2 and rms["stores"] == 1 and not rms["has_dot"] and gemm["has_dot"]
    assert rms["max_rank"] == 1 and gemm["max_rank"] == 2 and kda["loops"] == 1
    assert rms["inputs"] == ["bf16", "f32", "f32"] and rms["outputs"] == ["bf16"]
    assert similarity(rms, rms) == 1.0 and similarity(kda, dict(kda)) == 1.0
    assert similarity(rms, ln) == similarity(ln, rms)
    assert 1.0 > similarity(rms, ln) > similarity(rms, gemm) >= 0.0
    assert similarity(ln, rms) > similarity(ln, gemm)
    assert 0.0 <= similarity({}, rms) <= 1.0 and similarity({}, {}) == 1.0


# --- the graph -----------------------------------------------------------------------------------


def fake_trials():
    t = []
    specs = [("canonicalize,tile{threads=128},lower-ptx", timed(1.0, 1.5)),
             ("canonicalize,tile{threads=256},lower-ptx", timed(1.4, 1.1)),
             ("canonicalize,tile{threads=256},lower-ptx", timed(1.6, 0.9)),
             ("canonicalize,tile{threads=64},lower-ptx", Outcome(Stage.COMPILED, error="spills")),
             ("canonicalize,cse,canonicalize", timed(1.5, 1.0)),
             ("canonicalize,bogus{x=", Outcome(Stage.PROPOSED, error="does not parse"))]
    for i, (p, o) in enumerate(specs, 1):
        t.append(Trial(i, Proposal(p, "", "fake"), o))
    return t


def test_pipeline_graph_statistics():
    g = pipeline_graph(fake_trials())
    assert g.graph == {"trials": 6, "timed": 4}
    assert {START, END, "canonicalize", "cse", "lower-ptx", "tile{threads=128}", "tile{threads=256}",
            "tile{threads=64}", "bogus{x="} == set(g.nodes)
    canon = g.nodes["canonicalize"]
    assert (canon["count"], canon["timed"], canon["errors"]) == (6, 4, 2)  # twice in trial 5, counted once
    assert canon["best_speedup"] == 1.5 and canon["mean_speedup"] == pytest.approx((1.5 + 1.1 + 0.9 + 1.0) / 4)
    assert canon["best_us"] == 1.0 and canon["best_candidate"] == 1
    e = g.edges["canonicalize", "tile{threads=256}"]
    assert (e["count"], e["timed"], e["best_speedup"], e["best_candidate"]) == (2, 2, 1.1, 2)
    assert e["mean_speedup"] == pytest.approx(1.0) and e["timed_rate"] == 1.0
    bad = g.edges["canonicalize", "tile{threads=64}"]
    assert (bad["count"], bad["timed"], bad["best_speedup"], bad["mean_speedup"]) == (1, 0, None, None)
    assert g.edges[START, "canonicalize"]["count"] == 6
    assert g.has_edge("cse", "canonicalize") and g.has_edge("canonicalize", "cse")
    assert g.edges["lower-ptx", END]["count"] == 4
    assert not g.has_edge("tile{threads=128}", "tile{threads=256}")


def test_step_payoff_and_best_steps():
    g = pipeline_graph(fake_trials())
    p = step_payoff(g, "tile{threads=256}")
    assert (p["step"], p["count"], p["timed"], p["best_speedup"]) == ("tile{threads=256}", 2, 2, 1.1)
    assert step_payoff(g, " tile{ threads=256 } ")["count"] == 2  # canonicalised
    assert step_payoff(g, "dce") == {**step_payoff(g, "dce"), "count": 0, "timed": 0, "best_speedup": None}
    after = best_steps(g, "canonicalize", 3)
    assert [s for s, _ in after] == ["tile{threads=128}", "tile{threads=256}", "cse"]
    assert after[0][1]["best_speedup"] == 1.5
    assert [s for s, _ in best_steps(g, ["canonicalize", "tile{threads=64}"], 5)] == ["lower-ptx"]
    assert [s for s, _ in best_steps(g, "canonicalize,tile{threads=128},lower-ptx")] == [END]
    assert best_steps(g, None, 1)[0][0] == "canonicalize" and best_steps(g, "", 1)[0][0] == "canonicalize"
    assert best_steps(g, "dce", 5) == [] and best_steps(g, "canonicalize", 0) == []
    assert [s for s, _ in best_steps(g, "canonicalize", 10)][-1] in ("tile{threads=64}", "bogus{x=")


# --- the command line ----------------------------------------------------------------------------


def run_kb(argv):
    """What `kfc` does with the kb command: parse, run, and print a KfcError as one message (exit 2)."""
    parser = argparse.ArgumentParser(prog="kfc")
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except KfcError as e:
        print(e.render(), file=sys.stderr)
        return 2


@pytest.fixture
def filled(kb_location):
    path = kb_location
    rms_fp = fp_of("rmsnorm")
    with KnowledgeBase(path) as k:
        op = k.op_id(rms_fp, "rmsnorm", features_of("rmsnorm"))
        r1 = k.start_run(op, SM, SHAPE, "offline", 4, {"gpu": "H200"})
        base = add(k, r1, op, "canonicalize,cse,dce,lower-ptx", timed(10.0, 1.0), proposer="baseline")
        add(k, r1, op, "canonicalize,dce", Outcome(Stage.VERIFIED, error="lower-ptx: missing tile\nmore"),
            proposer="random")
        best = add(k, r1, op, "cse,lower-ptx", timed(6.0, 10 / 6), proposer="mutate", parent=base)
        add(k, r1, op, "dce,lower-ptx")  # pending
        k.finish_run(r1, "finished")
        r2 = k.start_run(op, "sm_100a", {"N": 256}, "claude", 4, {})
        add(k, r2, op, "cse,dce,lower-ptx", timed(3.0, 1.2), target="sm_100a", shape={"N": 256}, proposer="planner")
        add(k, r2, op, "cse,lower-ptx", timed(2.5, 1.4), target="sm_100a", shape={"N": 256}, proposer="planner")
        k.add_lesson(op, "dropping canonicalize pays at N=4096", [best], "critic")
        k.add_lesson(None, "general wisdom", [], "person")
    return {"path": str(path), "fp": rms_fp, "best": best, "r1": r1, "r2": r2}


def test_cli_show(filled, capsys):
    assert run_kb(["kb", "show", "--kb", filled["path"]]) == 0
    out = capsys.readouterr().out
    for s in ("baseline", "mutate", "planner", "pending", "verified", "timed", "cse,lower-ptx", "10.00", "6.00",
              "lower-ptx: missing tile"):
        assert s in out, s
    assert "more" not in out  # only an error's first line
    assert run_kb(["kb", "show", "--kb", filled["path"], "--run", str(filled["r2"])]) == 0
    out = capsys.readouterr().out
    assert "planner" in out and "baseline" not in out
    assert run_kb(["kb", "show", "--kb", filled["path"], "--op", "rmsnorm", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "2.50" in out and "baseline" not in out
    assert run_kb(["kb", "show", "--kb", filled["path"], "--run", "99"]) == 2
    assert "no run 99" in capsys.readouterr().err


def test_cli_best(filled, capsys):
    kb = ["--kb", filled["path"]]
    assert run_kb(["kb", "best", "kernels/rmsnorm.kfc", "--target", SM, "--shape", "N=4096", *kb]) == 0
    out = capsys.readouterr().out
    assert "cse,lower-ptx" in out and "6.00" in out and str(filled["best"]) in out
    assert run_kb(["kb", "best", filled["fp"], "--target", SM, "--shape", "N=4096", "--pipeline-only", *kb]) == 0
    assert capsys.readouterr().out == "cse,lower-ptx\n"
    assert run_kb(["kb", "best", "rmsnorm", *kb]) == 0  # by name: one row per target and shape
    out = capsys.readouterr().out
    assert "sm_100a" in out and "2.50" in out and "6.00" in out
    assert run_kb(["kb", "best", "rmsnorm", "--pipeline-only", *kb]) == 2
    assert "choose one with --target and --shape" in capsys.readouterr().err
    assert run_kb(["kb", "best", "kernels/gemm.kfc", *kb]) == 1
    assert "not in the knowledge base" in capsys.readouterr().err
    assert run_kb(["kb", "best", "rmsnorm", "--target", "sm_90", *kb]) == 1
    assert run_kb(["kb", "best", "no_such_thing", *kb]) == 2
    capsys.readouterr()
    # a .kfc file without --dtype stands for every instance of its type parameters
    f16 = load_kfc("kernels/rmsnorm.kfc", {"T": "f16"}).func
    with KnowledgeBase(filled["path"]) as k:
        op = k.op_id(op_fingerprint(f16), "rmsnorm_f16", op_features(f16))
        add(k, None, op, "dce,lower-ptx", timed(7.5))
    assert run_kb(["kb", "best", "kernels/rmsnorm.kfc", "--target", SM, *kb]) == 0
    out = capsys.readouterr().out
    assert "rmsnorm_f16" in out and "7.50" in out and "6.00" in out
    assert run_kb(["kb", "best", "kernels/rmsnorm.kfc", "--dtype", "T=f16", "--pipeline-only", *kb]) == 0
    assert capsys.readouterr().out == "dce,lower-ptx\n"


def test_cli_runs_and_lessons(filled, capsys):
    assert run_kb(["kb", "runs", "--kb", filled["path"]]) == 0
    out = capsys.readouterr().out
    assert "offline" in out and "claude" in out and "finished" in out and "running" in out and "H200" in out
    assert run_kb(["kb", "lessons", "--kb", filled["path"], "--op", "rmsnorm"]) == 0
    out = capsys.readouterr().out
    assert "dropping canonicalize pays" in out and "general wisdom" in out and str(filled["best"]) in out
    assert run_kb(["kb", "lessons", "--kb", filled["path"], "--op", "gemm"]) == 2
    assert "no op 'gemm'" in capsys.readouterr().err


def test_cli_export(filled, tmp_path, capsys):
    out = tmp_path / "out" / "kb.json"
    assert run_kb(["kb", "export", "--kb", filled["path"], "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(data["candidates"]) == 6 and len(data["outcomes"]) == 5 and len(data["lessons"]) == 2
    assert os.listdir(out.parent) == ["kb.json"]  # no temporary left behind
    assert run_kb(["kb", "export", "--kb", filled["path"]]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][1]["policy"] == "claude"


def test_cli_plot(filled, tmp_path, capsys):
    png = tmp_path / "plots" / "c.png"
    assert run_kb(["kb", "plot", "--kb", filled["path"], "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
    assert os.listdir(png.parent) == ["c.png"]
    png.unlink()
    assert run_kb(["kb", "plot", "--kb", filled["path"], "--run", str(filled["r2"]), "--metric", "speedup",
                   "-o", str(png)]) == 0
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert run_kb(["kb", "plot", "--kb", filled["path"], "--run", "42", "-o", str(tmp_path / "x.png")]) == 2
    assert "no run 42" in capsys.readouterr().err and not (tmp_path / "x.png").exists()


def test_convergence_is_best_so_far():
    cands = [{"stage": None}, {"stage": "timed", "median_us": 5.0, "speedup": 1.0},
             {"stage": "verified", "median_us": 1.0, "speedup": 9.0},
             {"stage": "timed", "median_us": 7.0, "speedup": 0.7},
             {"stage": "timed", "median_us": 4.0, "speedup": 1.25}]
    assert convergence(cands, "time") == [None, 5.0, 5.0, 5.0, 4.0]
    assert convergence(cands, "speedup") == [None, 1.0, 1.0, 1.0, 1.25]


def test_cli_errors_are_one_message(tmp_path, capsys):
    junk = tmp_path / "junk.sqlite"
    junk.write_text("not a database, just text\n" * 200)
    for cmd in (["show"], ["lessons"], ["export"], ["best", "rmsnorm"], ["plot", "-o", str(tmp_path / "p.png")]):
        assert run_kb(["kb", *cmd, "--kb", str(junk)]) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1 and "not a kfc knowledge base" in err and "Traceback" not in err
    assert run_kb(["kb", "show", "--kb", str(tmp_path / "nope.sqlite")]) == 2
    assert "no knowledge base at" in capsys.readouterr().err
    assert not (tmp_path / "nope.sqlite").exists()  # reading never creates a file


@pytest.mark.parametrize("sub", ["best", "show", "runs", "lessons", "export", "plot"])
def test_cli_help_has_examples(sub, capsys):
    with pytest.raises(SystemExit) as e:
        run_kb(["kb", sub, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out and "--kb" in out


def test_kb_without_subcommand_prints_help(capsys):
    assert run_kb(["kb"]) == 2
    assert "examples" in capsys.readouterr().out


def test_wired_into_kfc(filled):
    """`kfc kb` works end to end through the real command line."""
    from kfc.cli import build_parser

    assert "kb" in build_parser()._subparsers._group_actions[0].choices
    r = subprocess.run([sys.executable, "-m", "kfc.cli", "kb", "show", "--kb", filled["path"]], capture_output=True,
                       text=True, check=False)
    assert r.returncode == 0 and "cse,lower-ptx" in r.stdout


KB_READERS = [["kb", "show"], ["kb", "runs"], ["kb", "lessons"], ["kb", "best", "kernels/rmsnorm.kfc"],
              ["kb", "export", "-o", "EXPORT"], ["kb", "plot", "-o", "PLOT"]]


def _damaged_reads(path, tmp_path, capsys):
    """Every reading command on a damaged knowledge base: one clear error, exit 2."""
    messages = []
    for argv in KB_READERS:
        argv = [a.replace("EXPORT", str(tmp_path / "x.json")).replace("PLOT", str(tmp_path / "x.png")) for a in argv]
        rc = run_kb([*argv, "--kb", str(path)])
        err = capsys.readouterr().err
        assert rc == 2 and "damaged" in err and "Traceback" not in err, (argv, rc, err)
        messages.append(err)
    return messages


@pytest.mark.parametrize("kb_location", ["sqlite"], indirect=True)  # the damage is done to the SQLite file
def test_garbage_in_json_columns_is_one_clear_error_from_every_reader(filled, tmp_path, capsys):
    with sqlite3.connect(filled["path"]) as c:
        c.execute("UPDATE runs SET shape = '{garbage', env = '[[['")
        c.execute("UPDATE outcomes SET times_us = 'nope'")
        c.execute("UPDATE lessons SET evidence = '{x'")
        c.execute("UPDATE candidates SET config = '{bad'")
        c.execute("UPDATE ops SET features = '[oops'")
    for err in _damaged_reads(filled["path"], tmp_path, capsys):
        assert "is not JSON" in err


@pytest.mark.parametrize("kb_location", ["sqlite"], indirect=True)
def test_a_torn_knowledge_base_is_one_clear_error(filled, tmp_path, capsys):
    path = Path(filled["path"])
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    page = 4096
    data[page:] = b"\xff" * (len(data) - page)  # every page after the first torn: the tables are gone
    path.write_bytes(bytes(data))
    _damaged_reads(path, tmp_path, capsys)

"""The knowledge base: every experiment the factory runs, with its provenance, in one SQLite file
(or, for a team, a PostgreSQL database: give a `postgresql://` URL instead of a path; see
kfc.kb.postgres).

Tables (schema version 1; `kfc_schema` holds the version, `PRAGMA application_id` marks the file):

    ops         id, fingerprint UNIQUE, name, features JSON, created_utc
    runs        id, op_id, target, shape JSON, policy, budget, started_utc, finished_utc,
                status (running | finished | interrupted | failed), gpu, driver, toolchain,
                kfc_commit, env JSON (the whole env dict given), notes
    candidates  id, run_id (nullable), op_id, target, shape JSON, pipeline, config JSON (nullable),
                parent_id (nullable), proposer, rationale, created_utc
    outcomes    candidate_id PK/FK, stage, error, registers, spills, smem_bytes, median_us,
                spread_us, bytes_moved, flops, roofline_fraction, speedup, times_us JSON, notes,
                recorded_utc
    lessons     id, op_id (nullable: a lesson about every op), text, evidence JSON (candidate ids),
                author, created_utc

Durability: the file is opened in WAL mode with `synchronous=NORMAL`, and every write is its own
`BEGIN IMMEDIATE … COMMIT` transaction, so a process killed at any instant (SIGKILL included)
loses nothing it had already recorded; only a power loss may drop the last few commits. Many
readers and one writer at a time may share the file; a writer waits up to 30 s for another.

Shapes are dicts of dim → int stored as canonical JSON (sorted keys, no spaces), so equal
shapes compare equal as text. Ids only grow (AUTOINCREMENT), so "oldest first" is "by id".
"""

from __future__ import annotations

import json
import numbers
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from ..diagnostics import KfcError
from ..model.records import Outcome, Proposal, Stage, Trial
from . import postgres
from .fingerprint import similarity

SCHEMA_VERSION = 1
APPLICATION_ID = 0x6B666362  # "kfcb"
RUN_STATUSES = ("running", "finished", "interrupted", "failed")
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE kfc_schema (
    version     INTEGER NOT NULL,
    created_utc TEXT NOT NULL
);
CREATE TABLE ops (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    fingerprint TEXT NOT NULL UNIQUE,
    name        TEXT NOT NULL,
    features    TEXT NOT NULL DEFAULT '{}',
    created_utc TEXT NOT NULL
);
CREATE TABLE runs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    op_id        INTEGER NOT NULL REFERENCES ops(id),
    target       TEXT NOT NULL,
    shape        TEXT NOT NULL,
    policy       TEXT NOT NULL DEFAULT '',
    budget       INTEGER,
    started_utc  TEXT NOT NULL,
    finished_utc TEXT,
    status       TEXT NOT NULL DEFAULT 'running'
                 CHECK (status IN ('running', 'finished', 'interrupted', 'failed')),
    gpu          TEXT,
    driver       TEXT,
    toolchain    TEXT,
    kfc_commit   TEXT,
    env          TEXT NOT NULL DEFAULT '{}',
    notes        TEXT NOT NULL DEFAULT ''
);
CREATE INDEX runs_op ON runs(op_id);
CREATE TABLE candidates (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id      INTEGER REFERENCES runs(id),
    op_id       INTEGER NOT NULL REFERENCES ops(id),
    target      TEXT NOT NULL,
    shape       TEXT NOT NULL,
    pipeline    TEXT NOT NULL,
    config      TEXT,
    parent_id   INTEGER REFERENCES candidates(id),
    proposer    TEXT NOT NULL DEFAULT '',
    rationale   TEXT NOT NULL DEFAULT '',
    created_utc TEXT NOT NULL
);
CREATE INDEX candidates_where ON candidates(op_id, target, shape);
CREATE INDEX candidates_run ON candidates(run_id);
CREATE TABLE outcomes (
    candidate_id      INTEGER PRIMARY KEY REFERENCES candidates(id),
    stage             TEXT NOT NULL,
    error             TEXT NOT NULL DEFAULT '',
    registers         INTEGER,
    spills            INTEGER,
    smem_bytes        INTEGER,
    median_us         REAL,
    spread_us         REAL,
    bytes_moved       INTEGER,
    flops             INTEGER,
    roofline_fraction REAL,
    speedup           REAL,
    times_us          TEXT NOT NULL DEFAULT '[]',
    notes             TEXT NOT NULL DEFAULT '',
    recorded_utc      TEXT NOT NULL
);
CREATE INDEX outcomes_stage ON outcomes(stage, median_us);
CREATE TABLE lessons (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    op_id       INTEGER REFERENCES ops(id),
    text        TEXT NOT NULL,
    evidence    TEXT NOT NULL DEFAULT '[]',
    author      TEXT NOT NULL DEFAULT '',
    created_utc TEXT NOT NULL
);
CREATE INDEX lessons_op ON lessons(op_id);
"""

_TABLES = ("ops", "runs", "candidates", "outcomes", "lessons")
_JSON_COLUMNS = {"features", "shape", "env", "config", "times_us", "evidence"}
_OUTCOME_FIELDS = ("stage", "error", "registers", "spills", "smem_bytes", "median_us", "spread_us",
                   "bytes_moved", "flops", "roofline_fraction", "speedup", "times_us", "notes")
_ENV_COLUMNS = ("gpu", "driver", "toolchain", "kfc_commit")
_INT_FIELDS = {"registers", "spills", "smem_bytes", "bytes_moved", "flops"}
_FLOAT_FIELDS = {"median_us", "spread_us", "roofline_fraction", "speedup"}
_HINT = "give another path with --kb PATH or the KFC_KB environment variable"


def default_path() -> Path | str:
    """$KFC_KB (a path, or a postgresql:// URL), else ~/.cache/kfc/kb.sqlite."""
    env = os.environ.get("KFC_KB")
    if postgres.is_url(env):
        return env
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kfc" / "kb.sqlite"


def canonical_shape(shape: dict[str, int] | None) -> str:
    """A shape as the text the knowledge base stores: `{"M":32768,"N":4096}`."""
    if shape is None:
        shape = {}
    if not isinstance(shape, dict):
        raise KfcError(f"a shape is a dict of dimension name to size, not {shape!r}", hint='e.g. {"N": 4096}')
    out = {}
    for k, v in shape.items():
        if not isinstance(k, str) or isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise KfcError(f"bad shape entry {k!r}: {v!r}",
                           hint='a shape maps dimension names to ints, e.g. {"N": 4096}')
        out[k] = int(v)
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _dumps(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise KfcError(f"{what} must be JSON-able: {e}") from None


def _decode(row: sqlite3.Row) -> dict[str, Any]:
    out = {}
    for k in row.keys():  # noqa: SIM118 - a Row iterates over values
        v = row[k]
        if k in _JSON_COLUMNS and isinstance(v, str):
            v = json.loads(v)
        out[k] = v
    return out


def _outcome_of(row: sqlite3.Row) -> Outcome:
    try:
        stage = Stage(row["stage"])
    except ValueError:
        raise KfcError(f"candidate {row['candidate_id']} has an unknown stage {row['stage']!r}",
                       hint="the knowledge base was written by another version of kfc") from None
    return Outcome(
        stage=stage, error=row["error"], registers=row["registers"], spills=row["spills"],
        smem_bytes=row["smem_bytes"], median_us=row["median_us"], spread_us=row["spread_us"],
        bytes_moved=row["bytes_moved"], flops=row["flops"], roofline_fraction=row["roofline_fraction"],
        speedup=row["speedup"], times_us=tuple(json.loads(row["times_us"] or "[]")), notes=row["notes"])


def _proposal_of(row: sqlite3.Row) -> Proposal:
    return Proposal(pipeline=row["pipeline"], rationale=row["rationale"], proposer=row["proposer"],
                    parent=row["parent_id"])


def _trial_of(row: sqlite3.Row) -> Trial:
    return Trial(candidate_id=row["id"], proposal=_proposal_of(row), outcome=_outcome_of(row), op_id=row["op_id"])


_TRIAL_SELECT = """
SELECT c.id, c.op_id, c.pipeline, c.rationale, c.proposer, c.parent_id, o.*
FROM candidates c JOIN outcomes o ON o.candidate_id = c.id
"""


class KnowledgeBase:
    """One SQLite file (or PostgreSQL database) of ops, runs, candidates, outcomes and lessons.

    `KnowledgeBase(path)` opens (creating, unless `create=False`) the file; `path` defaults to
    `default_path()`; a `postgresql://` URL opens that database, creating the tables in it if
    it has none. Use as a context manager or call `close()`. One object per thread.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, create: bool = True) -> None:
        if path is None:
            path = default_path()
        self._conn = None
        self._errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
        if postgres.is_url(str(path)):
            self._open_postgres(str(path))
            return
        self.path = Path(path).expanduser()
        if self.path.is_dir():
            raise KfcError(f"{self.path} is a directory, not a knowledge base file", hint=_HINT)
        if not self.path.exists():
            if not create:
                raise KfcError(f"no knowledge base at {self.path}",
                               hint="run `kfc tune` to create one, or " + _HINT)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise KfcError(f"cannot create the folder for the knowledge base {self.path}: "
                               f"{e.strerror or e}", hint=_HINT) from None
        try:
            conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as e:
            raise KfcError(f"cannot open the knowledge base {self.path}: {e}", hint=_HINT) from None
        conn.row_factory = sqlite3.Row
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            self._conn = conn
            self._init_schema()
        except KfcError:
            conn.close()
            self._conn = None
            raise
        except sqlite3.DatabaseError as e:
            conn.close()
            self._conn = None
            msg = str(e)
            if "not a database" in msg or "malformed" in msg or "encrypted" in msg:
                raise KfcError(f"{self.path} is not a kfc knowledge base (not an SQLite file: {msg})",
                               hint=_HINT) from None
            raise KfcError(f"cannot open the knowledge base {self.path}: {msg}", hint=_HINT) from None

    def _open_postgres(self, url: str) -> None:
        self.url = url
        self.path = postgres.redacted(url)  # what messages name
        conn = postgres.Connection(url, BUSY_TIMEOUT_S)
        self._errors = (conn.Error,)
        self._conn = conn
        try:
            self._init_schema()
        except BaseException:
            conn.close()
            self._conn = None
            raise

    @property
    def is_postgres(self) -> bool:
        return isinstance(self._conn, postgres.Connection)

    # --- plumbing -------------------------------------------------------------------------
    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise KfcError(f"the knowledge base {self.path} is closed")
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KnowledgeBase({str(self.path)!r})"

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction: BEGIN IMMEDIATE (takes the write lock, waiting for another writer),
        COMMIT on success, ROLLBACK on any error. Nothing is written outside one of these."""
        conn = self.conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except self._errors as e:
            raise KfcError(f"cannot write to the knowledge base {self.path}: {e}",
                           hint="another process may hold it for longer than "
                                f"{BUSY_TIMEOUT_S:.0f} s, or the file is read-only") from None
        try:
            yield conn
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(e, self._errors):
                raise KfcError(f"knowledge base {self.path}: {e}") from None
            raise
        else:
            try:
                conn.execute("COMMIT")
            except self._errors as e:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise KfcError(f"knowledge base {self.path}: commit failed: {e}") from None

    def _tables(self) -> set[str]:
        if self.is_postgres:
            return self.conn.tables()
        return {r[0] for r in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}

    def _check_schema(self, tables: set[str]) -> bool:
        """True when the file holds this schema; False when it is empty; raises otherwise."""
        if "kfc_schema" not in tables:
            if tables:
                raise KfcError(f"{self.path} is an SQLite database but not a kfc knowledge base "
                               f"(it has tables {', '.join(sorted(tables)[:5])})", hint=_HINT)
            return False
        version = self.conn.execute("SELECT MAX(version) FROM kfc_schema").fetchone()[0]
        if version is None:
            raise KfcError(f"{self.path} is not a kfc knowledge base (its schema table is empty)", hint=_HINT)
        if version > SCHEMA_VERSION:
            raise KfcError(f"{self.path} is a kfc knowledge base of schema version {version}; this kfc reads "
                           f"version {SCHEMA_VERSION}", hint="upgrade kfc, or " + _HINT)
        if version < SCHEMA_VERSION:
            raise KfcError(f"{self.path} is a kfc knowledge base of the old schema version {version}, which "
                           f"this kfc (version {SCHEMA_VERSION}) cannot migrate", hint=_HINT)
        missing = set(_TABLES) - tables
        if missing:
            raise KfcError(f"{self.path} is a damaged kfc knowledge base: table(s) {', '.join(sorted(missing))} "
                           "are missing", hint=_HINT)
        return True

    def _init_schema(self) -> None:
        if self._check_schema(self._tables()):
            return
        with self._write() as conn:  # re-check under the write lock: another process may have won
            if self._check_schema(self._tables()):
                return
            schema = postgres.translate_schema(_SCHEMA) if self.is_postgres else _SCHEMA
            for stmt in schema.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute("INSERT INTO kfc_schema(version, created_utc) VALUES (?, ?)", (SCHEMA_VERSION, _now()))
            if not self.is_postgres:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def _require(self, table: str, row_id: int | None, what: str) -> None:
        if row_id is None:
            return
        if isinstance(row_id, bool) or not isinstance(row_id, numbers.Integral):
            raise KfcError(f"{what} must be an integer id, not {row_id!r}")
        if self.conn.execute(f"SELECT 1 FROM {table} WHERE id = ?", (int(row_id),)).fetchone() is None:
            raise KfcError(f"no {what} {row_id} in the knowledge base {self.path}")

    # --- ops ------------------------------------------------------------------------------
    def op_id(self, fingerprint: str, name: str, features: dict[str, Any]) -> int:
        """The id of the op with this fingerprint, created (with this name and features) if new."""
        if not fingerprint or not isinstance(fingerprint, str):
            raise KfcError(f"bad op fingerprint {fingerprint!r}")
        feats = _dumps(features or {}, "op features")
        with self._write() as conn:
            conn.execute("INSERT OR IGNORE INTO ops(fingerprint, name, features, created_utc) VALUES (?, ?, ?, ?)",
                         (fingerprint, name, feats, _now()))
            return conn.execute("SELECT id FROM ops WHERE fingerprint = ?", (fingerprint,)).fetchone()[0]

    def op(self, op_id: int) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM ops WHERE id = ?", (op_id,)).fetchone()
        return _decode(row) if row else None

    def op_by_fingerprint(self, fingerprint: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM ops WHERE fingerprint = ?", (fingerprint,)).fetchone()
        return _decode(row) if row else None

    def ops(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every op (or those with this name), oldest first."""
        if name is None:
            rows = self.conn.execute("SELECT * FROM ops ORDER BY id")
        else:
            rows = self.conn.execute("SELECT * FROM ops WHERE name = ? ORDER BY id", (name,))
        return [_decode(r) for r in rows]

    # --- runs -----------------------------------------------------------------------------
    def start_run(self, op_id: int, target: str, shape: dict[str, int], policy: str, budget: int | None,
                  env: dict[str, Any] | None = None) -> int:
        """A new run in status 'running'. `env` keys gpu, driver, toolchain, kfc_commit fill those
        columns; the whole dict is kept as JSON in `env`."""
        env = dict(env or {})
        self._require("ops", op_id, "op")
        shape_text = canonical_shape(shape)
        env_text = _dumps(env, "the run's env")
        cols = [None if env.get(k) is None else str(env[k]) for k in _ENV_COLUMNS]
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO runs(op_id, target, shape, policy, budget, started_utc, status, gpu, driver, toolchain, "
                "kfc_commit, env) VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (op_id, target, shape_text, policy or "", budget, _now(), *cols, env_text))
            return cur.lastrowid

    def finish_run(self, run_id: int, status: str, notes: str = "") -> None:
        """Close a run as finished, interrupted or failed; non-empty notes replace the old ones."""
        if status not in RUN_STATUSES or status == "running":
            raise KfcError(f"bad run status {status!r}", hint="finished, interrupted or failed")
        self._require("runs", run_id, "run")
        with self._write() as conn:
            if notes:
                conn.execute("UPDATE runs SET status = ?, finished_utc = ?, notes = ? WHERE id = ?",
                             (status, _now(), notes, run_id))
            else:
                conn.execute("UPDATE runs SET status = ?, finished_utc = ? WHERE id = ?", (status, _now(), run_id))

    def unfinished_run(self, op_id: int, target: str, shape: dict[str, int], policy: str) -> int | None:
        """The id of the newest run of this op, target and shape, if it used this policy and
        did not finish (interrupted, or still 'running' because its process was killed): a
        re-run of the same command continues it. None when the newest run finished."""
        row = self.conn.execute(
            "SELECT id, policy, status FROM runs WHERE op_id = ? AND target = ? AND shape = ? ORDER BY id DESC LIMIT 1",
            (op_id, target, canonical_shape(shape))).fetchone()
        if row is None or row["policy"] != (policy or "") or row["status"] not in ("running", "interrupted"):
            return None
        return row["id"]

    def reopen_run(self, run_id: int, budget: int | None) -> None:
        """Mark an unfinished run as running again, with the budget of the command resuming it."""
        self._require("runs", run_id, "run")
        with self._write() as conn:
            conn.execute("UPDATE runs SET status = 'running', finished_utc = NULL, budget = ? WHERE id = ?",
                         (budget, run_id))

    def pending(self, run_id: int) -> list[tuple[int, Proposal]]:
        """Candidates of a run recorded without an outcome (in flight when its process died)."""
        rows = self.conn.execute(
            "SELECT c.id, c.pipeline, c.rationale, c.proposer, c.parent_id FROM candidates c LEFT JOIN outcomes o "
            "ON o.candidate_id = c.id WHERE c.run_id = ? AND o.candidate_id IS NULL ORDER BY c.id", (run_id,))
        return [(r["id"], _proposal_of(r)) for r in rows]

    def runs(self, op_id: int | None = None) -> list[dict[str, Any]]:
        """Runs, oldest first, each with its op's name and fingerprint and a summary: candidates,
        evaluated (with an outcome), timed, best_us and best_speedup (over timed candidates)."""
        sql = """
        SELECT r.*, o.name AS op_name, o.fingerprint AS op_fingerprint,
               (SELECT COUNT(*) FROM candidates c WHERE c.run_id = r.id) AS candidates,
               (SELECT COUNT(*) FROM candidates c JOIN outcomes x ON x.candidate_id = c.id
                 WHERE c.run_id = r.id) AS evaluated,
               (SELECT COUNT(*) FROM candidates c JOIN outcomes x ON x.candidate_id = c.id
                 WHERE c.run_id = r.id AND x.stage = 'timed') AS timed,
               (SELECT MIN(x.median_us) FROM candidates c JOIN outcomes x ON x.candidate_id = c.id
                 WHERE c.run_id = r.id AND x.stage = 'timed') AS best_us,
               (SELECT MAX(x.speedup) FROM candidates c JOIN outcomes x ON x.candidate_id = c.id
                 WHERE c.run_id = r.id AND x.stage = 'timed') AS best_speedup
        FROM runs r JOIN ops o ON o.id = r.op_id"""
        if op_id is None:
            rows = self.conn.execute(sql + " ORDER BY r.id")
        else:
            rows = self.conn.execute(sql + " WHERE r.op_id = ? ORDER BY r.id", (op_id,))
        return [_decode(r) for r in rows]

    # --- candidates and outcomes ----------------------------------------------------------
    def add_candidate(self, run_id: int | None, op_id: int, target: str, shape: dict[str, int],
                      proposal: Proposal, config: dict[str, Any] | None = None) -> int:
        """Record a proposal before it is evaluated (so a crash mid-evaluation leaves a trace)."""
        if not isinstance(proposal, Proposal):
            raise KfcError(f"add_candidate takes a Proposal, not {type(proposal).__name__}")
        self._require("runs", run_id, "run")
        self._require("ops", op_id, "op")
        self._require("candidates", proposal.parent, "parent candidate")
        shape_text = canonical_shape(shape)
        config_text = None if config is None else _dumps(config, "the candidate's config")
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO candidates(run_id, op_id, target, shape, pipeline, config, parent_id, proposer, "
                "rationale, created_utc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, op_id, target, shape_text, proposal.pipeline, config_text, proposal.parent,
                 proposal.proposer or "", proposal.rationale or "", _now()))
            return cur.lastrowid

    def record_outcome(self, candidate_id: int, outcome: Outcome, *, replace: bool = False) -> None:
        """Record how far a candidate got. A candidate has one outcome: recording a second raises
        unless replace=True (e.g. a re-measurement in a fresh process)."""
        if not isinstance(outcome, Outcome):
            raise KfcError(f"record_outcome takes an Outcome, not {type(outcome).__name__}")
        if not isinstance(outcome.stage, Stage):
            raise KfcError(f"an outcome's stage must be a Stage, not {outcome.stage!r}")
        self._require("candidates", candidate_id, "candidate")
        values = []
        for f in _OUTCOME_FIELDS:
            v = getattr(outcome, f)
            if f == "stage":
                v = v.value
            elif f == "times_us":
                v = _dumps([float(t) for t in v], "times_us")
            elif v is not None and f in _INT_FIELDS:
                v = int(v)
            elif v is not None and f in _FLOAT_FIELDS:
                v = float(v)
            values.append(v)
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        with self._write() as conn:
            if not replace and conn.execute("SELECT 1 FROM outcomes WHERE candidate_id = ?",
                                            (candidate_id,)).fetchone():
                raise KfcError(f"candidate {candidate_id} already has an outcome",
                               hint="pass replace=True to overwrite it")
            conn.execute(f"{verb} INTO outcomes(candidate_id, {', '.join(_OUTCOME_FIELDS)}, recorded_utc) "
                         f"VALUES (?, {', '.join('?' for _ in _OUTCOME_FIELDS)}, ?)",
                         (candidate_id, *values, _now()))

    def _where(self, op_id=None, run_id=None, target=None, shape=None) -> tuple[str, list]:
        clauses, params = [], []
        for col, val in (("c.op_id", op_id), ("c.run_id", run_id), ("c.target", target)):
            if val is not None:
                clauses.append(f"{col} = ?")
                params.append(val)
        if shape is not None:
            clauses.append("c.shape = ?")
            params.append(canonical_shape(shape))
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    def trials(self, op_id: int | None = None, run_id: int | None = None, target: str | None = None,
               shape: dict[str, int] | None = None) -> list[Trial]:
        """Evaluated candidates (those with an outcome) matching every filter given, oldest first."""
        where, params = self._where(op_id, run_id, target, shape)
        return [_trial_of(r) for r in self.conn.execute(_TRIAL_SELECT + where + " ORDER BY c.id", params)]

    def candidates(self, op_id: int | None = None, run_id: int | None = None, target: str | None = None,
                   shape: dict[str, int] | None = None) -> list[dict[str, Any]]:
        """Every candidate matching the filters, oldest first, as dicts: its own columns, its op's
        name, and its outcome's columns (all None, stage included, while it has none)."""
        where, params = self._where(op_id, run_id, target, shape)
        sql = ("SELECT c.*, p.name AS op_name, o.stage, o.error, o.registers, o.spills, o.smem_bytes, o.median_us, "
               "o.spread_us, o.bytes_moved, o.flops, o.roofline_fraction, o.speedup, o.times_us, "
               "o.notes AS outcome_notes, o.recorded_utc FROM candidates c JOIN ops p ON p.id = c.op_id "
               "LEFT JOIN outcomes o ON o.candidate_id = c.id")
        return [_decode(r) for r in self.conn.execute(sql + where + " ORDER BY c.id", params)]

    def tried(self, op_id: int, target: str, shape: dict[str, int], *, include_pending: bool = False) -> set[str]:
        """Pipelines already evaluated for this op, target and shape (to resume a search without
        repeating work). Each appears as stored and, where it parses, in canonical form, so both
        `p in tried` and `str(parse_pipeline(p)) in tried` work. include_pending=True adds
        candidates recorded without an outcome (e.g. one that killed its process)."""
        where, params = self._where(op_id, None, target, shape)
        join = "LEFT JOIN" if include_pending else "JOIN"
        rows = self.conn.execute(
            f"SELECT DISTINCT c.pipeline FROM candidates c {join} outcomes o ON o.candidate_id = c.id" + where, params)
        out: set[str] = set()
        for (text,) in rows:
            out.add(text)
            canon = _canonical_pipeline(text)
            if canon is not None:
                out.add(canon)
        return out

    def _timed(self, op_id: int, target: str, shape: dict[str, int] | None, limit: int | None = None) -> list[Trial]:
        where, params = self._where(op_id, None, target, shape)
        where = (where + " AND" if where else " WHERE") + " o.stage = 'timed' AND o.median_us IS NOT NULL"
        sql = _TRIAL_SELECT + where + " ORDER BY o.median_us ASC, c.id ASC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_trial_of(r) for r in self.conn.execute(sql, params)]

    def best(self, op_id: int, target: str, shape: dict[str, int]) -> Trial | None:
        """The fastest TIMED trial (lowest median; the earlier one on a tie), or None."""
        found = self._timed(op_id, target, shape, limit=1)
        return found[0] if found else None

    def best_by_fingerprint(self, fingerprint: str, target: str, shape: dict[str, int]) -> Trial | None:
        op = self.op_by_fingerprint(fingerprint)
        return None if op is None else self.best(op["id"], target, shape)

    def similar_ops(self, features: dict[str, Any], k: int = 5, min_similarity: float = 0.5, *,
                    exclude_fingerprint: str | None = None) -> list[tuple[int, str, float]]:
        """Up to k ops as (op_id, name, similarity), most similar first (then oldest). An op with
        identical features is included (similarity 1.0) unless its fingerprint is excluded."""
        scored = []
        for row in self.conn.execute("SELECT id, fingerprint, name, features FROM ops ORDER BY id"):
            if exclude_fingerprint is not None and row["fingerprint"] == exclude_fingerprint:
                continue
            s = similarity(features or {}, json.loads(row["features"] or "{}"))
            if s >= min_similarity:
                scored.append((row["id"], row["name"], s))
        scored.sort(key=lambda t: (-t[2], t[0]))
        return scored[:k]

    def prior(self, fingerprint: str, features: dict[str, Any], target: str, shape: dict[str, int],
              k: int = 8) -> list[Trial]:
        """What to start a search from: up to k TIMED trials of each op at this target and shape,
        first this op's (fastest first), then those of each similar op (most similar op first,
        fastest first within an op). A pipeline appears once per op (its best-ranked trial): the
        same pipeline measured for two ops is two facts, and each op's record stays whole, so a
        policy can tell how near a configuration came to its own op's best."""
        out: list[Trial] = []
        if k <= 0:
            return out

        def take(trials: list[Trial]) -> None:
            seen: set[str] = set()
            for t in trials:
                key = _canonical_pipeline(t.proposal.pipeline) or t.proposal.pipeline
                if key not in seen and len(seen) < k:
                    seen.add(key)
                    out.append(t)

        own = self.op_by_fingerprint(fingerprint)
        if own is not None:
            take(self._timed(own["id"], target, shape))
        for op_id, _name, _s in self.similar_ops(features, k=1_000_000, min_similarity=0.5,
                                                 exclude_fingerprint=fingerprint):
            take(self._timed(op_id, target, shape))
        return out

    # --- lessons --------------------------------------------------------------------------
    def add_lesson(self, op_id: int | None, text: str, evidence: list[int] | tuple[int, ...] = (),
                   author: str = "") -> int:
        """A short lesson, about one op (or every op when op_id is None), citing candidate ids."""
        if not isinstance(text, str) or not text.strip():
            raise KfcError("a lesson needs a non-empty text")
        self._require("ops", op_id, "op")
        ids = []
        for cid in evidence or ():
            self._require("candidates", cid, "evidence candidate")
            ids.append(int(cid))
        with self._write() as conn:
            cur = conn.execute("INSERT INTO lessons(op_id, text, evidence, author, created_utc) VALUES (?, ?, ?, ?, ?)",
                               (op_id, text.strip(), _dumps(ids, "evidence"), author or "", _now()))
            return cur.lastrowid

    def lessons(self, op_id: int | None = None) -> list[dict[str, Any]]:
        """Lessons, oldest first, as dicts (id, op_id, op_name, text, evidence, author, created_utc).
        With op_id: that op's lessons and the general ones (op_id NULL); without: all of them."""
        sql = "SELECT l.*, o.name AS op_name FROM lessons l LEFT JOIN ops o ON o.id = l.op_id"
        if op_id is None:
            rows = self.conn.execute(sql + " ORDER BY l.id")
        else:
            rows = self.conn.execute(sql + " WHERE l.op_id = ? OR l.op_id IS NULL ORDER BY l.id", (op_id,))
        return [_decode(r) for r in rows]

    # --- everything -----------------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        """Every table as lists of JSON-able dicts (JSON columns decoded), oldest first."""
        out: dict[str, Any] = {"format": "kfc-knowledge-base", "schema_version": SCHEMA_VERSION,
                               "exported_utc": _now(), "path": str(self.path)}
        key = {"outcomes": "candidate_id"}
        # one read transaction, so the tables agree with each other
        conn = self.conn
        conn.execute("BEGIN")
        try:
            for table in _TABLES:
                rows = conn.execute(f"SELECT * FROM {table} ORDER BY {key.get(table, 'id')}")
                out[table] = [_decode(r) for r in rows]
        finally:
            conn.execute("COMMIT")
        return out

    def integrity_check(self) -> str:
        """'ok', or SQLite's description of the damage (a PostgreSQL server keeps its own
        integrity: its tables are checked to be there)."""
        if self.is_postgres:
            missing = set(_TABLES) - self._tables()
            return "ok" if not missing else f"missing tables: {', '.join(sorted(missing))}"
        return "\n".join(r[0] for r in self.conn.execute("PRAGMA integrity_check"))


def _canonical_pipeline(text: str) -> str | None:
    from ..passes.base import PassError
    from ..passes.pipeline import parse_pipeline

    try:
        return str(parse_pipeline(text))
    except (PassError, KfcError, ValueError, TypeError):
        return None

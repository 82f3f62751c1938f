"""The knowledge base: every experiment the factory runs, with its provenance, in one SQLite file
(or, for a team, a PostgreSQL database: give a `postgresql://` URL instead of a path; see
kfc.kb.postgres). The tables are in kfc.kb.schema, opening and transactions in kfc.kb.database,
the conversions between rows and records in kfc.kb.rows; this module asks the questions.

Ids only grow (AUTOINCREMENT), so "oldest first" is "by id".
"""

from __future__ import annotations

from typing import Any

from ..diagnostics import KfcError
from ..model.records import Outcome, Proposal, Stage, Trial
from .database import Database, default_path
from .op_similarity import similarity
from .rows import (
    TRIAL_SELECT, canonical_pipeline, canonical_shape, decode_row, from_json, now_utc, proposal_of, shape_distance,
    to_json, trial_of,
)
from .schema import ENV_COLUMNS, FLOAT_FIELDS, INT_FIELDS, OUTCOME_FIELDS, RUN_STATUSES, SCHEMA_VERSION, TABLES

__all__ = ["KnowledgeBase", "SCHEMA_VERSION", "canonical_shape", "default_path"]


class KnowledgeBase(Database):
    """One SQLite file (or PostgreSQL database) of ops, runs, candidates, outcomes and lessons.

    `KnowledgeBase(path)` opens (creating, unless `create=False`) the file; `path` defaults to
    `default_path()`; a `postgresql://` URL opens that database, creating the tables in it if
    it has none. Use as a context manager or call `close()`. One object per thread.
    """

    # --- ops ------------------------------------------------------------------------------
    def op_id(self, fingerprint: str, name: str, features: dict[str, Any]) -> int:
        """The id of the op with this fingerprint, created (with this name and features) if new."""
        if not fingerprint or not isinstance(fingerprint, str):
            raise KfcError(f"bad op fingerprint {fingerprint!r}")
        feats = to_json(features or {}, "op features")
        with self._write() as conn:
            conn.execute("INSERT OR IGNORE INTO ops(fingerprint, name, features, created_utc) VALUES (?, ?, ?, ?)",
                         (fingerprint, name, feats, now_utc()))
            return conn.execute("SELECT id FROM ops WHERE fingerprint = ?", (fingerprint,)).fetchone()[0]

    def op(self, op_id: int) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM ops WHERE id = ?", (op_id,)).fetchone()
        return decode_row(row) if row else None

    def op_by_fingerprint(self, fingerprint: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM ops WHERE fingerprint = ?", (fingerprint,)).fetchone()
        return decode_row(row) if row else None

    def ops(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every op (or those with this name), oldest first."""
        if name is None:
            rows = self.conn.execute("SELECT * FROM ops ORDER BY id")
        else:
            rows = self.conn.execute("SELECT * FROM ops WHERE name = ? ORDER BY id", (name,))
        return [decode_row(r) for r in rows]

    # --- runs -----------------------------------------------------------------------------
    def start_run(self, op_id: int, target: str, shape: dict[str, int], policy: str, budget: int | None,
                  env: dict[str, Any] | None = None) -> int:
        """A new run in status 'running'. `env` keys gpu, driver, toolchain, kfc_commit fill those
        columns; the whole dict is kept as JSON in `env`."""
        env = dict(env or {})
        self._require("ops", op_id, "op")
        shape_text = canonical_shape(shape)
        env_text = to_json(env, "the run's env")
        cols = [None if env.get(k) is None else str(env[k]) for k in ENV_COLUMNS]
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO runs(op_id, target, shape, policy, budget, started_utc, status, gpu, driver, toolchain, "
                "kfc_commit, env) VALUES (?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (op_id, target, shape_text, policy or "", budget, now_utc(), *cols, env_text))
            return cur.lastrowid

    def finish_run(self, run_id: int, status: str, notes: str = "") -> None:
        """Close a run as finished, interrupted or failed; non-empty notes replace the old ones."""
        if status not in RUN_STATUSES or status == "running":
            raise KfcError(f"bad run status {status!r}", hint="finished, interrupted or failed")
        self._require("runs", run_id, "run")
        with self._write() as conn:
            if notes:
                conn.execute("UPDATE runs SET status = ?, finished_utc = ?, notes = ? WHERE id = ?",
                             (status, now_utc(), notes, run_id))
            else:
                conn.execute("UPDATE runs SET status = ?, finished_utc = ? WHERE id = ?", (status, now_utc(), run_id))

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
        return [(r["id"], proposal_of(r)) for r in rows]

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
        return [decode_row(r) for r in rows]

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
        config_text = None if config is None else to_json(config, "the candidate's config")
        with self._write() as conn:
            cur = conn.execute(
                "INSERT INTO candidates(run_id, op_id, target, shape, pipeline, config, parent_id, proposer, "
                "rationale, created_utc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (run_id, op_id, target, shape_text, proposal.pipeline, config_text, proposal.parent,
                 proposal.proposer or "", proposal.rationale or "", now_utc()))
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
        for f in OUTCOME_FIELDS:
            v = getattr(outcome, f)
            if f == "stage":
                v = v.value
            elif f == "times_us":
                v = to_json([float(t) for t in v], "times_us")
            elif v is not None and f in INT_FIELDS:
                v = int(v)
            elif v is not None and f in FLOAT_FIELDS:
                v = float(v)
            values.append(v)
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        with self._write() as conn:
            if not replace and conn.execute("SELECT 1 FROM outcomes WHERE candidate_id = ?",
                                            (candidate_id,)).fetchone():
                raise KfcError(f"candidate {candidate_id} already has an outcome",
                               hint="pass replace=True to overwrite it")
            conn.execute(f"{verb} INTO outcomes(candidate_id, {', '.join(OUTCOME_FIELDS)}, recorded_utc) "
                         f"VALUES (?, {', '.join('?' for _ in OUTCOME_FIELDS)}, ?)",
                         (candidate_id, *values, now_utc()))

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
        return [trial_of(r) for r in self.conn.execute(TRIAL_SELECT + where + " ORDER BY c.id", params)]

    def candidates(self, op_id: int | None = None, run_id: int | None = None, target: str | None = None,
                   shape: dict[str, int] | None = None) -> list[dict[str, Any]]:
        """Every candidate matching the filters, oldest first, as dicts: its own columns, its op's
        name, and its outcome's columns (all None, stage included, while it has none)."""
        where, params = self._where(op_id, run_id, target, shape)
        sql = ("SELECT c.*, p.name AS op_name, o.stage, o.error, o.registers, o.spills, o.smem_bytes, o.median_us, "
               "o.spread_us, o.bytes_moved, o.flops, o.roofline_fraction, o.speedup, o.times_us, "
               + ("o.eager_us, o.eager_speedup, " if self.version >= 2 else "NULL AS eager_us, NULL AS eager_speedup, ")
               + "o.notes AS outcome_notes, o.recorded_utc FROM candidates c JOIN ops p ON p.id = c.op_id "
               "LEFT JOIN outcomes o ON o.candidate_id = c.id")
        return [decode_row(r) for r in self.conn.execute(sql + where + " ORDER BY c.id", params)]

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
            canon = canonical_pipeline(text)
            if canon is not None:
                out.add(canon)
        return out

    def _timed(self, op_id: int, target: str, shape: dict[str, int] | None, limit: int | None = None) -> list[Trial]:
        where, params = self._where(op_id, None, target, shape)
        where = (where + " AND" if where else " WHERE") + " o.stage = 'timed' AND o.median_us IS NOT NULL"
        sql = TRIAL_SELECT + where + " ORDER BY o.median_us ASC, c.id ASC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [trial_of(r) for r in self.conn.execute(sql, params)]

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
            s = similarity(features or {}, from_json(row["features"] or "{}", "features", row["id"]))
            if s >= min_similarity:
                scored.append((row["id"], row["name"], s))
        scored.sort(key=lambda t: (-t[2], t[0]))
        return scored[:k]

    def prior(self, fingerprint: str, features: dict[str, Any], target: str, shape: dict[str, int],
              k: int = 8) -> list[Trial]:
        """What to start a search from: up to k TIMED trials of each op at this target and shape,
        first this op's (fastest first), then those of each similar op (most similar op first,
        fastest first within an op), then this op's at each other shape (the nearest shape first,
        fastest first within a shape: what one GEMM shape learned seeds the next). A pipeline appears once per op (its best-ranked trial): the
        same pipeline measured for two ops is two facts, and each op's record stays whole, so a
        policy can tell how near a configuration came to its own op's best."""
        out: list[Trial] = []
        if k <= 0:
            return out

        def take(trials: list[Trial]) -> None:
            seen: set[str] = set()
            for t in trials:
                key = canonical_pipeline(t.proposal.pipeline) or t.proposal.pipeline
                if key not in seen and len(seen) < k:
                    seen.add(key)
                    out.append(t)

        own = self.op_by_fingerprint(fingerprint)
        if own is not None:
            take(self._timed(own["id"], target, shape))
        for op_id, _name, _s in self.similar_ops(features, k=1_000_000, min_similarity=0.5,
                                                 exclude_fingerprint=fingerprint):
            take(self._timed(op_id, target, shape))
        if own is not None:  # then this op's own record at its other shapes, the nearest first
            shapes = {c["id"]: c["shape"] for c in self.candidates(op_id=own["id"], target=target)}
            here = canonical_shape(shape)
            by_shape: dict[str, list[Trial]] = {}
            for t in self._timed(own["id"], target, None):
                if canonical_shape(shapes[t.candidate_id]) != here:
                    by_shape.setdefault(canonical_shape(shapes[t.candidate_id]), []).append(t)
            for group in sorted(by_shape.values(), key=lambda g: shape_distance(shapes[g[0].candidate_id], shape)):
                take(group)
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
                               (op_id, text.strip(), to_json(ids, "evidence"), author or "", now_utc()))
            return cur.lastrowid

    def lessons(self, op_id: int | None = None) -> list[dict[str, Any]]:
        """Lessons, oldest first, as dicts (id, op_id, op_name, text, evidence, author, created_utc).
        With op_id: that op's lessons and the general ones (op_id NULL); without: all of them."""
        sql = "SELECT l.*, o.name AS op_name FROM lessons l LEFT JOIN ops o ON o.id = l.op_id"
        if op_id is None:
            rows = self.conn.execute(sql + " ORDER BY l.id")
        else:
            rows = self.conn.execute(sql + " WHERE l.op_id = ? OR l.op_id IS NULL ORDER BY l.id", (op_id,))
        return [decode_row(r) for r in rows]

    # --- everything -----------------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        """Every table as lists of JSON-able dicts (JSON columns decoded), oldest first."""
        out: dict[str, Any] = {"format": "kfc-knowledge-base", "schema_version": SCHEMA_VERSION,
                               "exported_utc": now_utc(), "path": str(self.path)}
        key = {"outcomes": "candidate_id"}
        # one read transaction, so the tables agree with each other
        conn = self.conn
        conn.execute("BEGIN")
        try:
            for table in TABLES:
                rows = conn.execute(f"SELECT * FROM {table} ORDER BY {key.get(table, 'id')}")
                out[table] = [decode_row(r) for r in rows]
        finally:
            conn.execute("COMMIT")
        return out

    def integrity_check(self) -> str:
        """'ok', or SQLite's description of the damage (a PostgreSQL server keeps its own
        integrity: its tables are checked to be there)."""
        if self.is_postgres:
            missing = set(TABLES) - self._tables()
            return "ok" if not missing else f"missing tables: {', '.join(sorted(missing))}"
        return "\n".join(r[0] for r in self.conn.execute("PRAGMA integrity_check"))


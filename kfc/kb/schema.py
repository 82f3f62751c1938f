"""The knowledge base's tables, as SQL, and the constants that describe them.

Tables (schema version 2; `kfc_schema` holds the version, `PRAGMA application_id` marks the file):

    ops         id, fingerprint UNIQUE, name, features JSON, created_utc
    runs        id, op_id, target, shape JSON, policy, budget, started_utc, finished_utc,
                status (running | finished | interrupted | failed), gpu, driver, toolchain,
                kfc_commit, env JSON (the whole env dict given), notes
    candidates  id, run_id (nullable), op_id, target, shape JSON, pipeline, config JSON (nullable),
                parent_id (nullable), proposer, rationale, created_utc
    outcomes    candidate_id PK/FK, stage, error, registers, spills, smem_bytes, median_us,
                spread_us, bytes_moved, flops, roofline_fraction, speedup, times_us JSON, notes,
                recorded_utc, eager_us, eager_speedup (version 2: MIGRATIONS adds them to a version 1)
    lessons     id, op_id (nullable: a lesson about every op), text, evidence JSON (candidate ids),
                author, created_utc
"""

SCHEMA_VERSION = 2
# the statements that take a knowledge base from version v to v + 1, by v
MIGRATIONS = {1: ("ALTER TABLE outcomes ADD COLUMN eager_us REAL", "ALTER TABLE outcomes ADD COLUMN eager_speedup REAL")}
APPLICATION_ID = 0x6B666362  # "kfcb"
RUN_STATUSES = ("running", "finished", "interrupted", "failed")
BUSY_TIMEOUT_S = 30.0

SCHEMA = """
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
    recorded_utc      TEXT NOT NULL,
    eager_us          REAL,
    eager_speedup     REAL
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

TABLES = ("ops", "runs", "candidates", "outcomes", "lessons")
JSON_COLUMNS = {"features", "shape", "env", "config", "times_us", "evidence"}
OUTCOME_FIELDS = ("stage", "error", "registers", "spills", "smem_bytes", "median_us", "spread_us",
                   "bytes_moved", "flops", "roofline_fraction", "speedup", "times_us", "notes", "eager_us",
                  "eager_speedup")
ENV_COLUMNS = ("gpu", "driver", "toolchain", "kfc_commit")
INT_FIELDS = {"registers", "spills", "smem_bytes", "bytes_moved", "flops"}
FLOAT_FIELDS = {"median_us", "spread_us", "roofline_fraction", "speedup", "eager_us", "eager_speedup"}
HINT = "give another path with --kb PATH or the KFC_KB environment variable"


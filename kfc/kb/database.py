"""Opening a knowledge base — an SQLite file, or a PostgreSQL database named by a `postgresql://`
URL (see kfc.kb.postgres) — checking or creating its schema, and writing to it in transactions.

Durability: the file is opened in WAL mode with `synchronous=NORMAL`, and every write is its own
`BEGIN IMMEDIATE … COMMIT` transaction, so a process killed at any instant (SIGKILL included)
loses nothing it had already recorded; only a power loss may drop the last few commits. Many
readers and one writer at a time may share the file; a writer waits up to 30 s for another.
"""

from __future__ import annotations

import numbers
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from ..diagnostics import KfcError
from . import postgres
from .rows import DAMAGED_HINT, now_utc
from .schema import APPLICATION_ID, BUSY_TIMEOUT_S, HINT, MIGRATIONS, SCHEMA, SCHEMA_VERSION, TABLES


@contextmanager
def reporting_damage(location) -> Iterator[None]:
    """Reading a knowledge base: a file SQLite finds damaged (a torn page) is one clear error."""
    try:
        yield
    except sqlite3.DatabaseError as e:
        raise KfcError(f"the knowledge base {location} is damaged: {e}", hint=DAMAGED_HINT) from None


def default_path() -> Path | str:
    """$KFC_KB (a path, or a postgresql:// URL), else ~/.cache/kfc/kb.sqlite."""
    env = os.environ.get("KFC_KB")
    if postgres.is_url(env):
        return env
    return Path(env).expanduser() if env else Path.home() / ".cache" / "kfc" / "kb.sqlite"


class Database:
    """The connection under a KnowledgeBase (kfc.kb.store), which adds the queries: opening the file
    or server, checking or creating the schema, one transaction per write, and closing."""

    def __init__(self, path: str | os.PathLike | None = None, *, create: bool = True) -> None:
        if path is None:
            path = default_path()
        self._conn = None
        # a reader (create=False) leaves an older schema as it is (kfc of that version still
        # reads it) and reads its missing columns as None; a writer migrates it (MIGRATIONS)
        self._migrates = create
        self.version = SCHEMA_VERSION
        self._errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
        if postgres.is_url(str(path)):
            self._open_postgres(str(path))
            return
        self.path = Path(path).expanduser()
        if self.path.is_dir():
            raise KfcError(f"{self.path} is a directory, not a knowledge base file", hint=HINT)
        if not self.path.exists():
            if not create:
                raise KfcError(f"no knowledge base at {self.path}",
                               hint="run `kfc tune` to create one, or " + HINT)
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise KfcError(f"cannot create the folder for the knowledge base {self.path}: "
                               f"{e.strerror or e}", hint=HINT) from None
        try:
            conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as e:
            raise KfcError(f"cannot open the knowledge base {self.path}: {e}", hint=HINT) from None
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
            if "malformed" in msg:
                raise KfcError(f"the knowledge base {self.path} is damaged: {msg}", hint=DAMAGED_HINT) from None
            if "not a database" in msg or "encrypted" in msg:
                raise KfcError(f"{self.path} is not a kfc knowledge base (not an SQLite file: {msg})",
                               hint=HINT) from None
            raise KfcError(f"cannot open the knowledge base {self.path}: {msg}", hint=HINT) from None

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
                               f"(it has tables {', '.join(sorted(tables)[:5])})", hint=HINT)
            return False
        version = self.conn.execute("SELECT MAX(version) FROM kfc_schema").fetchone()[0]
        if version is None:
            raise KfcError(f"{self.path} is not a kfc knowledge base (its schema table is empty)", hint=HINT)
        if version > SCHEMA_VERSION:
            raise KfcError(f"{self.path} is a kfc knowledge base of schema version {version}; this kfc reads "
                           f"version {SCHEMA_VERSION}", hint="upgrade kfc, or " + HINT)
        if version < SCHEMA_VERSION and self._migrates:
            self._migrate(version)
        elif version < SCHEMA_VERSION:
            if version not in MIGRATIONS:
                raise KfcError(f"{self.path} is a kfc knowledge base of the old schema version {version}, which "
                               f"this kfc (version {SCHEMA_VERSION}) cannot read", hint=HINT)
            self.version = version
        missing = set(TABLES) - tables
        if missing:
            raise KfcError(f"{self.path} is a damaged kfc knowledge base: table(s) {', '.join(sorted(missing))} "
                           "are missing", hint=HINT)
        return True

    def _migrate(self, version: int) -> None:
        """Bring a knowledge base of an older schema version up to this one (schema.MIGRATIONS),
        one version at a time, each in one transaction; what it held stays."""
        if version not in MIGRATIONS:
            raise KfcError(f"{self.path} is a kfc knowledge base of the old schema version {version}, which "
                           f"this kfc (version {SCHEMA_VERSION}) cannot migrate", hint=HINT)
        def apply(conn) -> None:  # under the write lock: another process may have migrated it since
            now = conn.execute("SELECT MAX(version) FROM kfc_schema").fetchone()[0]
            for v in range(now, SCHEMA_VERSION):
                for stmt in MIGRATIONS[v]:
                    conn.execute(postgres.translate_schema(stmt) if self.is_postgres else stmt)
                conn.execute("INSERT INTO kfc_schema(version, created_utc) VALUES (?, ?)", (v + 1, now_utc()))

        if self.conn.in_transaction:  # _init_schema's second look holds the lock already
            apply(self.conn)
        else:
            with self._write() as conn:
                apply(conn)

    def _init_schema(self) -> None:
        if self._check_schema(self._tables()):
            return
        with self._write() as conn:  # re-check under the write lock: another process may have won
            if self._check_schema(self._tables()):
                return
            schema = postgres.translate_schema(SCHEMA) if self.is_postgres else SCHEMA
            for stmt in schema.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            conn.execute("INSERT INTO kfc_schema(version, created_utc) VALUES (?, ?)", (SCHEMA_VERSION, now_utc()))
            if not self.is_postgres:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")

    def _require(self, table: str, row_id: int | None, what: str) -> None:
        if row_id is None:
            return
        if isinstance(row_id, bool) or not isinstance(row_id, numbers.Integral):
            raise KfcError(f"{what} must be an integer id, not {row_id!r}")
        if self.conn.execute(f"SELECT 1 FROM {table} WHERE id = ?", (int(row_id),)).fetchone() is None:
            raise KfcError(f"no {what} {row_id} in the knowledge base {self.path}")


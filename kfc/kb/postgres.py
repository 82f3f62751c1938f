"""A PostgreSQL knowledge base for a team: the part of sqlite3's connection the store uses,
over psycopg, so kfc.kb.store speaks one SQL to both.

    KnowledgeBase("postgresql://user:pass@host/kfc")     # instead of a file path

The store's SQL is SQLite's; this module rewrites what PostgreSQL spells differently: `?`
parameters, `INSERT OR IGNORE` / `INSERT OR REPLACE`, ids returned by inserts (RETURNING, as
`lastrowid`), and the schema's types (BIGSERIAL ids, BIGINT integers, DOUBLE PRECISION reals).
`BEGIN IMMEDIATE` takes a transaction-scoped advisory lock, so writers take turns as they do on
an SQLite file. psycopg is an optional dependency (`pip install 'kfc[cluster]'`).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from ..diagnostics import KfcError

URL_SCHEMES = ("postgresql://", "postgres://")
# tables whose inserts return the new row's id; the primary key an upsert replaces by
_ID_TABLES = {"ops", "runs", "candidates", "lessons"}
_PRIMARY_KEY = {"outcomes": "candidate_id", "ops": "id", "runs": "id", "candidates": "id", "lessons": "id"}
WRITE_LOCK = 0x6B666362  # the advisory lock writers take ("kfcb", as the SQLite application id)

_INSERT = re.compile(r"^\s*INSERT\s+(?:OR\s+(IGNORE|REPLACE)\s+)?INTO\s+(\w+)\s*\(([^)]*)\)", re.I | re.S)


def is_url(text) -> bool:
    return isinstance(text, str) and text.startswith(URL_SCHEMES)


def redacted(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


def translate(sql: str) -> tuple[str, bool]:
    """SQLite's statement in PostgreSQL's words, and whether it returns the new row's id."""
    text = sql.replace("?", "%s")
    m = _INSERT.match(text)
    if not m:
        return text, False
    verb, table, columns = (m.group(1) or "").upper(), m.group(2), m.group(3)
    text = text[:m.start()] + f"INSERT INTO {table}({columns})" + text[m.end():]
    if verb == "IGNORE":
        text += " ON CONFLICT DO NOTHING"
    elif verb == "REPLACE":
        key = _PRIMARY_KEY[table]
        cols = [c.strip() for c in columns.split(",") if c.strip() != key]
        text += f" ON CONFLICT ({key}) DO UPDATE SET " + ", ".join(f"{c} = EXCLUDED.{c}" for c in cols)
    returns = table in _ID_TABLES
    if returns:
        text += " RETURNING id"
    return text, returns


def translate_schema(ddl: str) -> str:
    ddl = re.sub(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b", "BIGSERIAL PRIMARY KEY", ddl)
    ddl = re.sub(r"\bINTEGER\b", "BIGINT", ddl)
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", ddl)


class Row(tuple):
    """A result row read by position or by column name, as sqlite3.Row is."""

    names: tuple[str, ...] = ()

    def __getitem__(self, key):
        if isinstance(key, str):
            try:
                return tuple.__getitem__(self, self.names.index(key))
            except ValueError:
                raise IndexError(f"no column {key!r}") from None
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self.names)


def _row_factory(cursor):
    names = tuple(c.name for c in cursor.description or ())

    def make(values):
        row = Row(values)
        row.names = names
        return row

    return make


class _Cursor:
    def __init__(self, cursor, returns_id: bool) -> None:
        self._cursor = cursor
        self.lastrowid = None
        self._first = None
        if returns_id:
            self._first = cursor.fetchone()
            self.lastrowid = self._first[0] if self._first is not None else None

    def fetchone(self):
        if self._first is not None:
            row, self._first = self._first, None
            return row
        return self._cursor.fetchone() if self._cursor.description else None

    def fetchall(self):
        return list(self)

    def __iter__(self):
        if self._first is not None:
            yield self.fetchone()
        if self._cursor.description:
            yield from self._cursor


def _psycopg():
    try:
        import psycopg  # lazy: psycopg, an optional extra (kfc[cluster])
    except ImportError:
        raise KfcError("a PostgreSQL knowledge base needs psycopg, which is not installed",
                       hint="pip install 'kfc[cluster]' (or psycopg[binary]); SQLite files need nothing") from None
    return psycopg


class Connection:
    """What kfc.kb.store calls on a connection, for a PostgreSQL server."""

    def __init__(self, url: str, timeout_s: float) -> None:
        psycopg = _psycopg()
        self.Error = psycopg.Error
        self.url = url
        try:
            self._conn = psycopg.connect(url, autocommit=True, row_factory=_row_factory, connect_timeout=int(timeout_s))
        except psycopg.Error as e:
            raise KfcError(f"cannot connect to the knowledge base {redacted(url)}: {str(e).strip()}",
                           hint="check the server, the database name and the credentials in the URL") from None
        self._conn.execute(f"SET lock_timeout = '{int(timeout_s)}s'")
        self._psycopg = psycopg

    def execute(self, sql: str, params=()):
        if re.match(r"^\s*BEGIN\s+IMMEDIATE\s*$", sql, re.I):
            self._conn.execute("BEGIN")
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
            return _Cursor(self._conn.cursor(), False)
        text, returns = translate(sql)
        return _Cursor(self._conn.execute(text, tuple(params)), returns)

    @property
    def in_transaction(self) -> bool:
        return self._conn.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE

    def tables(self) -> set[str]:
        return {r[0] for r in self._conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}

    def close(self) -> None:
        self._conn.close()

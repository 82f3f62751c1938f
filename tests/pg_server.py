"""A real PostgreSQL server for the knowledge-base tests, started by the tests themselves from
the `pgserver` wheel (kfc[test]); each test gets a database of its own."""

import uuid

import pytest


def start(tmp_dir):
    """The server, or a skip that names why none can run here."""
    try:
        import pgserver
        import psycopg  # noqa: F401 - the driver the knowledge base uses
    except ImportError as e:
        pytest.skip(f"no PostgreSQL for the knowledge-base tests: {e.name} is not installed "
                    "(pip install -e '.[test]' installs pgserver and psycopg)")
    try:
        return pgserver.get_server(str(tmp_dir), cleanup_mode="stop")
    except Exception as e:  # noqa: BLE001 - any failure to start is the reason for the skip
        pytest.skip(f"no PostgreSQL for the knowledge-base tests: the server did not start: {e}")


def fresh_database(server) -> str:
    """The URL of a new, empty database on the server."""
    import psycopg

    name = f"kfc_{uuid.uuid4().hex[:12]}"
    base = server.get_uri()
    with psycopg.connect(base, autocommit=True) as c:
        c.execute(f"CREATE DATABASE {name}")
    head, sep, query = base.partition("?")
    return head.rsplit("/", 1)[0] + "/" + name + (sep + query if sep else "")

"""Shared pytest fixtures. Keep them generic: any room's tests may use them (add yours below).

Databases:
* `sqlite_url`   — a fresh SQLite file in the test's tmp dir.
* `postgres_url` — a fresh schema in a database created for this test session on the server at
  `KBRL_TEST_POSTGRES_URL` (default: the local server); the database is dropped at the end. Tests using
  it are skipped, with the reason, when the server cannot be reached.
* `db_url`       — both of the above in turn (the PostgreSQL case is marked `postgres`).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

DEFAULT_POSTGRES_URL = "postgresql+psycopg://root@127.0.0.1:5432/test"


def _postgres_admin_url() -> URL:
    url = make_url(os.environ.get("KBRL_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[URL]:
    """URL of a database private to this test session (created, and dropped afterwards).

    Falls back to a private schema in the configured database when the role may not create databases.
    """
    admin = _postgres_admin_url()
    shown = admin.render_as_string(hide_password=True)
    engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except Exception as exc:  # any failure to connect means "no server here"
        engine.dispose()
        pytest.skip(f"PostgreSQL not reachable at {shown} (set KBRL_TEST_POSTGRES_URL): {exc.__class__.__name__}")
    name = f"kbrl_test_{os.getpid()}_{secrets.token_hex(3)}"
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.DBAPIError:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
        try:
            yield admin.update_query_dict({"options": f"-csearch_path={name}"})
        finally:
            with engine.connect() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')
            engine.dispose()
        return
    try:
        yield admin.set(database=name)
    finally:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        engine.dispose()


@pytest.fixture
def postgres_url(postgres_server: URL) -> str:
    """A fresh, empty schema (first on the search_path) for one test, as a URL string."""
    schema = f"t_{secrets.token_hex(6)}"
    engine = sa.create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    finally:
        engine.dispose()
    return postgres_server.update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
        hide_password=False
    )


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A fresh SQLite database file (not yet created) in the test's tmp dir."""
    return f"sqlite:///{tmp_path / 'kbrl.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request) -> str:
    """Each supported store backend in turn: a fresh SQLite file, then a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("postgres_url")

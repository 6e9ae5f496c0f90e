"""Engines and write transactions for SQLite and PostgreSQL, with the locking the event store relies on.

Two guarantees live here rather than in the store:

* One writer at a time. SQLite takes its write lock up front (`BEGIN IMMEDIATE`) instead of upgrading a
  read transaction later, which in WAL mode fails at once with SQLITE_BUSY instead of waiting.
  PostgreSQL takes a transaction-scoped advisory lock, so appending transactions run and commit one after
  the other: an identity value handed out earlier can never commit after one handed out later, and a
  follower that reads `position > last` cannot skip an event that commits late.
* Safe process start. Schema migrations run inside the same kind of locked transaction, so several
  processes starting on a fresh database migrate it exactly once.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pydantic_core import from_json
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.pool import StaticPool

from kbrl import settings

APPEND_LOCK_ID = 0x6B62_726C_0000_0001
"""pg_advisory_xact_lock key taken by every appending transaction (b"kbrl" + 1)."""
MIGRATE_LOCK_ID = 0x6B62_726C_0000_0002
"""pg_advisory_xact_lock key taken while migrating."""



SQLITE_BUSY_TIMEOUT_S = 60.0
SQLITE_MMAP_BYTES = 1 << 32
"""Read the database through mmap (SQLite caps this at its compile-time limit, 2 GiB by default): replay
reads every page, and mmap saves a pread syscall and a copy per page (~10% of replay time)."""
"""How long a SQLite writer waits for another process's write transaction before giving up."""

_json_dumps = functools.partial(json.dumps, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""For SQLAlchemy's JSON columns outside the hot path (payloads arrive already serialised by pydantic)."""


def _json_loads(data: str | bytes) -> Any:
    """psycopg parses JSONB with this: pydantic-core's parser, 2-4x faster than `json.loads`."""
    return from_json(data, cache_strings="keys")


def resolve_url(url: str | URL | None = None) -> URL:
    """The store URL: explicit, else `KBRL_DATABASE_URL`, else SQLite in the working directory.

    `postgresql://` and `postgres://` mean psycopg 3, the driver kbrl depends on (SQLAlchemy's default
    would be psycopg2, which is not installed).
    """
    parsed = make_url(url if url is not None else settings.database_url())
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def is_sqlite(url: URL) -> bool:
    """True for any SQLite URL (file or memory)."""
    return url.get_backend_name() == "sqlite"


def is_memory_sqlite(url: URL) -> bool:
    """True for `sqlite://` and `sqlite:///:memory:`: one private database per engine."""
    return is_sqlite(url) and url.database in (None, "", ":memory:")


def redact(url: str | URL | None) -> str:
    """The URL with its password hidden, for messages."""
    return resolve_url(url).render_as_string(hide_password=True)


def make_engine(url: str | URL | None = None, **kwargs: Any) -> Engine:
    """An engine configured for the event store (WAL and explicit transactions on SQLite)."""
    parsed = resolve_url(url)
    if is_sqlite(parsed):
        return _sqlite_engine(parsed, **kwargs)
    kwargs.setdefault("pool_pre_ping", True)
    engine = sa.create_engine(parsed, json_serializer=_json_dumps, json_deserializer=_json_loads, **kwargs)
    if engine.dialect.name == "postgresql":
        event.listen(engine, "connect", _postgres_utc)
    return engine


def _postgres_utc(dbapi_conn: Any, _record: Any) -> None:
    """Timestamps come back in UTC whatever the server's TimeZone (SET is transactional: commit it)."""
    with dbapi_conn.cursor() as cur:
        cur.execute("SET TIME ZONE 'UTC'")
    dbapi_conn.commit()


def _enable_wal(cur: Any) -> None:
    """`PRAGMA journal_mode = WAL`, retried: on a new file, processes starting together (workers, a
    trainer) race to switch the mode, and SQLite answers "database is locked" at once, without the busy
    handler, to every one but the first."""
    import sqlite3

    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _sqlite_engine(url: URL, **kwargs: Any) -> Engine:
    connect_args: dict[str, Any] = {
        # The driver must not open transactions on its own: we emit BEGIN ourselves (see `_begin`).
        "isolation_level": None,
        "timeout": SQLITE_BUSY_TIMEOUT_S,
        "check_same_thread": False,
    }
    memory = is_memory_sqlite(url)
    if memory:
        kwargs.setdefault("poolclass", StaticPool)
    else:
        Path(url.database or "").expanduser().absolute().parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args=connect_args, json_serializer=_json_dumps, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
            if not memory:
                # WAL: readers never block the writer; NORMAL sync is durable across process crashes.
                _enable_wal(cur)
                cur.execute("PRAGMA synchronous = NORMAL")
                cur.execute(f"PRAGMA mmap_size = {SQLITE_MMAP_BYTES}")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql(conn.get_execution_options().get("kbrl_sqlite_begin", "BEGIN"))

    return engine


def writer(engine: Engine) -> Engine:
    """A view of `engine` whose transactions take SQLite's write lock at BEGIN (no-op elsewhere)."""
    if engine.dialect.name == "sqlite":
        return engine.execution_options(kbrl_sqlite_begin="BEGIN IMMEDIATE")
    return engine


@contextmanager
def write_transaction(engine: Engine, lock_id: int = APPEND_LOCK_ID) -> Iterator[Connection]:
    """One serialised write transaction: committed on success, rolled back on any error.

    `engine` should come from `writer()` so that SQLite locks at BEGIN; on PostgreSQL the advisory lock
    `lock_id` is held until commit.
    """
    with engine.connect() as conn:
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": lock_id})
            yield conn


def fork_safe(engine: Engine, pid: int) -> int:
    """Drop pooled connections inherited across fork (Celery prefork): returns the current pid."""
    now = os.getpid()
    if now != pid:
        engine.dispose(close=False)
    return now

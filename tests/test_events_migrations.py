"""Alembic migrations of the event store: from an empty database, concurrently, from any working directory,
through the `alembic` command line, and in agreement with the SQLModel tables."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from test_events_store import _run_processes

from kbrl.events import db, migrate
from kbrl.events import payloads as p
from kbrl.events.schema import TABLES, metadata
from kbrl.events.store import EventStore, NewEvent

REPO = Path(__file__).resolve().parent.parent


def _tables(url: str) -> set[str]:
    engine = db.make_engine(url)
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_head_constant_matches_the_scripts():
    assert migrate.HEAD_REVISION == migrate.head_revision(), (
        "a migration was added: set kbrl.events.migrate.HEAD_REVISION to its revision"
    )


def test_upgrade_from_empty_database(db_url):
    assert migrate.current_revision(db_url) is None
    assert _tables(db_url) == set()
    assert migrate.upgrade(db_url) == migrate.HEAD_REVISION
    assert migrate.current_revision(db_url) == migrate.HEAD_REVISION
    assert {"events", "blobs", "alembic_version"} <= _tables(db_url)
    assert migrate.upgrade(db_url) == migrate.HEAD_REVISION  # idempotent


def test_migration_matches_the_models(db_url):
    """Autogenerate finds nothing to do: the hand-written migration and schema.py agree."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    migrate.upgrade(db_url)
    engine = db.make_engine(db_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn,
                opts={
                    "compare_type": True,
                    "include_name": lambda name, kind, _parent: kind != "table" or name in TABLES,
                },
            )
            diff = compare_metadata(ctx, metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_store_migrates_on_first_use(db_url):
    store = EventStore(db_url)
    assert migrate.current_revision(db_url) == migrate.HEAD_REVISION
    assert store.append([NewEvent("r", "s", "k", p.RunFinished(status="finished"))])[0].position == 1


def _start_store(url: str, i: int, start) -> int:
    start.wait()
    store = EventStore(url)  # all processes migrate the same empty database at once
    (event,) = store.append([NewEvent("r", "s", f"k{i}", p.RunFinished(status="finished"))])
    store.close()
    return event.position


def test_concurrent_first_use_migrates_once(db_url):
    positions = _run_processes(_start_store, [(db_url, i) for i in range(4)])
    assert sorted(positions) == [1, 2, 3, 4]
    assert migrate.current_revision(db_url) == migrate.HEAD_REVISION
    assert len(list(EventStore(db_url).read())) == 4


def test_upgrade_does_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    assert migrate.upgrade(url) == migrate.HEAD_REVISION
    assert migrate.script_location().resolve() == (REPO / "alembic").resolve()


def test_relative_sqlite_path_and_default_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KBRL_DATABASE_URL", raising=False)
    EventStore().append([NewEvent("r", "s", "k", p.RunFinished(status="finished"))])
    assert (tmp_path / "kbrl.db").is_file()
    monkeypatch.setenv("KBRL_DATABASE_URL", "sqlite:///nested/dir/x.db")
    assert migrate.upgrade() == migrate.HEAD_REVISION
    assert (tmp_path / "nested" / "dir" / "x.db").is_file()


def test_database_from_a_newer_kbrl_is_refused(sqlite_url):
    migrate.upgrade(sqlite_url)
    engine = db.make_engine(sqlite_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999_future'")
    engine.dispose()
    with pytest.raises(migrate.MigrationError, match="9999_future.*upgrade kbrl"):
        EventStore(sqlite_url)


def test_alembic_command_line(tmp_path):
    """`alembic -c alembic/alembic.ini -x url=… upgrade head` works from the repo root."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    env = {k: v for k, v in os.environ.items() if k != "KBRL_DATABASE_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", "alembic/alembic.ini", "-x", f"url={url}", "upgrade", "head"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert migrate.current_revision(url) == migrate.HEAD_REVISION
    assert "Running upgrade" in proc.stderr


def test_downgrade_is_refused(sqlite_url):
    from alembic import command

    migrate.upgrade(sqlite_url)
    with pytest.raises(NotImplementedError, match="append-only"):
        command.downgrade(migrate.alembic_config(sqlite_url), "base")
    assert migrate.current_revision(sqlite_url) == migrate.HEAD_REVISION

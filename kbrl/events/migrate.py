"""Apply the Alembic migrations of the event store programmatically, from a repo or an installed package.

`upgrade()` works from any working directory: it finds the migration scripts inside the package
(`kbrl/events/migrations`, a symlink to the repository's `alembic/` that wheels store as real files, so
an installed kbrl carries its migrations) or at the repository root (`alembic/`, should the symlink be
missing, e.g. in a checkout without symlinks), and runs them inside a locked write transaction
(see `kbrl.events.db`) so that concurrent starters migrate once.

Alembic is imported only when a migration has to run: every process that opens a store checks the
revision, and an up-to-date database (the usual case) costs one small query, not Alembic's import.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine

from kbrl.events import db

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

HEAD_REVISION = "0001"
"""The newest migration in alembic/versions/ (a test checks they agree): lets the fast path skip Alembic."""


class MigrationError(RuntimeError):
    """The database schema cannot be brought to (or is ahead of) this code's head revision."""


def script_location() -> Path:
    """The Alembic script directory: `KBRL_ALEMBIC_DIR`, the packaged copy, or the repo's `alembic/`."""
    here = Path(__file__).resolve().parent
    candidates = [
        Path(os.environ["KBRL_ALEMBIC_DIR"]) if os.environ.get("KBRL_ALEMBIC_DIR") else None,
        here / "migrations",  # symlink to ../../alembic; real files in a wheel
        here.parent.parent / "alembic",  # checkout / editable install
    ]
    for path in candidates:
        if path is not None and (path / "env.py").is_file() and (path / "versions").is_dir():
            return path
    raise MigrationError(f"no Alembic migrations found (looked in {[str(p) for p in candidates if p]})")


def alembic_config(url: str | URL | None = None, connection: Connection | None = None) -> Config:
    """An Alembic `Config` built in code (no alembic.ini); `connection` is reused by env.py if given."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    rendered = db.resolve_url(url).render_as_string(hide_password=False)
    cfg.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


@functools.cache
def scripts() -> ScriptDirectory:
    """The migration scripts (parsed once per process)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(script_location()))


def head_revision() -> str:
    """The newest revision among the migration scripts."""
    heads = scripts().get_heads()
    if len(heads) != 1:
        raise MigrationError(f"expected one migration head, found {heads}")
    return heads[0]


def current_revision(url: str | URL | None = None, engine: Engine | None = None) -> str | None:
    """The revision the database is at, or None for an empty (never migrated) database."""
    own = engine is None
    engine = engine or db.make_engine(url)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table("alembic_version"):
                return None
            return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    finally:
        if own:
            engine.dispose()


def upgrade_engine(engine: Engine) -> str:
    """Bring the database behind `engine` to head; one query when it is already there."""
    current = current_revision(engine=engine)
    if current == HEAD_REVISION:
        return HEAD_REVISION
    from alembic import command

    head = head_revision()
    known = {rev.revision for rev in scripts().walk_revisions()}
    if current is not None and current not in known:
        raise MigrationError(
            f"database {db.redact(engine.url)} is at revision {current!r}, unknown to this kbrl "
            f"(head {head!r}): it was migrated by a newer version; upgrade kbrl"
        )
    with db.write_transaction(db.writer(engine), db.MIGRATE_LOCK_ID) as conn:
        command.upgrade(alembic_config(engine.url, connection=conn), "head")
    return head


def upgrade(url: str | URL | None = None) -> str:
    """Apply all pending migrations to the store at `url` (default: `KBRL_DATABASE_URL`); returns head."""
    engine = db.make_engine(url)
    try:
        return upgrade_engine(engine)
    finally:
        engine.dispose()

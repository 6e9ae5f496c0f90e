"""Alembic environment for the kbrl event store.

Normally run through `kbrl.events.migrate.upgrade()` (and `kbrl db upgrade`), which passes an open,
locked connection in `config.attributes["connection"]`. Run from the `alembic` command line
(`alembic -c alembic/alembic.ini upgrade head`, URL from `-x url=…`, `sqlalchemy.url` or
`KBRL_DATABASE_URL`) it takes the same lock itself.
"""

from __future__ import annotations

from logging.config import fileConfig

from sqlalchemy.engine import Connection

from alembic import context
from kbrl.events import db
from kbrl.events.schema import metadata

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite ALTERs need table rebuilds
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str | None:
    return context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option("sqlalchemy.url")


if context.is_offline_mode():
    context.configure(url=str(db.resolve_url(_url())), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif config.attributes.get("connection") is not None:
    _run(config.attributes["connection"])
else:
    if config.config_file_name:
        fileConfig(config.config_file_name)
    engine = db.make_engine(_url())
    try:
        with db.write_transaction(db.writer(engine), db.MIGRATE_LOCK_ID) as conn:
            _run(conn)
    finally:
        engine.dispose()

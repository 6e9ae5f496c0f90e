"""Initial event store: the append-only `events` log and content-addressed `blobs`.

Revision ID: 0001
Revises:
Create Date: 2025-11-23

Triggers refuse UPDATE, DELETE (and TRUNCATE on PostgreSQL) on both tables: the log is append-only by
design, and the database enforces it for any client, not just kbrl's code.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("events", "blobs")


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column(
            "position",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("stream", sa.String(), nullable=False),
        sa.Column("type", sa.String(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("payload", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("key", name="uq_events_key"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_events_run_id_position", "events", ["run_id", "position"])
    op.create_index("ix_events_stream_position", "events", ["stream", "position"])
    op.create_index("ix_events_type", "events", ["type"])
    op.create_table(
        "blobs",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )

    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            """
            CREATE FUNCTION kbrl_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION 'kbrl: table % is append-only (% refused)', TG_TABLE_NAME, TG_OP;
            END
            $$
            """
        )
        for table in TABLES:
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION kbrl_append_only()"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION kbrl_append_only()"
            )
    else:
        for table in TABLES:
            for verb in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, 'kbrl: table {table} is append-only ({verb} refused)'); END"
                )


def downgrade() -> None:
    raise NotImplementedError(
        "the event log is append-only and has no downgrade; restore a backup or start a new database"
    )

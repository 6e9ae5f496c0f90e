"""SQL tables of the event store: the append-only `events` log and content-addressed `blobs`.

These SQLModel classes are the source of truth for Alembic (`alembic/env.py` compares against
`metadata`); the migration in `alembic/versions/` is a frozen copy that a test keeps in sync. The store's
hot paths use the Core `Table` objects (`events`, `blobs`) directly, never ORM instances per row.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlmodel import Field, SQLModel

# INTEGER PRIMARY KEY is SQLite's rowid (fast, strictly increasing with AUTOINCREMENT);
# PostgreSQL gets a 64-bit identity so a long-lived store never runs out of positions.
PositionType = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
PayloadType = sa.JSON().with_variant(JSONB(), "postgresql")


class EventRow(SQLModel, table=True):
    """One immutable fact. `position` orders everything; `key` makes appends idempotent."""

    __tablename__ = "events"  # type: ignore[assignment]
    __table_args__ = (
        sa.Index("ix_events_run_id_position", "run_id", "position"),
        sa.Index("ix_events_stream_position", "stream", "position"),
        sa.Index("ix_events_type", "type"),
        {"sqlite_autoincrement": True},
    )

    position: int | None = Field(
        default=None,
        sa_column=sa.Column("position", PositionType, primary_key=True, autoincrement=True),
    )
    run_id: str = Field(sa_column=sa.Column("run_id", sa.String(), nullable=False))
    stream: str = Field(sa_column=sa.Column("stream", sa.String(), nullable=False))
    type: str = Field(sa_column=sa.Column("type", sa.String(), nullable=False))
    version: int = Field(sa_column=sa.Column("version", sa.Integer(), nullable=False))
    key: str = Field(sa_column=sa.Column("key", sa.String(), nullable=False))
    payload: dict[str, Any] = Field(sa_column=sa.Column("payload", PayloadType, nullable=False))
    created_at: datetime = Field(sa_column=sa.Column("created_at", sa.DateTime(timezone=True), nullable=False))


# A named constraint (not `unique=True`) so the migration and the model agree on its name.
EventRow.__table__.append_constraint(sa.UniqueConstraint("key", name="uq_events_key"))  # type: ignore[attr-defined]


class BlobRow(SQLModel, table=True):
    """Large payload bytes (token ids, logprobs, sources) stored once, addressed by their sha256."""

    __tablename__ = "blobs"  # type: ignore[assignment]

    hash: str = Field(sa_column=sa.Column("hash", sa.String(64), primary_key=True))
    data: bytes = Field(sa_column=sa.Column("data", sa.LargeBinary(), nullable=False))
    size: int = Field(sa_column=sa.Column("size", sa.BigInteger(), nullable=False))
    created_at: datetime = Field(sa_column=sa.Column("created_at", sa.DateTime(timezone=True), nullable=False))


events: sa.Table = EventRow.__table__  # type: ignore[attr-defined]
blobs: sa.Table = BlobRow.__table__  # type: ignore[attr-defined]
metadata: sa.MetaData = SQLModel.metadata
"""Shared SQLModel metadata; other rooms' tables (if any) land here too, so compare only ours."""

TABLES = ("events", "blobs")

"""The append-only event store: append (idempotent, validated, one transaction), read, follow, blobs, runs.

Everything else in kbrl (trajectories, rewards, metrics, dashboards) is derived from what is written
here, so the store promises:

* positions are global and strictly increasing, and the events of one `append` get consecutive
  positions in the order given;
* an event is visible to readers only together with every event of lower position, so a follower
  reading `position > last` never skips one (appends are serialised, see `kbrl.events.db`);
* appending a key that exists is a no-op returning the stored event (retries never double count);
* nothing is ever updated or deleted (there is no code path for it, and triggers refuse it).

Hot paths stay lean: validation and JSON encoding happen in pydantic's Rust core before the write
lock is taken (a payload validated at construction is re-checked by the type-checking serializer, one
built without validation is validated in full); inserts are one DBAPI `executemany` of plain tuples (no
per-row SQLAlchemy processing); reads fetch plain tuples and decode JSON with pydantic-core's parser
(2-3x faster than `json.loads`) straight into `Event` named tuples.
"""

from __future__ import annotations

import gc
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

import sqlalchemy as sa
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError
from pydantic_core import from_json as _from_json
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, Connection, Engine

from kbrl.events import db, migrate
from kbrl.events.payloads import (
    REGISTRY,
    EvalRunFinished,
    EvalRunStarted,
    EventPayload,
    RunFinished,
    RunStarted,
    is_validated,
    parse_payload,
)
from kbrl.events.schema import blobs, events

READ_CHUNK = 5_000
"""Rows fetched per query by `read`: large enough to amortise the round trip, small enough to stream."""
KEY_LOOKUP_CHUNK = 5_000
"""Keys per `IN (...)` lookup while appending (below every backend's bind-parameter limit)."""


class InvalidEvent(ValueError):
    """An event of an `append` batch failed validation; nothing of the batch was written."""

    def __init__(
        self,
        message: str,
        *,
        index: int,
        key: str | None = None,
        event_type: str | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        where = f"event #{index}"
        if key is not None:
            where += f" (key={key!r}"
            where += f", type={event_type!r})" if event_type else ")"
        elif event_type:
            where += f" (type={event_type!r})"
        super().__init__(f"{where}: {message}")
        self.index = index
        self.key = key
        self.event_type = event_type
        self.errors = errors or []


class BlobNotFound(KeyError):
    """No blob with this hash."""


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. `payload` is a typed model (its class gives type and version), or a plain
    mapping together with `type` (for events that arrive as JSON, e.g. from a queue)."""

    run_id: str
    stream: str
    key: str
    payload: EventPayload | Mapping[str, Any]
    type: str | None = None


class Event(NamedTuple):
    """A stored event: a light immutable record (a named tuple, so replaying millions stays cheap)."""

    position: int
    run_id: str
    stream: str
    type: str
    version: int
    key: str
    payload: dict[str, Any]
    created_at: datetime

    def parse(self) -> EventPayload:
        """The payload as its typed model (older versions upcast first)."""
        return parse_payload(self.type, self.version, self.payload)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for `kbrl replay --json`, APIs)."""
        data = self._asdict()
        data["created_at"] = self.created_at.isoformat()
        return data


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What `kbrl runs` shows about one run, derived from its events."""

    run_id: str
    kind: str
    """"train" (RunStarted), "eval:<kind>" (EvalRunStarted) or "unknown" (no start event)."""
    status: str
    """"running" until a RunFinished/EvalRunFinished, then its status (finished, failed, …); "unknown"
    when the run has neither a start nor an end event."""
    started_at: datetime
    last_event_at: datetime
    n_events: int
    first_position: int
    last_position: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "run_id": self.run_id,
            "kind": self.kind,
            "status": self.status,
            "started_at": self.started_at.isoformat(),
            "last_event_at": self.last_event_at.isoformat(),
            "n_events": self.n_events,
            "first_position": self.first_position,
            "last_position": self.last_position,
        }


class _Prepared(NamedTuple):
    run_id: str
    stream: str
    type: str
    version: int
    key: str
    text: str
    data: dict[str, Any]


_RAW = sa.types.NullType()
"""Column type without SQLAlchemy result processing (we decode JSON / timestamps ourselves)."""

_COLUMNS = 'position, run_id, stream, type, version, "key", payload, created_at'
_SQLITE_TS = "%Y-%m-%d %H:%M:%S.%f"
"""How SQLAlchemy's SQLite DateTime stores timestamps (naive UTC); we write the same text directly."""


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while decoding a chunk: it allocates ~30 acyclic objects per event, and
    collections triggered by them (over everything the caller holds) would double the decode time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def from_json(data: str | bytes) -> Any:
    """Parse JSON with pydantic-core (2-3x faster than `json.loads`); only keys are interned, since
    caching every value string costs more than it saves on long unique texts."""
    return _from_json(data, cache_strings="keys")


def _type_names(types: Iterable[str | type[EventPayload]] | None) -> list[str] | None:
    if types is None:
        return None
    return [t if isinstance(t, str) else t.event_type for t in types]


class EventStore:
    """The event store at `url` (default `KBRL_DATABASE_URL`, else `sqlite:///./kbrl.db`).

    Migrations are applied on construction (once per database, safely under concurrency) unless
    `auto_migrate=False`. Thread-safe; fork-safe (a forked child opens its own connections).
    """

    def __init__(self, url: str | URL | None = None, *, auto_migrate: bool = True) -> None:
        self.url: URL = db.resolve_url(url)
        self._engine: Engine = db.make_engine(self.url)
        self._writer: Engine = db.writer(self._engine)
        self._sqlite = self._engine.dialect.name == "sqlite"
        self._pid = os.getpid()
        self._mark = "?" if self._sqlite else "%s"
        m = self._mark
        payload_mark = m if self._sqlite else f"CAST({m} AS jsonb)"
        self._insert_sql = f"INSERT INTO events ({_COLUMNS}) VALUES ({m}, {m}, {m}, {m}, {m}, {m}, {payload_mark}, {m})"
        if auto_migrate:
            migrate.upgrade_engine(self._engine)

    def __repr__(self) -> str:
        return f"EventStore({db.redact(self.url)!r})"

    def close(self) -> None:
        """Close pooled connections (the store can still be used; it reconnects)."""
        self._engine.dispose()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine, for read-only projections that need their own SQL."""
        self._pid = db.fork_safe(self._engine, self._pid)
        return self._engine

    # --- append ------------------------------------------------------------------------------------------

    def append(self, events_: Iterable[NewEvent]) -> list[Event]:
        """Append a batch in one transaction; returns the stored event for each input, in order.

        A key that is already stored (or repeated within the batch) yields the existing event and writes
        nothing. Every event is validated first: one bad event raises `InvalidEvent` and nothing of the
        batch is written.
        """
        batch = list(events_)
        if not batch:
            return []
        with _gc_paused():
            prepared = [_prepare(i, e) for i, e in enumerate(batch)]
        unique: dict[str, _Prepared] = {}
        for p in prepared:
            unique.setdefault(p.key, p)
        self._pid = db.fork_safe(self._engine, self._pid)
        with db.write_transaction(self._writer) as conn:
            stored = self._by_keys(conn, list(unique))
            new = [p for key, p in unique.items() if key not in stored]
            if new:
                # Under the write lock the stored maximum is final: a batch gets consecutive positions,
                # in input order, above everything committed before it.
                last = conn.exec_driver_sql("SELECT COALESCE(MAX(position), 0) FROM events").scalar_one()
                created_at = datetime.now(UTC)
                ts: Any = created_at.strftime(_SQLITE_TS) if self._sqlite else created_at
                rows = [
                    (last + i, p.run_id, p.stream, p.type, p.version, p.key, p.text, ts)
                    for i, p in enumerate(new, start=1)
                ]
                conn.exec_driver_sql(self._insert_sql, rows)
                for (position, *_), p in zip(rows, new, strict=True):
                    stored[p.key] = Event(position, p.run_id, p.stream, p.type, p.version, p.key, p.data, created_at)
        return [stored[p.key] for p in prepared]

    def append_one(self, event: NewEvent) -> Event:
        """Append a single event (see `append`)."""
        return self.append([event])[0]

    def get(self, key: str) -> Event | None:
        """The event stored under idempotency `key`, or None (lets a redelivered job skip its work)."""
        with self.engine.connect() as conn:
            return self._by_keys(conn, [key]).get(key)

    def count(self, run_id: str, types: Iterable[str | type[EventPayload]] | None = None) -> int:
        """How many events `run_id` holds (of `types`): progress checks without reading payloads."""
        stmt = sa.select(sa.func.count()).select_from(events).where(events.c.run_id == run_id)
        names = _type_names(types)
        if names:
            stmt = stmt.where(events.c.type.in_(names))
        with self.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def latest_per_stream(self, run_id: str) -> list[Event]:
        """The last event of each stream of `run_id` (e.g. each worker's latest heartbeat)."""
        last = (
            sa.select(sa.func.max(events.c.position))
            .where(events.c.run_id == run_id)
            .group_by(events.c.stream)
            .scalar_subquery()
        )
        stmt = sa.select(events.c.position).where(events.c.position.in_(last))
        with self.engine.connect() as conn:
            positions = [int(p) for p in conn.execute(stmt).scalars()]
            if not positions:
                return []
            marks = ", ".join([self._mark] * len(positions))
            rows = conn.exec_driver_sql(f"SELECT {_COLUMNS} FROM events WHERE position IN ({marks}) ORDER BY position",
                                        tuple(positions)).all()  # fmt: skip
        return self._decode(rows)

    def _by_keys(self, conn: Connection, keys: list[str]) -> dict[str, Event]:
        found: dict[str, Event] = {}
        for start in range(0, len(keys), KEY_LOOKUP_CHUNK):
            chunk = keys[start : start + KEY_LOOKUP_CHUNK]
            marks = ", ".join([self._mark] * len(chunk))
            rows = conn.exec_driver_sql(f'SELECT {_COLUMNS} FROM events WHERE "key" IN ({marks})', tuple(chunk)).all()
            for ev in self._decode(rows):
                found[ev.key] = ev
        return found

    # --- read --------------------------------------------------------------------------------------------

    def read(
        self,
        run_id: str | None = None,
        stream: str | None = None,
        after: int = 0,
        types: Iterable[str | type[EventPayload]] | None = None,
        limit: int | None = None,
        *,
        upto: int | None = None,
        chunk_size: int = READ_CHUNK,
    ) -> Iterator[Event]:
        """Events with `after < position <= upto` matching the filters, in position order.

        Reads in keyset-paginated chunks, each in its own short transaction, so a long replay holds no
        lock or snapshot and an abandoned iterator holds no connection.
        """
        names = _type_names(types)
        remaining = limit
        last = after
        while remaining is None or remaining > 0:
            size = chunk_size if remaining is None else min(chunk_size, remaining)
            sql, params = self._select_sql(run_id, stream, names, upto, size)
            with _gc_paused():
                chunk = self._query_events(sql, (last, *params), force_index=run_id is not None or stream is not None)
            if not chunk:
                return
            yield from chunk
            last = chunk[-1].position
            if remaining is not None:
                remaining -= len(chunk)
            if len(chunk) < size:
                return

    def follow(
        self,
        run_id: str | None = None,
        stream: str | None = None,
        after: int = 0,
        types: Iterable[str | type[EventPayload]] | None = None,
        poll_interval: float = 0.2,
        stop: Callable[[], bool] | None = None,
        timeout: float | None = None,
    ) -> Iterator[Event]:
        """Yield matching events as they are appended, each exactly once and in order.

        Polls every `poll_interval` seconds once caught up. Ends when `stop()` returns true (checked
        whenever caught up) or `timeout` seconds after the call; otherwise runs until the caller stops
        iterating.
        """
        names = _type_names(types)
        deadline = None if timeout is None else time.monotonic() + timeout
        last = after
        while True:
            # Everything at or below the current maximum is committed (appends commit in position
            # order), so once it has been read the next poll can start above it: a filter that matches
            # rarely does not make every poll rescan the non-matching tail.
            high = self.last_position()
            for ev in self.read(run_id=run_id, stream=stream, after=last, types=names, upto=high):
                last = ev.position
                yield ev
            last = max(last, high)
            if stop is not None and stop():
                return
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                time.sleep(min(poll_interval, left))
            else:
                time.sleep(poll_interval)

    def _select_sql(
        self, run_id: str | None, stream: str | None, names: list[str] | None, upto: int | None, size: int
    ) -> tuple[str, tuple[Any, ...]]:
        """SQL and parameters (after the leading `position > ?`) of one `read` chunk."""
        mark = self._mark
        where = [f"position > {mark}"]
        params: list[Any] = []
        if run_id is not None:
            where.append(f"run_id = {mark}")
            params.append(run_id)
        if stream is not None:
            where.append(f"stream = {mark}")
            params.append(stream)
        if names is not None:
            if not names:
                where.append("1 = 0")
            else:
                where.append(f"type IN ({', '.join([mark] * len(names))})")
                params.extend(names)
        if upto is not None:
            where.append(f"position <= {mark}")
            params.append(upto)
        params.append(size)
        return f"SELECT {_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY position LIMIT {mark}", tuple(params)

    def _query_events(self, sql: str, params: tuple[Any, ...], force_index: bool = False) -> list[Event]:
        """Run one query on a raw DBAPI cursor and decode each row as it comes (the replay hot path):
        plain tuples, no Row objects, and a row's JSON is parsed while it is still in the CPU cache."""
        with self.engine.connect() as conn:
            cur = conn.connection.cursor()
            try:
                if force_index and not self._sqlite:
                    # A page of one run (or stream) must come straight off its (run_id|stream, position)
                    # index. With statistics that lag the run's growth, PostgreSQL instead bitmap-scans
                    # the whole rest of the run and sorts it, for every page (25x slower at 100k events).
                    # These settings last until the end of this read's transaction.
                    cur.execute("SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off")
                cur.execute(sql, params)
                return self._decode_rows(cur)
            finally:
                cur.close()

    def last_position(self, run_id: str | None = None) -> int:
        """The highest position stored (for `run_id` if given), 0 when empty: `follow(after=…)` from now."""
        stmt = sa.select(sa.func.coalesce(sa.func.max(events.c.position), 0))
        if run_id is not None:
            stmt = stmt.where(events.c.run_id == run_id)
        with self.engine.connect() as conn:
            return int(conn.execute(stmt).scalar_one())

    def _decode(self, rows: Iterable[Any]) -> list[Event]:
        """Rows of `_COLUMNS` -> Events. SQLite gives JSON text and naive UTC timestamp strings."""
        with _gc_paused():
            return self._decode_rows(rows)

    def _decode_rows(self, rows: Iterable[Any]) -> list[Event]:
        new = tuple.__new__  # Event(...) without the Python-level __new__ of namedtuple: ~0.3 µs/row
        if not self._sqlite:  # psycopg already parsed the JSONB and the timestamptz
            return [
                new(Event, (pos, run, stream, typ, ver, key, p if isinstance(p, dict) else from_json(p), ts))
                for pos, run, stream, typ, ver, key, p, ts in rows
            ]
        loads = _from_json  # called with the keyword directly: a functools.partial costs ~1.5 µs/row here
        parse_ts = datetime.fromisoformat
        out: list[Event] = []
        append = out.append
        last_raw: Any = None
        last_ts: datetime | None = None
        for pos, run, stream, typ, ver, key, payload, raw in rows:
            if raw != last_raw:  # events of one batch share a timestamp: parse it once
                last_raw = raw
                last_ts = parse_ts(raw).replace(tzinfo=UTC)
            append(new(Event, (pos, run, stream, typ, ver, key, loads(payload, cache_strings="keys"), last_ts)))
        return out

    # --- blobs -------------------------------------------------------------------------------------------

    def put_blob(self, data: bytes) -> str:
        """Store `data` once under its sha256 hex digest and return the digest (idempotent)."""
        return self.put_blobs([data])[0]

    def put_blobs(self, datas: Sequence[bytes]) -> list[str]:
        """Store several blobs in one transaction; returns their hashes in order."""
        hashes = [hashlib.sha256(bytes(d)).hexdigest() for d in datas]
        todo = {h: bytes(d) for h, d in zip(hashes, datas, strict=True)}
        if not todo:
            return hashes
        self._pid = db.fork_safe(self._engine, self._pid)
        with self._writer.connect() as conn, conn.begin():
            have = set(conn.execute(sa.select(blobs.c.hash).where(blobs.c.hash.in_(list(todo)))).scalars())
            missing = [h for h in todo if h not in have]
            if missing:
                now = datetime.now(UTC)
                insert = (sqlite.insert if self._sqlite else postgresql.insert)(blobs).on_conflict_do_nothing()
                conn.execute(
                    insert,
                    [{"hash": h, "data": todo[h], "size": len(todo[h]), "created_at": now} for h in missing],
                )
        return hashes

    def get_blob(self, hash: str) -> bytes:
        """The bytes stored under `hash`; `BlobNotFound` (a KeyError) if there are none."""
        with self.engine.connect() as conn:
            data = conn.execute(sa.select(blobs.c.data).where(blobs.c.hash == hash)).scalar_one_or_none()
        if data is None:
            raise BlobNotFound(hash)
        return bytes(data)

    def has_blob(self, hash: str) -> bool:
        """Whether a blob with this hash is stored."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(blobs.c.hash).where(blobs.c.hash == hash)).first() is not None

    # --- runs --------------------------------------------------------------------------------------------

    def runs(self) -> list[RunInfo]:
        """Every run in the store with its status, folded from start/end events; oldest first."""
        stats = sa.select(
            events.c.run_id,
            sa.func.count(),
            sa.func.min(events.c.position),
            sa.func.max(events.c.position),
            sa.type_coerce(sa.func.min(events.c.created_at), _RAW),
            sa.type_coerce(sa.func.max(events.c.created_at), _RAW),
        ).group_by(events.c.run_id)
        lifecycle = [RunStarted, RunFinished, EvalRunStarted, EvalRunFinished]
        marks = (
            sa.select(events.c.run_id, events.c.type, sa.type_coerce(events.c.payload, _RAW))
            .where(events.c.type.in_([m.event_type for m in lifecycle]))
            .order_by(events.c.position)
        )
        with self.engine.connect() as conn:
            stat_rows = conn.execute(stats).all()
            mark_rows = conn.execute(marks).all()
        kind: dict[str, str] = {}
        status: dict[str, str] = {}
        for run_id, typ, payload in mark_rows:
            data = payload if isinstance(payload, dict) else from_json(payload)
            if typ == RunStarted.event_type:
                kind[run_id], status[run_id] = "train", "running"
            elif typ == EvalRunStarted.event_type:
                kind[run_id], status[run_id] = f"eval:{data.get('kind', '')}".rstrip(":"), "running"
            else:
                status[run_id] = str(data.get("status", "finished"))
        infos = [
            RunInfo(
                run_id=run_id,
                kind=kind.get(run_id, "unknown"),
                status=status.get(run_id, "unknown"),
                started_at=self._ts(first_at),
                last_event_at=self._ts(last_at),
                n_events=int(n),
                first_position=int(first),
                last_position=int(last),
            )
            for run_id, n, first, last, first_at, last_at in stat_rows
        ]
        return sorted(infos, key=lambda r: r.first_position)

    def has_run(self, run_id: str) -> bool:
        """Whether any event belongs to `run_id`."""
        with self.engine.connect() as conn:
            return conn.execute(sa.select(events.c.position).where(events.c.run_id == run_id).limit(1)).first() is not None

    def _ts(self, raw: Any) -> datetime:
        if isinstance(raw, datetime):
            return raw if raw.tzinfo is not None else raw.replace(tzinfo=UTC)
        return datetime.fromisoformat(raw).replace(tzinfo=UTC)


def _prepare(index: int, event: Any) -> _Prepared:
    """Validate one event fully and serialise its payload; raise `InvalidEvent` naming what is wrong.

    A typed payload was validated when it was built (pydantic) and is frozen, so serialising it with
    type-checking on is enough; one built with `model_construct()` or `model_copy(update=…)` was never
    validated, so its JSON is validated in full. A mapping payload is validated against `type`'s model.
    """
    if type(event) is not NewEvent and not isinstance(event, NewEvent):
        raise InvalidEvent(f"expected a NewEvent, got {type(event).__name__}", index=index)
    run_id, stream, key, payload = event.run_id, event.stream, event.key, event.payload
    if not (type(run_id) is str and run_id and type(stream) is str and stream and type(key) is str and key):
        for attr, value in (("run_id", run_id), ("stream", stream), ("key", key)):
            if not isinstance(value, str) or not value:
                raise InvalidEvent(
                    f"{attr} must be a non-empty string, got {value!r}",
                    index=index,
                    key=key if isinstance(key, str) else None,
                )
    model = type(payload)
    name: str = getattr(model, "event_type", "")
    if REGISTRY.get(name) is model and name:
        if event.type is not None and event.type != name:
            raise InvalidEvent(
                f"type {event.type!r} does not match the payload's type {name!r}", index=index, key=key, event_type=name
            )
        if is_validated(payload):
            # Validated at construction and frozen; only containers inside could have been mutated since,
            # and the serializer type-checks those as it goes ("error": a mismatch raises).
            try:
                text = payload.model_dump_json(warnings="error")
            except PydanticSerializationError as exc:
                raise InvalidEvent(
                    f"payload no longer matches {name}: {_serializer_problem(exc)}", index=index, key=key, event_type=name
                ) from exc
        else:
            try:
                text = payload.model_dump_json(warnings=False)
                model.__pydantic_validator__.validate_json(text)
            except PydanticSerializationError as exc:
                raise InvalidEvent(f"payload cannot be serialised: {exc}", index=index, key=key, event_type=name) from exc
            except ValidationError as exc:
                raise _invalid(exc, index, key, name) from exc
    elif isinstance(payload, EventPayload):
        raise InvalidEvent(
            f"payload class {model.__module__}.{model.__qualname__} is not a registered event type",
            index=index,
            key=key,
            event_type=name or None,
        )
    elif isinstance(payload, Mapping):
        name = event.type or ""
        model = REGISTRY.get(name)  # type: ignore[assignment]
        if model is None:
            known = ", ".join(sorted(REGISTRY))
            why = "a plain-dict payload needs type=" if not name else f"unknown event type {name!r}"
            raise InvalidEvent(f"{why} (registered: {known})", index=index, key=key, event_type=name or None)
        try:
            text = model.model_validate(dict(payload)).model_dump_json()
        except ValidationError as exc:
            raise _invalid(exc, index, key, name) from exc
    else:
        raise InvalidEvent(
            f"payload must be an EventPayload model or a mapping, got {model.__name__}", index=index, key=key
        )
    return _Prepared(run_id, stream, name, model.schema_version, key, text, from_json(text))


def _serializer_problem(exc: PydanticSerializationError) -> str:
    """The useful lines of a serializer error ("Expected `int` … [field_name='step', input_value=…]")."""
    lines = [line.strip() for line in str(exc).splitlines() if "Expected" in line or "Unable" in line]
    return "; ".join(lines) or str(exc)


def _invalid(exc: ValidationError, index: int, key: str | None, name: str) -> InvalidEvent:
    errors = exc.errors(include_url=False)
    parts = []
    for err in errors:
        field = ".".join(str(p) for p in err["loc"]) or "<payload>"
        detail = f"field {field!r}: {err['msg']}"
        if err["type"] != "missing":
            detail += f" (got {err['input']!r:.80})"
        parts.append(detail)
    return InvalidEvent(f"invalid {name} payload: " + "; ".join(parts), index=index, key=key, event_type=name, errors=errors)

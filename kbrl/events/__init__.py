"""Append-only event store: typed payloads, idempotent append, ordered read and follow, blobs, runs.

    from kbrl.events import EventStore, NewEvent, payloads as p
    store = EventStore()  # KBRL_DATABASE_URL, else sqlite:///./kbrl.db; migrates on first use
    store.append([NewEvent(run_id, "run", f"{run_id}/start", p.RunStarted(config=cfg, backend="tinker", model=m))])
    for event in store.read(run_id=run_id):
        payload = event.parse()

See DESIGN.md, "Events".
"""

from kbrl.events import payloads
from kbrl.events.migrate import MigrationError, upgrade
from kbrl.events.payloads import REGISTRY, EventPayload, UnknownEventType
from kbrl.events.store import BlobNotFound, Event, EventStore, InvalidEvent, NewEvent, RunInfo

__all__ = [
    "REGISTRY",
    "BlobNotFound",
    "Event",
    "EventPayload",
    "EventStore",
    "InvalidEvent",
    "MigrationError",
    "NewEvent",
    "RunInfo",
    "UnknownEventType",
    "payloads",
    "upgrade",
]

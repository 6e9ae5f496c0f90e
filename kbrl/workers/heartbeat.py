"""`WorkerHeartbeat` events: which workers are alive, on which GPU, and what each is doing.

Heartbeats go to the reserved run `_workers` (hidden from `kbrl runs`), one stream per worker. A beat is
written when a job starts and ends and every `KBRL_HEARTBEAT_S` seconds (default 15) in between, so
`kbrl status` can tell "queued, no worker alive" from "in flight on gpu0@host".
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import TYPE_CHECKING

from kbrl.events.payloads import WorkerHeartbeat
from kbrl.events.store import EventStore, NewEvent

if TYPE_CHECKING:
    from kbrl.workers.jobs import EvalJob

WORKERS_RUN = "_workers"
log = logging.getLogger(__name__)


def heartbeat_interval_s() -> float:
    return float(os.environ.get("KBRL_HEARTBEAT_S", 15))


def worker_gpu() -> str | None:
    """The GPU this worker owns, as `kbrl worker --gpu N` pinned it (None on a CPU worker)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible if visible and os.environ.get("KBRL_WORKER_KIND") == "gpu" else None


class Heartbeat:
    """Background thread that records this worker's liveness; `busy_with`/`idle` record job boundaries."""

    def __init__(self, store: EventStore, worker: str, interval_s: float | None = None) -> None:
        self.store = store
        self.worker = worker
        self.interval_s = interval_s if interval_s is not None else heartbeat_interval_s()
        self._boot = uuid.uuid4().hex[:8]
        self._seq = 0
        self._job: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kbrl-heartbeat", daemon=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def stop(self, final: bool = True) -> None:
        self._stop.set()
        if final:
            self.beat()

    def busy_with(self, job: EvalJob) -> None:
        self._job = f"{job.run_id}/{job.sample_id}"
        self.beat()

    def idle(self) -> None:
        self._job = None
        self.beat()

    def beat(self) -> None:
        """Append one heartbeat; a store hiccup is logged, never raised into the job."""
        with self._lock:
            self._seq += 1
            key = f"hb/{self.worker}/{self._boot}/{self._seq}"
            job = self._job
        payload = WorkerHeartbeat(worker=self.worker, gpu=worker_gpu(), busy=job is not None,
                                  host=socket.gethostname(), job=job)  # fmt: skip
        try:
            self.store.append_one(NewEvent(run_id=WORKERS_RUN, stream=f"worker/{self.worker}", key=key, payload=payload))
        except Exception:  # noqa: BLE001 - liveness reporting must not kill an evaluation
            log.exception("heartbeat of %s failed", self.worker)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

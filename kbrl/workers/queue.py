"""`JobQueue`: where eval jobs go. Celery on Redis when `KBRL_BROKER_URL` is set, else an in-process pool.

Both run the same task body (`kbrl.workers.jobs.evaluate_job`) and both deliver results the same way:
as `KernelEvaluated` events in the store, which producers follow (`jobs.wait_for_verdicts`). Code that
submits jobs therefore cannot tell the two apart, and the zero-service mode is the real code path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from kbrl import settings
from kbrl.events.store import EventStore
from kbrl.workers.jobs import EvalJob, EvaluatorPool, evaluate_job, requested_event

log = logging.getLogger(__name__)


class JobQueue(Protocol):
    """Submit eval jobs; results arrive as events in the store, never as return values."""

    def submit(self, jobs: Sequence[EvalJob]) -> None: ...

    def close(self) -> None: ...


def record_requests(store: EventStore, jobs: Sequence[EvalJob]) -> None:
    """`EvalRequested` for each job before it is queued (one transaction; idempotent on resubmission)."""
    if jobs:
        store.append([requested_event(job) for job in jobs])


class LocalQueue:
    """An in-process thread pool running the task body: no Redis, no worker processes.

    Candidates still run in sandbox children (the evaluator never imports them here), and the shared
    evaluator serialises GPU use, so `workers` > 1 overlaps compilation with timing as Celery's CPU
    queue does.
    """

    def __init__(self, store: EventStore, workers: int = 2, worker_name: str = "local") -> None:
        self.store = store
        self.worker_name = worker_name
        self._evaluators = EvaluatorPool()
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="kbrl-local")
        self._futures: list[Future[object]] = []

    def submit(self, jobs: Sequence[EvalJob]) -> None:
        record_requests(self.store, jobs)
        for job in jobs:
            self._futures.append(self._pool.submit(self._run, job))

    def _run(self, job: EvalJob) -> object:
        # One worker id per pool thread ("local/0", "local/1"): verdicts then say which slot judged them,
        # so step metrics can count the workers (`rollout/worker_idle_frac`).
        slot = threading.current_thread().name.rsplit("_", 1)[-1]
        try:
            return evaluate_job(job, self.store, self._evaluators, worker=f"{self.worker_name}/{slot}")
        except Exception:
            log.exception("job %s/%s failed", job.run_id, job.sample_id)
            raise

    def join(self) -> None:
        """Wait for every submitted job (their verdicts are in the store when this returns)."""
        for fut in self._futures:
            fut.exception()
        self._futures = [f for f in self._futures if not f.done()]

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class CeleryQueue:
    """Jobs as Celery messages on Redis (`KBRL_BROKER_URL`), taken by `kbrl worker` processes anywhere.

    A GPU job is sent twice: a `prebuild` hint to the CPU queue (builds the CUDA extension into the
    shared cache while GPUs are busy with earlier jobs) and the evaluation itself to the GPU queue. The
    hint is best effort: with no CPU worker running, the GPU worker simply builds it itself.
    """

    def __init__(self, store: EventStore, broker_url: str | None = None, prebuild: bool = True) -> None:
        from kbrl.workers.celery_app import make_app

        self.store = store
        self.app = make_app(broker_url)
        self.prebuild = prebuild

    def submit(self, jobs: Sequence[EvalJob]) -> None:
        from kbrl.workers.celery_app import CPU_QUEUE, GPU_QUEUE

        record_requests(self.store, jobs)
        with self.app.producer_or_acquire() as producer:
            for job in jobs:
                body = job.model_dump()
                if job.device == "cuda" and self.prebuild and job.text is not None and "load_inline" in job.text:
                    self.app.send_task("kbrl.prebuild", args=[body], queue=CPU_QUEUE, producer=producer)
                queue = GPU_QUEUE if job.device == "cuda" else CPU_QUEUE
                self.app.send_task("kbrl.evaluate", args=[body], queue=queue, producer=producer)

    def close(self) -> None:
        self.app.close()


def resolve_eval_device(device: str) -> str:
    """Where jobs are judged for a requested device: "auto" means the GPU workers when a broker is
    configured (wherever the producer runs), else this host's device. Shared by the trainer and eval-model."""
    if device != "auto":
        return device
    if settings.broker_url():
        return "cuda"
    from kbrl.kernels.evaluator import resolve_device

    return resolve_device("auto")


def make_queue(store: EventStore, broker_url: str | None = None, local_workers: int = 2) -> JobQueue:
    """Celery when a broker is configured (argument or `KBRL_BROKER_URL`), else the in-process queue."""
    url = broker_url or settings.broker_url()
    if url:
        return CeleryQueue(store, url)
    return LocalQueue(store, workers=local_workers)

"""The Celery app: broker settings chosen for long GPU jobs, and the two tasks (`evaluate`, `prebuild`).

Queues:
* `kbrl.gpu` — full evaluations on a GPU (verify + time). One job at a time per GPU worker, so timings
  are never disturbed by a second kernel on the same device.
* `kbrl.cpu` — CPU work: `prebuild` of CUDA extensions into the shared build cache (so compilation of
  the next kernels overlaps the GPU timing of the current one), and evaluations with `device="cpu"`
  (Triton interpreter verification, CUDA compile-only checks) on hosts without a GPU.

No result backend: verdicts are `KernelEvaluated` events in the store (see `kbrl.workers.jobs`).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from celery import Celery, signals

from kbrl import settings

GPU_QUEUE = "kbrl.gpu"
CPU_QUEUE = "kbrl.cpu"

# Longest a job may run. The evaluator bounds every candidate itself (180 s sandbox timeout, 900 s for
# a reference with its baselines); these are the backstop for a bug in the worker, not the candidate.
SOFT_TIME_LIMIT_S = int(os.environ.get("KBRL_TASK_SOFT_TIME_LIMIT", 1800))
TIME_LIMIT_S = SOFT_TIME_LIMIT_S + 300


def visibility_timeout_s() -> int:
    """How long Redis waits for an ack before handing a taken job to another worker.

    With late acks a job is acked only when it is done, so this must exceed the longest job (the hard
    time limit), or a healthy slow job is delivered twice (harmless: the verdict is keyed, but it wastes
    a GPU). It is also how long a job held by a SIGKILLed worker waits before redelivery.
    """
    return int(os.environ.get("KBRL_VISIBILITY_TIMEOUT", 2 * TIME_LIMIT_S))


def make_app(broker_url: str | None = None) -> Celery:
    broker = broker_url or settings.broker_url() or "redis://127.0.0.1:6379/0"
    app = Celery("kbrl", broker=broker, include=["kbrl.workers.tasks"])
    app.conf.update(
        # Results travel through the event store; a result backend would only duplicate them.
        task_ignore_result=True,
        result_backend=None,
        task_serializer="json",
        accept_content=["json"],
        # Ack after the job, not before: a worker that dies mid-job leaves it unacked, so it is redelivered.
        task_acks_late=True,
        # ...including when a pool child is killed (OOM killer, SIGKILL): requeue instead of failing it.
        task_reject_on_worker_lost=True,
        # Take one job at a time: a prefetched job would wait behind a long evaluation on this worker
        # while another worker sits idle.
        worker_prefetch_multiplier=1,
        task_soft_time_limit=SOFT_TIME_LIMIT_S,
        task_time_limit=TIME_LIMIT_S,
        # Redis: an unacked job goes back to its queue once older than the visibility timeout. Workers
        # sweep for such jobs every `unacked_restore_interval` s (a cheap sorted-set range query; kombu's
        # default throttle would make it every 100 s), so a dead worker's job waits at most
        # visibility timeout + interval before redelivery.
        broker_transport_options={
            "visibility_timeout": visibility_timeout_s(),
            "unacked_restore_interval": int(os.environ.get("KBRL_RESTORE_INTERVAL", 30)),
            "unacked_restore_throttle": 1,
        },
        broker_connection_retry_on_startup=True,
        # Jobs stay queued in Redis while no worker is up (and across Redis restarts with AOF on).
        task_default_queue=GPU_QUEUE,
        task_create_missing_queues=True,
        task_routes={"kbrl.prebuild": {"queue": CPU_QUEUE}},
        # Heartbeats/events for Flower are not needed; kbrl writes its own WorkerHeartbeat events.
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        # On a broker connection loss keep the job running: its verdict is keyed, so the redelivery that
        # follows (after the visibility timeout) finds it and does nothing, instead of redoing GPU work.
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app


app = make_app()


@signals.worker_process_init.connect
def _reset_after_fork(**_: Any) -> None:
    """Pool children must not share the parent's database connections; each starts its heartbeat."""
    from kbrl.workers import tasks

    tasks.reset_process_state()
    tasks.start_process_state()


@signals.worker_process_shutdown.connect
def _last_heartbeat(**_: Any) -> None:
    """A worker that stops says so (busy=False), so `kbrl status` does not wait on it."""
    from kbrl.workers import tasks

    if tasks._heartbeat is not None:
        tasks._heartbeat.stop(final=True)


def worker_name() -> str:
    return os.environ.get("KBRL_WORKER_NAME") or f"kbrl@{socket.gethostname()}"

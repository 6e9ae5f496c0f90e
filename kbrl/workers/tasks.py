"""Celery tasks: thin wrappers that hand the job to `kbrl.workers.jobs` (the same body `LocalQueue` runs)."""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Task
from sqlalchemy.exc import OperationalError

from kbrl.events.store import EventStore
from kbrl.workers.celery_app import app, worker_name
from kbrl.workers.heartbeat import Heartbeat
from kbrl.workers.jobs import EvalJob, EvaluatorPool, evaluate_job

log = logging.getLogger(__name__)

_store: EventStore | None = None
_evaluators: EvaluatorPool | None = None
_heartbeat: Heartbeat | None = None


def reset_process_state() -> None:
    """Fresh store connections, evaluators and heartbeat in each pool process (never shared over fork)."""
    global _store, _evaluators, _heartbeat
    _store, _evaluators = None, None
    if _heartbeat is not None:
        _heartbeat.stop(final=False)
    _heartbeat = None


def start_process_state() -> None:
    """Open the store and start beating as soon as the pool process exists (not at its first job)."""
    try:
        _state()
    except Exception:  # noqa: BLE001 - a store that is down now is retried by the first job
        log.exception("could not open the event store at worker start")


def _state() -> tuple[EventStore, EvaluatorPool, Heartbeat]:
    global _store, _evaluators, _heartbeat
    if _store is None:
        _store = EventStore()
    if _evaluators is None:
        _evaluators = EvaluatorPool()
    if _heartbeat is None:
        _heartbeat = Heartbeat(_store, _process_name())
        _heartbeat.start()
    return _store, _evaluators, _heartbeat


def _process_name() -> str:
    from billiard import current_process

    index = getattr(current_process(), "index", None)
    return worker_name() if index is None else f"{worker_name()}/{index}"


class _EvaluateTask(Task):
    """Records `EvalFailed` when a job ends in an error no retry fixes, so no sample stays "in flight"."""

    def on_failure(self, exc: BaseException, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                   einfo: Any) -> None:  # fmt: skip
        from kbrl.workers.jobs import record_failure

        try:
            store, _, _ = _state()
            record_failure(store, EvalJob.model_validate(args[0]), _process_name(), f"{type(exc).__name__}: {exc}")
        except Exception:  # noqa: BLE001 - the store may be what failed; Celery logs the original error
            log.exception("could not record the failure of task %s", task_id)


# A store that is briefly unreachable (database restart, SQLite busy beyond its timeout) is retried with
# backoff; the job's verdict key keeps a retry from ever writing twice.
@app.task(name="kbrl.evaluate", base=_EvaluateTask, autoretry_for=(OperationalError,), retry_backoff=5,
          retry_backoff_max=120, max_retries=6)  # fmt: skip
def evaluate(job: dict[str, Any]) -> str:
    """Evaluate one job; returns the verdict's category (for logs only: nothing reads task results)."""
    store, evaluators, heartbeat = _state()
    parsed = EvalJob.model_validate(job)
    try:
        event = evaluate_job(parsed, store, evaluators, worker=_process_name(), on_start=heartbeat.busy_with)
    finally:
        heartbeat.idle()
    category = str(event.payload["result"]["category"])
    log.info("%s %s -> %s", parsed.run_id, parsed.sample_id, category)
    return category


@app.task(name="kbrl.prebuild")
def prebuild(job: dict[str, Any]) -> dict[str, Any]:
    """Build a CUDA candidate's extension into the shared cache ahead of its GPU evaluation (best effort)."""
    store, evaluators, _ = _state()
    parsed = EvalJob.model_validate(job)
    from kbrl.workers.jobs import evaluated_key, load_text

    if store.get(evaluated_key(parsed.run_id, parsed.sample_id)) is not None:
        return {"built": False, "reason": "already evaluated"}
    if not _has_gpu():  # a CPU-only build is a syntax check the GPU worker cannot load: skip it
        return {"built": False, "reason": "no GPU visible to this worker"}
    config = dict(parsed.eval_config, device="cuda")
    return evaluators.get(config).prebuild(parsed.problem(), load_text(store, parsed))


def _has_gpu() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    import torch

    return torch.cuda.is_available()

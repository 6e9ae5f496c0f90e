"""Evaluation jobs and the one task body every queue runs: load the sample, evaluate, append the verdict.

A job message is self-contained (the problem's reference source travels with it), so a worker needs no
dataset checkout, only the evaluator and the event store. Results never travel back through the queue:
the verdict is the `KernelEvaluated` event, appended under a key derived from (run, sample). A retried or
redelivered job finds that key and returns the stored verdict, so at-least-once delivery still gives
exactly one result per sample.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from kbrl.events.payloads import EvalFailed, EvalRequested, EvalRunFinished, KernelEvaluated, SampleGenerated
from kbrl.events.store import Event, EventStore, NewEvent
from kbrl.kernels.evaluator import EvalConfig, Evaluator, EvaluatorError, config_dict, result_summary
from kbrl.kernels.result import EvalResult
from kbrl.problems.model import Problem

Device = Literal["cuda", "cpu"]


class EvalJob(BaseModel):
    """One candidate to evaluate. `text=None` means "read it from the store" (the `SampleGenerated`
    event whose key is `sample_id`, or the `EvalRequested` event that queued it)."""

    run_id: str
    sample_id: str
    problem_id: str
    problem_name: str
    problem_level: int
    problem_code: str
    text: str | None = None
    device: Device = "cuda"
    eval_config: dict[str, Any] = Field(default_factory=dict)
    expected: int | None = None
    """Set for evaluation runs (not training): the run's job count, so the worker that appends the last
    verdict can close the run with `EvalRunFinished`."""

    @classmethod
    def for_problem(cls, run_id: str, sample_id: str, problem: Problem, text: str | None, device: Device,
                    config: EvalConfig, expected: int | None = None) -> EvalJob:  # fmt: skip
        cfg = config_dict(config)
        cfg["device"] = device
        return cls(run_id=run_id, sample_id=sample_id, problem_id=problem.id, problem_name=problem.name,
                   problem_level=problem.level, problem_code=problem.code, text=text, device=device,
                   eval_config=cfg, expected=expected)  # fmt: skip

    def problem(self) -> Problem:
        collection, _, rest = self.problem_id.partition("/")
        number = rest.rsplit("/", 1)[-1]
        return Problem(collection=collection or "unknown", level=self.problem_level,
                       number=int(number) if number.isdigit() else 0, name=self.problem_name,
                       code=self.problem_code)  # fmt: skip


def evaluated_key(run_id: str, sample_id: str) -> str:
    """The idempotency key of a sample's verdict (shared with `kbrl eval-kernels` runs)."""
    return f"{run_id}/{sample_id}/evaluated"


def requested_event(job: EvalJob) -> NewEvent:
    """`EvalRequested` for a job: recorded before it is queued, so `kbrl status` can count what is in flight."""
    return NewEvent(run_id=job.run_id, stream=f"sample/{job.sample_id}", key=f"{job.run_id}/{job.sample_id}/requested",
                    payload=EvalRequested(sample_id=job.sample_id, problem_id=job.problem_id,
                                          eval_config=job.eval_config, text=job.text))  # fmt: skip


class UnknownSample(LookupError):
    """A job without text names a sample the store does not hold."""


def load_text(store: EventStore, job: EvalJob) -> str:
    if job.text is not None:
        return job.text
    for key in (job.sample_id, f"{job.run_id}/{job.sample_id}/requested"):
        event = store.get(key)
        if event is not None and event.type in (SampleGenerated.event_type, EvalRequested.event_type):
            text = event.payload.get("text")
            if text is not None:
                return str(text)
    raise UnknownSample(f"sample {job.sample_id!r} of run {job.run_id!r} has no text in the job or the store")


class EvaluatorPool:
    """One evaluator per distinct config, kept for the worker's lifetime (reference outputs and baseline
    timings are cached inside it, so the second job of a problem skips the reference run)."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.cache_dir = cache_dir  # None: KBRL_CACHE_DIR, shared by every worker of the host
        self._evaluators: dict[str, Evaluator] = {}
        self._lock = threading.Lock()

    def get(self, eval_config: dict[str, Any]) -> Evaluator:
        key = json.dumps(eval_config, sort_keys=True, default=str)
        with self._lock:
            if key not in self._evaluators:
                self._evaluators[key] = Evaluator(EvalConfig(**eval_config), cache_dir=self.cache_dir)
            return self._evaluators[key]


def evaluate_job(
    job: EvalJob,
    store: EventStore,
    evaluators: EvaluatorPool,
    worker: str | None = None,
    on_start: Callable[[EvalJob], None] | None = None,
) -> Event:
    """The task body of every queue: evaluate one job and append its verdict, exactly once.

    The verdict is `KernelEvaluated`, or `EvalFailed` when the evaluator (not the candidate) could not
    judge it. Errors of the store itself propagate, so the queue retries the job.
    """
    key = evaluated_key(job.run_id, job.sample_id)
    done = store.get(key)
    if done is not None:  # a redelivery of a job some worker already finished
        return done
    if on_start is not None:
        on_start(job)
    worker = worker or socket.gethostname()
    started = time.perf_counter()
    try:
        text = load_text(store, job)
        evaluator = evaluators.get(job.eval_config)
        result = evaluator.evaluate(job.problem(), text)
    except (EvaluatorError, UnknownSample, TypeError, ValueError) as exc:
        return record_failure(store, job, worker, f"{type(exc).__name__}: {exc}")
    payload = KernelEvaluated(sample_id=job.sample_id, problem_id=job.problem_id, worker=worker,
                              gpu=_gpu_label(evaluator), result=result.to_dict(),
                              seconds=time.perf_counter() - started)  # fmt: skip
    event = store.append_one(NewEvent(run_id=job.run_id, stream=f"sample/{job.sample_id}", key=key, payload=payload))
    if job.expected is not None:
        maybe_finish_eval_run(store, job.run_id, job.expected)
    return event


def record_failure(store: EventStore, job: EvalJob, worker: str, error: str) -> Event:
    """`EvalFailed` for a job no verdict can be given for (keyed: one per sample)."""
    payload = EvalFailed(sample_id=job.sample_id, problem_id=job.problem_id, worker=worker, error=error[-4000:])
    event = store.append_one(NewEvent(run_id=job.run_id, stream=f"sample/{job.sample_id}",
                                      key=f"{job.run_id}/{job.sample_id}/failed", payload=payload))  # fmt: skip
    if job.expected is not None:
        maybe_finish_eval_run(store, job.run_id, job.expected)
    return event


def maybe_finish_eval_run(store: EventStore, run_id: str, expected: int) -> bool:
    """Close an evaluation run once all its verdicts exist; safe to race (the finish event is keyed)."""
    if store.count(run_id, [KernelEvaluated, EvalFailed]) < expected:
        return False
    results = [EvalResult.from_dict(e.payload["result"]) for e in store.read(run_id=run_id, types=[KernelEvaluated])]
    store.append_one(NewEvent(run_id=run_id, stream=f"run/{run_id}", key=f"{run_id}/finished",
                              payload=EvalRunFinished(status="finished", summary=result_summary(results))))  # fmt: skip
    return True


def _gpu_label(evaluator: Evaluator) -> str:
    if not evaluator.device.startswith("cuda"):
        return "cpu"
    import torch

    return torch.cuda.get_device_name(0)


def wait_for_verdicts(
    store: EventStore,
    run_id: str,
    sample_ids: Iterable[str],
    timeout: float | None = None,
    on_event: Callable[[Event], None] | None = None,
    after: int = 0,
) -> dict[str, Event]:
    """Follow the store until every sample of `sample_ids` has its verdict (or `timeout`).

    A verdict is `KernelEvaluated`, or `EvalFailed` when the evaluator could not judge the sample.

    This is how a producer (the trainer, `kbrl enqueue --wait`) gets results from any queue.
    """
    wanted = set(sample_ids)
    found: dict[str, Event] = {}
    for event in store.follow(run_id=run_id, types=[KernelEvaluated, EvalFailed], after=after, timeout=timeout,
                              stop=lambda: wanted <= found.keys()):  # fmt: skip
        sample = event.payload.get("sample_id")
        if sample in wanted and sample not in found:
            found[sample] = event
            if on_event is not None:
                on_event(event)
        if wanted <= found.keys():
            break
    return found

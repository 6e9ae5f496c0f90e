"""`kbrl enqueue eval`: record an evaluation run and push its jobs; optionally wait for the verdicts."""

from __future__ import annotations

from kbrl.evalrun import Candidate, new_run_id
from kbrl.events.payloads import EvalRunStarted
from kbrl.events.store import Event, EventStore, NewEvent
from kbrl.kernels.evaluator import EvalConfig, config_dict
from kbrl.workers.jobs import Device, EvalJob, wait_for_verdicts
from kbrl.workers.queue import JobQueue


def enqueue_eval(store: EventStore, queue: JobQueue, candidates: list[Candidate], config: EvalConfig,
                 device: Device, kind: str = "enqueue") -> tuple[str, list[EvalJob]]:  # fmt: skip
    """Start an eval run in the store and submit one job per candidate; returns (run_id, jobs).

    Each job knows the run's size, so whichever worker appends the last verdict closes the run.
    """
    if not candidates:
        raise ValueError("nothing to enqueue: no candidates")
    run_id = new_run_id(kind)
    jobs = [EvalJob.for_problem(run_id, c.sample_id, c.problem, c.text, device, config, expected=len(candidates))
            for c in candidates]  # fmt: skip
    cfg = config_dict(config) | {"device": device}
    store.append_one(NewEvent(run_id=run_id, stream=f"run/{run_id}", key=f"{run_id}/started",
                              payload=EvalRunStarted(kind=kind, config=cfg, n_candidates=len(jobs),
                                                     problem_ids=sorted({j.problem_id for j in jobs}))))  # fmt: skip
    queue.submit(jobs)
    return run_id, jobs


def wait_with_progress(store: EventStore, run_id: str, jobs: list[EvalJob], timeout: float | None) -> dict[str, Event]:
    """Follow the run's verdicts with a progress bar until all are in (or `timeout` seconds pass)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task(f"waiting for {run_id}", total=len(jobs))

        def advance(event: Event) -> None:
            category = event.payload.get("result", {}).get("category", event.type)
            bar.update(task, advance=1, description=f"{event.payload['sample_id']}: {category}")

        return wait_for_verdicts(store, run_id, [j.sample_id for j in jobs], timeout=timeout, on_event=advance)

"""`kbrl status RUN_ID`: a run's evaluation progress and the live workers, folded from the store."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kbrl.events.payloads import EvalFailed, EvalRequested, EvalRunFinished, KernelEvaluated, RunFinished
from kbrl.events.store import EventStore
from kbrl.workers.heartbeat import WORKERS_RUN, heartbeat_interval_s


@dataclass
class RunProgress:
    run_id: str
    requested: int = 0
    done: int = 0
    failed: int = 0
    categories: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    finished: str | None = None

    @property
    def in_flight(self) -> int:
        return max(0, self.requested - self.done - self.failed)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "requested": self.requested, "done": self.done, "failed": self.failed,
                "in_flight": self.in_flight, "categories": dict(self.categories), "failures": self.failures,
                "finished": self.finished}  # fmt: skip


@dataclass
class WorkerState:
    worker: str
    gpu: int | str | None
    busy: bool
    job: str | None
    seconds_ago: float

    @property
    def alive(self) -> bool:
        return self.seconds_ago <= 3 * heartbeat_interval_s() + 5


def run_progress(store: EventStore, run_id: str) -> RunProgress:
    progress = RunProgress(run_id)
    types = [EvalRequested, KernelEvaluated, EvalFailed, EvalRunFinished, RunFinished]
    done: set[str] = set()
    for event in store.read(run_id=run_id, types=types):
        if event.type == EvalRequested.event_type:
            progress.requested += 1
        elif event.type == KernelEvaluated.event_type:
            done.add(event.payload["sample_id"])
            progress.done += 1
            progress.categories[str(event.payload["result"].get("category"))] += 1
        elif event.type == EvalFailed.event_type:
            if event.payload["sample_id"] not in done:
                progress.failed += 1
                progress.failures.append(f"{event.payload['sample_id']}: {event.payload['error'][:200]}")
        else:
            progress.finished = str(event.payload.get("status"))
    return progress


def worker_states(store: EventStore) -> list[WorkerState]:
    now = datetime.now(UTC)
    states = []
    for event in store.latest_per_stream(WORKERS_RUN):
        p = event.payload
        states.append(WorkerState(p["worker"], p.get("gpu"), bool(p["busy"]), p.get("job"),
                                  (now - event.created_at).total_seconds()))  # fmt: skip
    return sorted(states, key=lambda w: w.worker)


def print_status(store: EventStore, run_id: str, as_json: bool = False) -> int:
    """Print progress; returns 1 for an unknown run (nothing printed but the error)."""
    import json
    import sys

    from rich.console import Console
    from rich.table import Table

    if not store.has_run(run_id):
        print(f"error: no run {run_id!r} in the store (see `kbrl runs`)", file=sys.stderr)
        return 1
    progress = run_progress(store, run_id)
    workers = worker_states(store)
    if as_json:
        print(json.dumps({**progress.to_dict(), "workers": [w.__dict__ | {"alive": w.alive} for w in workers]}))
        return 0
    console = Console()
    state = progress.finished or ("done" if progress.requested and not progress.in_flight else "running")
    console.print(f"[bold]{run_id}[/]  {state}: {progress.done} done, {progress.in_flight} in flight, "
                  f"{progress.failed} failed (of {progress.requested} requested)")  # fmt: skip
    if progress.categories:
        table = Table("category", "count")
        for name, n in progress.categories.most_common():
            table.add_row(name, str(n))
        console.print(table)
    for line in progress.failures[:10]:
        console.print(f"[red]failed[/] {line}", markup=True, highlight=False)
    alive = [w for w in workers if w.alive]
    if alive:
        console.print("workers: " + ", ".join(
            f"{w.worker} ({'busy: ' + (w.job or '?') if w.busy else 'idle'})" for w in alive))  # fmt: skip
    elif progress.in_flight:
        console.print("[yellow]no live worker heartbeat: start one with `kbrl worker`[/] "
                      "(jobs stay queued until one runs)")  # fmt: skip
    return 0

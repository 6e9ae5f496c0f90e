"""Metric projections: per-step scalars, histograms and per-sample rows, folded from a run's events.

One code path for every view of a run: the trainer logs `step_scalars` / `step_histograms` to TensorBoard
right after a step's update is committed, the Streamlit dashboard shows the same functions' output (and
refreshes it incrementally with `RunProjection.update`), and `print_metrics` (`kbrl replay RUN --metrics`)
prints it. Nothing here is stored: every number can be rebuilt from the log, e.g. with `write_tensorboard`.

Scalar names (TensorBoard tags); a name is absent when there is nothing to compute it from:

* `reward/mean`, `reward/std` (population std, as the group advantages use), `reward/min`, `reward/max`
  over the step's judged samples (those with a `KernelEvaluated` verdict).
* `eval/format_rate`, `eval/compile_rate`, `eval/correct_rate` (category CORRECT), `eval/cheat_rate`
  (category CHEAT) over judged samples; `eval/mean_speedup` over correct samples with a usable speedup;
  `eval/failed` (samples the evaluator could not judge), `eval/pending` (no verdict yet), `samples`.
* `progress/completion_fraction` = (step + 1) / n_steps; `optim/learning_rate` = the update's lr.
* `time/total_s`, `time/rollout_s` (= `time/sample_s` + `time/eval_s`), `time/train_s`, `time/save_s`:
  the trainer records them in `PolicyUpdated.metrics`; `train/*` (loss, n_datums, backend metrics) too.
* `rollout/worker_idle_frac` (`RunProjection` only: it needs event times): the share of the evaluation
  workers' time during the step's rollout that no evaluation of the step was running (see
  `worker_idle_fraction`), and `rollout/workers`, how many workers served the step.
* `level/L{n}/reward_mean`, `level/L{n}/correct_rate` per KernelBench level (from the problem id).
* `multiturn/success_rate` (trajectories with a CORRECT turn), `multiturn/avg_turns`,
  `multiturn/turn_{k}/compile_rate`, `multiturn/turn_{k}/correct_rate` once a step has turns > 0 (or the
  run is `mode: multi_turn`).

Histograms (`step_histograms`, written every `HISTOGRAM_EVERY` steps): `hist/reward`, `hist/advantage`,
`hist/speedup` (correct samples with a usable speedup).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kbrl.events.payloads import EvalFailed, EvalRequested, KernelEvaluated, RunStarted, SampleGenerated
from kbrl.events.store import Event, EventStore
from kbrl.metrics.tensorboard import ScalarLogger
from kbrl.training.replay import RunState, Sample, Step, StepScores, apply, run_step_scores, step_advantages
from kbrl.training.rewards import RewardWeights, finite_speedup

HISTOGRAM_EVERY = 5
"""Histograms are written for steps 0, N, 2N, …: each is a full distribution, heavier than a scalar."""

_LEVEL = re.compile(r"(?:^|/)L(\d+)(?:/|$)")


def level_of(problem_id: str | None) -> int | None:
    """The KernelBench level in a problem id (`builtin/L1/5`, `kernelbench/L2/17`), None if it has none."""
    m = _LEVEL.search(problem_id or "")
    return int(m.group(1)) if m else None


def as_number(value: Any) -> float | None:
    """A finite float, or None: payload dicts keep NaN/inf as strings, and a chart wants no such points."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def _rate(flags: Iterable[bool]) -> float:
    items = list(flags)
    return sum(items) / len(items)


def _is_correct(verdict: Mapping[str, Any]) -> bool:
    return verdict.get("category") == "CORRECT"


def step_scalars(step: Step, scores: StepScores, *, n_steps: int | None = None,
                 multi_turn: bool = False) -> dict[str, float]:  # fmt: skip
    """Every scalar of one step (see the module docstring for the names), from its samples, verdicts,
    scores and recorded update; the single definition the trainer, the dashboard and replay share."""
    samples = list(step.samples.values())
    judged = [s for s in samples if s.verdict is not None]
    out: dict[str, float] = {
        "samples": float(len(samples)),
        "eval/failed": float(sum(s.failed is not None for s in samples)),
        "eval/pending": float(len(step.pending())),
    }
    rewards = [scores.rewards[s.sample_id] for s in judged if s.sample_id in scores.rewards]
    if rewards:
        mean = _mean(rewards)
        out["reward/mean"] = mean
        out["reward/std"] = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
        out["reward/min"] = min(rewards)
        out["reward/max"] = max(rewards)
    if judged:
        verdicts = [s.verdict for s in judged if s.verdict is not None]
        out["eval/format_rate"] = _rate(bool(v.get("format_ok")) for v in verdicts)
        out["eval/compile_rate"] = _rate(bool(v.get("compiled")) for v in verdicts)
        out["eval/correct_rate"] = _rate(_is_correct(v) for v in verdicts)
        out["eval/cheat_rate"] = _rate(v.get("category") == "CHEAT" for v in verdicts)
    speedups = step_speedups(scores)
    if speedups:
        out["eval/mean_speedup"] = _mean(speedups)
    by_level: dict[int, list[Sample]] = {}
    for s in judged:
        level = level_of(s.problem_id)
        if level is not None:
            by_level.setdefault(level, []).append(s)
    for level, group in sorted(by_level.items()):
        level_rewards = [scores.rewards[s.sample_id] for s in group if s.sample_id in scores.rewards]
        if level_rewards:
            out[f"level/L{level}/reward_mean"] = _mean(level_rewards)
        out[f"level/L{level}/correct_rate"] = _rate(_is_correct(s.verdict or {}) for s in group)
    if n_steps:
        out["progress/completion_fraction"] = (step.step + 1) / n_steps
    if step.update is not None:
        update = step.update
        for key, value in (("optim/learning_rate", update.get("lr")), ("train/loss", update.get("loss")),
                           ("train/n_datums", update.get("n_datums"))):  # fmt: skip
            if (v := as_number(value)) is not None:
                out[key] = v
        for key, value in (update.get("metrics") or {}).items():
            if (v := as_number(value)) is not None:
                out[key] = v
    if multi_turn or any(s.turn > 0 for s in samples):
        out.update(multiturn_scalars(judged))
    return out


def multiturn_scalars(judged: list[Sample]) -> dict[str, float]:
    """`multiturn/*` over the judged samples of one step: a trajectory succeeds when any turn is CORRECT."""
    trajs: dict[str, list[Sample]] = {}
    for s in judged:
        trajs.setdefault(s.traj, []).append(s)
    if not trajs:
        return {}
    out = {
        "multiturn/success_rate": _rate(any(_is_correct(s.verdict or {}) for s in t) for t in trajs.values()),
        "multiturn/avg_turns": _mean([float(len(t)) for t in trajs.values()]),
    }
    by_turn: dict[int, list[Sample]] = {}
    for s in judged:
        by_turn.setdefault(s.turn, []).append(s)
    for turn, group in sorted(by_turn.items()):
        out[f"multiturn/turn_{turn}/compile_rate"] = _rate(bool((s.verdict or {}).get("compiled")) for s in group)
        out[f"multiturn/turn_{turn}/correct_rate"] = _rate(_is_correct(s.verdict or {}) for s in group)
    return out


def worker_idle_fraction(intervals: Iterable[tuple[str, float, float]], start: float, end: float) -> float | None:
    """The share of worker-time in [start, end] with no evaluation running: 1 - Σ_w busy_w / (n_w · (end - start)).

    `intervals` are (worker, begin, finish) of evaluations, in seconds; n_w is the number of distinct
    workers among them, and busy_w the length of the union of worker w's intervals clipped to the window
    (a union, so a worker id shared by concurrent slots is counted as one worker, never busier than
    100 %). What asynchronous turns are for: with synchronous turns the workers idle while the policy
    samples. None for an empty window or no intervals.
    """
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for worker, begin, finish in intervals:
        by_worker.setdefault(worker, []).append((max(begin, start), min(finish, end)))
    if end <= start or not by_worker:
        return None
    busy = 0.0
    for spans in by_worker.values():
        reach = start
        for begin, finish in sorted(spans):
            begin = max(begin, reach)
            if finish > begin:
                busy += finish - begin
                reach = finish
    return 1.0 - busy / (len(by_worker) * (end - start))


def step_speedups(scores: StepScores) -> list[float]:
    """Speedups (vs the reward's baseline) of the correct samples that have a usable one."""
    return [b.speedup for b in scores.breakdowns.values() if b.correct and b.speedup is not None]


def step_histograms(step: Step, scores: StepScores) -> dict[str, list[float]]:
    """Distributions of one step: rewards, advantages and (when any) speedups, in sample-id order."""
    out = {
        "hist/reward": [scores.rewards[k] for k in sorted(scores.rewards)],
        "hist/advantage": [scores.advantages[k] for k in sorted(scores.advantages)],
    }
    speedups = step_speedups(scores)
    if speedups:
        out["hist/speedup"] = speedups
    return {k: v for k, v in out.items() if v}


# --- the incremental fold ----------------------------------------------------------------------------------


@dataclass
class EvalInfo:
    """Who judged a sample, how long it took and when (not in `RunState`, which keeps only the verdict)."""

    worker: str | None
    gpu: int | str | None
    seconds: float | None
    at: datetime


@dataclass(frozen=True)
class SampleRow:
    """One generated (or queued) kernel as the dashboard lists it: its place, verdict and score."""

    run_id: str
    sample_id: str
    step: int | None
    group: int | None
    traj: str | None
    turn: int
    problem_id: str
    level: int | None
    policy_version: int | None
    category: str | None
    backend: str | None
    format_ok: bool | None
    compiled: bool | None
    correct: bool | None
    speedup: float | None
    """vs eager PyTorch (`speedup_eager`)."""
    speedup_compile: float | None
    reward: float | None
    advantage: float | None
    final: bool
    """The step's update is committed, so reward and advantage are the ones it used (else provisional)."""
    failed: str | None
    worker: str | None
    eval_seconds: float | None
    sampled_at: datetime | None
    evaluated_at: datetime | None

    def to_dict(self) -> dict[str, Any]:
        """A flat dict (for tables and JSON)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass
class RunProjection:
    """A run's events folded into `RunState` (by `kbrl.training.replay.apply`, the trainer's own fold) plus
    what views need besides: timestamps, workers, queued candidates of evaluation runs. `update` reads only
    events after the last one seen, so a live page refreshing every second stays cheap."""

    run_id: str
    state: RunState = field(init=False)
    sampled_at: dict[str, datetime] = field(default_factory=dict)
    evals: dict[str, EvalInfo] = field(default_factory=dict)
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """sample_id → verdict payload, also for samples that are not policy samples (evaluation runs)."""
    requested: dict[str, dict[str, Any]] = field(default_factory=dict)
    """sample_id → `EvalRequested` payload."""
    weights: RewardWeights | None = None
    gamma: float | None = None
    _by_id: dict[str, Sample] = field(default_factory=dict)
    _scores: dict[int, StepScores] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.state = RunState(self.run_id)

    @property
    def last_position(self) -> int:
        """Position of the last event folded in (0 before any)."""
        return self.state.last_position

    @property
    def n_steps(self) -> int | None:
        value = self.state.config.get("n_steps")
        return int(value) if isinstance(value, int) else None

    @property
    def multi_turn(self) -> bool:
        return self.state.config.get("mode") == "multi_turn"

    def feed(self, events: Iterable[Event]) -> int:
        """Fold `events` (in position order, all of this run); returns how many were new."""
        n = 0
        for event in events:
            if event.position <= self.state.last_position:
                continue
            n += 1
            apply(self.state, self._by_id, event)
            p = event.payload
            if event.type == SampleGenerated.event_type:
                self.sampled_at[event.key] = event.created_at
                self._scores.pop(int(p["step"]), None)
            elif event.type == KernelEvaluated.event_type:
                sid = p["sample_id"]
                self.verdicts[sid] = p["result"]
                self.evals[sid] = EvalInfo(p.get("worker"), p.get("gpu"), as_number(p.get("seconds")), event.created_at)
                self._forget(sid)
            elif event.type == EvalRequested.event_type:
                self.requested[p["sample_id"]] = p
            elif event.type == EvalFailed.event_type:
                self._forget(p["sample_id"])
            elif event.type == RunStarted.event_type:
                self._scores.clear()
        return n

    def update(self, store: EventStore) -> int:
        """Fold the run's events appended since the last call; returns how many."""
        return self.feed(store.read(run_id=self.run_id, after=self.state.last_position))

    def _forget(self, sample_id: str) -> None:
        sample = self._by_id.get(sample_id)
        if sample is not None:
            self._scores.pop(sample.step, None)

    def scores(self, number: int) -> StepScores:
        """Rewards and advantages of a step with the run's recorded settings, through the same function the
        live update uses (`run_step_scores`): equal to the recorded ones once the step is done, provisional
        while verdicts arrive. `weights`/`gamma`, when set, re-score it ("what-if")."""
        if number not in self._scores:
            from kbrl.config import TrainConfig

            step = self.state.steps[number]
            try:
                cfg = TrainConfig.model_validate(self.state.config)
            except ValueError:  # a config this code cannot read: score with the defaults rather than show nothing
                gamma = self.gamma if self.gamma is not None else float(self.state.config.get("gamma", 0.4))
                self._scores[number] = step_advantages(step, self.weights or RewardWeights(), gamma)
            else:
                self._scores[number] = run_step_scores(step, cfg, self.weights, self.gamma)
        return self._scores[number]

    def steps(self) -> list[int]:
        """Numbers of the steps that have samples, in order."""
        return [n for n, s in sorted(self.state.steps.items()) if s.samples]

    def step_scalars(self, number: int) -> dict[str, float]:
        out = step_scalars(self.state.steps[number], self.scores(number), n_steps=self.n_steps,
                           multi_turn=self.multi_turn)  # fmt: skip
        out.update(self.worker_usage(number))
        return out

    def worker_usage(self, number: int) -> dict[str, float]:
        """`rollout/worker_idle_frac` and `rollout/workers` of a step, from its events' times.

        The window runs from the step's first `SampleGenerated` (the earliest a job could start) to its
        last verdict; each verdict's evaluation ran over [recorded_at - seconds, recorded_at] on its
        `worker`. The workers are those that judged at least one of the step's samples (a worker that took
        none of them is not counted, and a worker's jobs of other runs count as idle time here). A step
        interrupted and resumed counts the gap as idle: no evaluation was running.
        """
        sids = list(self.state.steps[number].samples)
        starts = [self.sampled_at[sid] for sid in sids if sid in self.sampled_at]
        evals = [self.evals[sid] for sid in sids if sid in self.evals and self.evals[sid].seconds is not None]
        if not starts or not evals:
            return {}
        start = min(starts).timestamp()
        end = max(e.at for e in evals).timestamp()
        intervals = [(str(e.worker), e.at.timestamp() - float(e.seconds or 0.0), e.at.timestamp()) for e in evals]
        idle = worker_idle_fraction(intervals, start, end)
        if idle is None:
            return {}
        return {"rollout/worker_idle_frac": idle, "rollout/workers": float(len({w for w, _, _ in intervals}))}

    def step_histograms(self, number: int) -> dict[str, list[float]]:
        return step_histograms(self.state.steps[number], self.scores(number))

    def scalars(self) -> dict[int, dict[str, float]]:
        """`step_scalars` of every step with samples."""
        return {n: self.step_scalars(n) for n in self.steps()}

    def sample_rows(self) -> list[SampleRow]:
        """Every policy sample (in position order), then every queued candidate that is not one (eval runs)."""
        rows = []
        for number in self.steps():
            step = self.state.steps[number]
            scores = self.scores(number)
            for s in sorted(step.samples.values(), key=lambda s: s.position):
                rows.append(self._row(s.sample_id, s.problem_id, s.verdict, step=s.step, group=s.group, traj=s.traj,
                                      turn=s.turn, policy_version=s.policy_version, failed=s.failed,
                                      reward=scores.rewards.get(s.sample_id),
                                      advantage=scores.advantages.get(s.sample_id), final=step.done))  # fmt: skip
        seen = {r.sample_id for r in rows}
        extra = list(self.requested) + [sid for sid in self.verdicts if sid not in self.requested]
        for sid in extra:
            if sid in seen:
                continue
            verdict = self.verdicts.get(sid)
            problem = (self.requested.get(sid) or {}).get("problem_id") or (verdict or {}).get("problem_id") or "?"
            rows.append(self._row(sid, str(problem), verdict, final=verdict is not None))
        return rows

    def _row(self, sid: str, problem_id: str, verdict: Mapping[str, Any] | None, *, step: int | None = None,
             group: int | None = None, traj: str | None = None, turn: int = 0, policy_version: int | None = None,
             failed: str | None = None, reward: float | None = None, advantage: float | None = None,
             final: bool = False) -> SampleRow:  # fmt: skip
        v = verdict or {}
        info = self.evals.get(sid)
        return SampleRow(
            run_id=self.run_id, sample_id=sid, step=step, group=group, traj=traj, turn=turn, problem_id=problem_id,
            level=level_of(problem_id), policy_version=policy_version, category=v.get("category"),
            backend=v.get("backend"), format_ok=v.get("format_ok"), compiled=v.get("compiled"),
            correct=_is_correct(v) if verdict is not None else None, speedup=finite_speedup(v.get("speedup_eager")),
            speedup_compile=finite_speedup(v.get("speedup_compile")), reward=reward, advantage=advantage,
            final=final, failed=failed, worker=info.worker if info else None,
            eval_seconds=info.seconds if info else None, sampled_at=self.sampled_at.get(sid),
            evaluated_at=info.at if info else None,
        )  # fmt: skip

    def text(self, sample_id: str) -> str | None:
        """The kernel's source text (the completion, or the queued candidate), None if the store has none."""
        sample = self._by_id.get(sample_id)
        if sample is not None:
            return sample.text
        text = (self.requested.get(sample_id) or {}).get("text")
        return None if text is None else str(text)

    def verdict(self, sample_id: str) -> dict[str, Any] | None:
        return self.verdicts.get(sample_id)

    def trajectories(self, number: int) -> dict[str, list[Sample]]:
        """The step's trajectories (traj id → its samples by turn), in group then trajectory order."""
        step = self.state.steps[number]
        out: dict[str, list[Sample]] = {}
        for s in sorted(step.samples.values(), key=lambda s: (s.group, s.traj, s.turn)):
            out.setdefault(s.traj, []).append(s)
        return out


def project_run(store: EventStore, run_id: str, upto: int | None = None) -> RunProjection:
    """A run's projection after every event up to position `upto` (all of them by default)."""
    projection = RunProjection(run_id)
    projection.feed(store.read(run_id=run_id, upto=upto))
    return projection


# --- writers -----------------------------------------------------------------------------------------------


class MetricsLogger(ScalarLogger):
    """`ScalarLogger` that also writes histograms: everything of one step under `log_path/tensorboard`."""

    def log_step(self, step: int, scalars: Mapping[str, float],
                 histograms: Mapping[str, list[float]] | None = None) -> None:  # fmt: skip
        """Histograms first (skipping non-finite values), then the scalars, which flush."""
        if self._writer is not None and histograms:
            import numpy as np

            for tag, values in histograms.items():
                finite = [v for v in values if math.isfinite(v)]
                if finite:
                    self._writer.add_histogram(tag, np.asarray(finite, dtype=np.float64), global_step=step)
        self.log(step, scalars)


def log_step(logger: MetricsLogger, projection: RunProjection, number: int,
             histogram_every: int = HISTOGRAM_EVERY) -> dict[str, float]:  # fmt: skip
    """Write step `number`'s scalars (and histograms every `histogram_every` steps); returns the scalars."""
    scalars = projection.step_scalars(number)
    every = max(1, histogram_every)
    logger.log_step(number, scalars, projection.step_histograms(number) if number % every == 0 else None)
    return scalars


def write_tensorboard(store: EventStore, run_id: str, log_dir: Path | str,
                      histogram_every: int = HISTOGRAM_EVERY) -> int:  # fmt: skip
    """Rebuild a run's TensorBoard files from its events (e.g. for a run logged with TensorBoard off);
    returns how many steps were written."""
    projection = project_run(store, run_id)
    steps = projection.steps()
    with MetricsLogger(log_dir) as logger:
        for number in steps:
            log_step(logger, projection, number, histogram_every)
    return len(steps)


def print_metrics(url: str, run_id: str, as_json: bool = False) -> int:
    """`kbrl replay RUN --metrics`: the projected scalars per step (a table, or JSON lines); 1 if no steps."""
    import json

    from rich.console import Console
    from rich.table import Table

    projection = project_run(EventStore(url), run_id)
    scalars = projection.scalars()
    if as_json:
        for n, values in scalars.items():
            print(json.dumps({"step": n, **values}))
        return 0 if scalars else 1
    columns = ["reward/mean", "reward/std", "eval/format_rate", "eval/compile_rate", "eval/correct_rate",
               "eval/cheat_rate", "train/loss", "time/total_s"]  # fmt: skip
    table = Table("step", *columns, title=f"{run_id}: metrics projected from the event log")
    for n, values in scalars.items():
        table.add_row(str(n), *[fmt(values.get(c)) for c in columns])
    Console().print(table)
    return 0 if scalars else 1


def fmt(value: float | None, digits: int = 4) -> str:
    """How every view prints a metric (the dashboard's tables and its browser test use this too)."""
    return "-" if value is None else f"{value:.{digits}f}"


__all__ = [
    "HISTOGRAM_EVERY",
    "EvalInfo",
    "MetricsLogger",
    "RunProjection",
    "SampleRow",
    "fmt",
    "level_of",
    "log_step",
    "multiturn_scalars",
    "as_number",
    "print_metrics",
    "project_run",
    "step_histograms",
    "step_scalars",
    "step_speedups",
    "worker_idle_fraction",
    "write_tensorboard",
]

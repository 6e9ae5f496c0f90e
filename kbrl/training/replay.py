"""Replay: fold a training run's events into steps, groups and trajectories; score them; compute advantages.

This is the only place rewards and advantages are computed. The live updater calls `replay_run` and
`step_advantages` on the events it has just waited for, and `kbrl replay RUN --advantages` calls the same
two functions on the stored log, so the numbers match exactly; `--reward-weights` re-scores a finished run
with other weights ("what-if") through the same path.

Grouping: the samples of one step with the same `group` started from the same problem; a sample's
trajectory is `traj`, its position in it `turn`. A sample without a verdict (`EvalFailed`: the evaluator
could not judge it) is left out of its group: it has no reward, and gets no datum.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kbrl.events.payloads import (
    CheckpointSaved,
    EvalFailed,
    KernelEvaluated,
    PolicyUpdated,
    ProblemsSelected,
    RunFinished,
    RunStarted,
    SampleGenerated,
    TrajectoryCompleted,
    TurnCompleted,
)
from kbrl.events.store import Event, EventStore
from kbrl.training.advantages import trajectory_advantages
from kbrl.training.rewards import RewardBreakdown, RewardWeights, score


def encode_numbers(values: Iterable[float] | Iterable[int]) -> bytes:
    """Token ids / logprobs as a blob (JSON: exact for ints and, via shortest repr, for floats)."""
    return json.dumps(list(values), separators=(",", ":")).encode()


def decode_numbers(blob: bytes) -> list[Any]:
    return list(json.loads(blob))


@dataclass
class Sample:
    sample_id: str
    step: int
    group: int
    traj: str
    turn: int
    problem_id: str
    text: str
    prompt_ref: str | None
    completion_ref: str | None
    logprobs_ref: str | None
    policy_version: int
    position: int
    verdict: dict[str, Any] | None = None
    failed: str | None = None


@dataclass
class Step:
    step: int
    problem_ids: list[str] = field(default_factory=list)
    samples: dict[str, Sample] = field(default_factory=dict)
    update: dict[str, Any] | None = None
    checkpoint: str | None = None
    turns_completed: set[str] = field(default_factory=set)
    """Sample ids whose `TurnCompleted` is recorded."""
    completed: dict[str, dict[str, Any]] = field(default_factory=dict)
    """traj → its `TrajectoryCompleted` payload."""

    @property
    def done(self) -> bool:
        """The step's update is committed: its checkpoint is saved and recorded."""
        return self.checkpoint is not None

    def pending(self) -> list[Sample]:
        """Samples still waiting for a verdict."""
        return [s for s in self.samples.values() if s.verdict is None and s.failed is None]

    def trajectories(self) -> dict[str, list[Sample]]:
        """traj → its samples in turn order (a single-turn step has one sample per trajectory)."""
        out: dict[str, list[Sample]] = {}
        for s in sorted(self.samples.values(), key=lambda s: (s.group, s.traj, s.turn)):
            out.setdefault(s.traj, []).append(s)
        return out


@dataclass
class RunState:
    run_id: str
    config: dict[str, Any] = field(default_factory=dict)
    backend: str = ""
    model: str = ""
    steps: dict[int, Step] = field(default_factory=dict)
    status: str | None = None
    last_position: int = 0

    def step(self, number: int) -> Step:
        return self.steps.setdefault(number, Step(number))

    def last_done_step(self) -> Step | None:
        done = [s for s in self.steps.values() if s.done]
        return max(done, key=lambda s: s.step) if done else None


class Replayer:
    """A run's state kept current by folding in only the events appended since the last `update`: the
    multi-turn driver calls it after every verdict, so it must not re-read the whole run each time."""

    def __init__(self, store: EventStore, run_id: str) -> None:
        self.store = store
        self.state = RunState(run_id)
        self._by_id: dict[str, Sample] = {}

    def update(self, upto: int | None = None) -> RunState:
        for event in self.store.read(run_id=self.state.run_id, after=self.state.last_position, upto=upto):
            apply(self.state, self._by_id, event)
        return self.state


def replay_run(store: EventStore, run_id: str, upto: int | None = None) -> RunState:
    """The run's state after every event up to position `upto` (all of them by default)."""
    return Replayer(store, run_id).update(upto)


def apply(state: RunState, by_id: dict[str, Sample], event: Event) -> None:
    """Fold one event into the state (events of other types are ignored)."""
    p = event.payload
    state.last_position = event.position
    if event.type == RunStarted.event_type:
        state.config, state.backend, state.model = p["config"], p["backend"], p["model"]
    elif event.type == ProblemsSelected.event_type:
        state.step(p["step"]).problem_ids = list(p["problem_ids"])
    elif event.type == SampleGenerated.event_type:
        sample = Sample(event.key, p["step"], p["group"], p["traj"], p["turn"], p["problem_id"], p["text"],
                        p.get("prompt_ref"), p.get("completion_ref"), p.get("logprobs_ref"),
                        p.get("policy_version", 0), event.position)  # fmt: skip
        state.step(sample.step).samples[sample.sample_id] = sample
        by_id[sample.sample_id] = sample
    elif event.type == KernelEvaluated.event_type:
        if p["sample_id"] in by_id:
            by_id[p["sample_id"]].verdict = p["result"]
    elif event.type == EvalFailed.event_type:
        if p["sample_id"] in by_id:
            by_id[p["sample_id"]].failed = p["error"]
    elif event.type == TurnCompleted.event_type:
        sample = by_id.get(p.get("sample_id") or "")
        if sample is not None:
            state.step(sample.step).turns_completed.add(sample.sample_id)
    elif event.type == TrajectoryCompleted.event_type and p.get("step") is not None:
        state.step(p["step"]).completed[p["traj"]] = p
    elif event.type == PolicyUpdated.event_type:
        state.step(p["step"]).update = p
    elif event.type == CheckpointSaved.event_type and p.get("step") is not None:
        state.step(p["step"]).checkpoint = p["path"]
    elif event.type == RunFinished.event_type:
        state.status = p["status"]


@dataclass
class StepScores:
    """What the update of one step uses, by sample id."""

    rewards: dict[str, float]
    advantages: dict[str, float]
    breakdowns: dict[str, RewardBreakdown]


def step_advantages(step: Step, weights: RewardWeights, gamma: float, normalize_std: bool = False,
                    baseline: str = "per_turn") -> StepScores:  # fmt: skip
    """Rewards of every judged sample, discounted returns along each trajectory, group-relative advantages."""
    breakdowns = {s.sample_id: score(s.verdict, weights) for s in step.samples.values() if s.verdict is not None}
    groups: dict[int, dict[str, list[Sample]]] = {}
    for s in sorted(step.samples.values(), key=lambda s: (s.group, s.traj, s.turn)):
        if s.sample_id in breakdowns:
            groups.setdefault(s.group, {}).setdefault(s.traj, []).append(s)
    ordered = [list(trajs.values()) for _, trajs in sorted(groups.items())]
    scores = [[[breakdowns[s.sample_id].total for s in traj] for traj in group] for group in ordered]
    advantages = trajectory_advantages(scores, gamma=gamma, normalize_std=normalize_std, baseline=baseline)
    by_sample: dict[str, float] = {}
    for group, group_adv in zip(ordered, advantages, strict=True):
        for traj, traj_adv in zip(group, group_adv, strict=True):
            for s, a in zip(traj, traj_adv, strict=True):
                by_sample[s.sample_id] = a
    rewards = {sid: b.total for sid, b in breakdowns.items()}
    return StepScores(rewards, by_sample, breakdowns)


def run_step_scores(step: Step, cfg: Any, weights: RewardWeights | None = None,
                    gamma: float | None = None) -> StepScores:  # fmt: skip
    """`step_advantages` with a run's settings (a `TrainConfig`): what the live update, the projections
    and `kbrl replay` all call, so none of them can pick different settings. `weights`/`gamma`: what-if."""
    return step_advantages(step, weights or cfg.reward_weights(), cfg.gamma if gamma is None else gamma,
                           cfg.normalize_advantages_std, cfg.multiturn_baseline)  # fmt: skip


def step_metrics(step: Step, scores: StepScores, n_steps: int | None = None) -> dict[str, float]:
    """Per-step scalars for logs and TensorBoard. One definition for every view (trainer, dashboard,
    `kbrl replay`): `kbrl.metrics.projections.step_scalars`, whose docstring lists the names."""
    from kbrl.metrics.projections import step_scalars

    return step_scalars(step, scores, n_steps=n_steps)


def replay_advantages(store: EventStore, run_id: str, weights: RewardWeights | None = None,
                      gamma: float | None = None) -> dict[int, tuple[StepScores, Mapping[str, Any] | None]]:  # fmt: skip
    """Every step's scores recomputed from the log, next to what its live update recorded.

    Without `weights`/`gamma`, the run's own settings (from its `RunStarted` config) are used, so the result
    must equal the logged `PolicyUpdated.advantages` exactly.
    """
    return advantages_of(replay_run(store, run_id), weights, gamma)


def run_config(state: RunState) -> Any:
    """The `TrainConfig` a training run recorded in its `RunStarted` event."""
    from kbrl.config import TrainConfig

    if not state.config:
        raise ValueError(f"run {state.run_id!r} has no RunStarted event: not a training run")
    return TrainConfig.model_validate(state.config)


def advantages_of(state: RunState, weights: RewardWeights | None = None,
                  gamma: float | None = None) -> dict[int, tuple[StepScores, Mapping[str, Any] | None]]:  # fmt: skip
    """`replay_advantages` on a state already replayed."""
    cfg = run_config(state)
    return {n: (run_step_scores(step, cfg, weights, gamma), step.update)
            for n, step in sorted(state.steps.items()) if step.samples}  # fmt: skip

"""Metric projections on hand-built event logs, checked against numbers computed by hand; the TensorBoard
files they write, read back with tensorboard's own reader; the incremental fold equal to a full replay."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from kbrl.config import TrainConfig, config_to_dict
from kbrl.events.payloads import (
    CheckpointSaved,
    EvalFailed,
    EvalRequested,
    EvalRunStarted,
    KernelEvaluated,
    PolicyUpdated,
    ProblemsSelected,
    RunStarted,
    SampleGenerated,
)
from kbrl.events.store import EventStore, NewEvent
from kbrl.metrics.projections import (
    MetricsLogger,
    RunProjection,
    fmt,
    level_of,
    log_step,
    print_metrics,
    project_run,
    worker_idle_fraction,
    write_tensorboard,
)
from kbrl.training.replay import replay_run, step_metrics

RUN = "fixture"


def verdict(category: str, fmt_ok: bool, compiled: bool, speedup: Any = None) -> dict[str, Any]:
    return {"category": category, "format_ok": fmt_ok, "compiled": compiled, "correct": category == "CORRECT",
            "backend": "triton", "speedup_eager": speedup, "speedup_compile": None, "feedback": f"{category} fb"}  # fmt: skip


def started(**overrides: Any) -> NewEvent:
    # Stage-1 weights (format 0.3, compile 0.5, correctness 0.2, speed 0, cheat -1), gamma 0.4.
    cfg = TrainConfig(backend="local", model_name="tiny", n_steps=4, group_size=2, **overrides)
    return NewEvent(RUN, f"run/{RUN}", f"{RUN}/started", RunStarted(config=config_to_dict(cfg), backend="local", model="tiny"))


def sample(step: int, group: int, j: int, problem: str, turn: int = 0, text: str = "code") -> NewEvent:
    traj = f"s{step}/g{group}/t{j}"
    return NewEvent(RUN, f"traj/{traj}", f"{RUN}/{traj}/turn{turn}",
                    SampleGenerated(step=step, group=group, traj=traj, turn=turn, problem_id=problem, text=text))  # fmt: skip


def judged(sample_key: str, problem: str, result: dict[str, Any], seconds: float = 1.5) -> NewEvent:
    sid = sample_key
    return NewEvent(RUN, f"sample/{sid}", f"{RUN}/{sid}/evaluated",
                    KernelEvaluated(sample_id=sid, problem_id=problem, worker="w0", result=result, seconds=seconds))  # fmt: skip


TIMINGS = {"time/total_s": 10.0, "time/rollout_s": 7.0, "time/sample_s": 3.0, "time/eval_s": 4.0,
           "time/train_s": 2.5, "time/save_s": 0.5, "train/loss": 0.5, "train/n_datums": 4.0}  # fmt: skip


def single_turn_events() -> list[NewEvent]:
    """Step 0: two groups (L1/5 and L2/1), five samples, one the evaluator could not judge; updated.
    Step 1: one sample still waiting for its verdict."""
    l1, l2 = "builtin/L1/5", "builtin/L2/1"
    k = f"{RUN}/s0/g"  # sample ids are the SampleGenerated keys
    return [
        started(),
        NewEvent(RUN, "step/0", f"{RUN}/s0/problems", ProblemsSelected(step=0, problem_ids=[l1, l2])),
        sample(0, 0, 0, l1), sample(0, 0, 1, l1), sample(0, 1, 0, l2), sample(0, 1, 1, l2), sample(0, 1, 2, l2),
        judged(f"{k}0/t0/turn0", l1, verdict("CORRECT", True, True, 2.0)),  # reward 0.3 + 0.5 + 0.2 = 1.0
        judged(f"{k}0/t1/turn0", l1, verdict("FORMAT_ERROR", False, False)),  # 0.0
        judged(f"{k}1/t0/turn0", l2, verdict("CHEAT", True, True, 50.0)),  # -1.0 (and its speedup ignored)
        judged(f"{k}1/t1/turn0", l2, verdict("CORRECTNESS_ERROR", True, True)),  # 0.3 + 0.5 = 0.8
        NewEvent(RUN, f"sample/{k}1/t2/turn0", f"{RUN}/{k}1/t2/turn0/failed",
                 EvalFailed(sample_id=f"{k}1/t2/turn0", problem_id=l2, worker="w0", error="reference broke")),
        NewEvent(RUN, "step/0", f"{RUN}/s0/updated", PolicyUpdated(step=0, loss=0.5, n_datums=4, lr=1e-3,
                 policy_version=1, metrics=TIMINGS)),
        NewEvent(RUN, "step/0", f"{RUN}/s0/checkpoint", CheckpointSaved(path="/ckpt/0", step=0, policy_version=1)),
        NewEvent(RUN, "step/1", f"{RUN}/s1/problems", ProblemsSelected(step=1, problem_ids=[l1])),
        sample(1, 0, 0, l1),
    ]  # fmt: skip


@pytest.fixture
def store(sqlite_url: str) -> EventStore:
    return EventStore(sqlite_url)


def test_single_turn_step_metrics_equal_hand_computed_values(store: EventStore) -> None:
    store.append(single_turn_events())
    proj = project_run(store, RUN)
    m = proj.step_scalars(0)
    rewards = [1.0, 0.0, -1.0, 0.8]
    mean = 0.2
    std = math.sqrt((0.8**2 + 0.2**2 + 1.2**2 + 0.6**2) / 4)  # population std = sqrt(0.62)
    expected = {
        "samples": 5.0, "eval/failed": 1.0, "eval/pending": 0.0,
        "reward/mean": mean, "reward/std": std, "reward/min": -1.0, "reward/max": 1.0,
        "eval/format_rate": 0.75, "eval/compile_rate": 0.75, "eval/correct_rate": 0.25, "eval/cheat_rate": 0.25,
        "eval/mean_speedup": 2.0,  # only the correct kernel's speedup counts
        "level/L1/reward_mean": 0.5, "level/L1/correct_rate": 0.5,
        "level/L2/reward_mean": -0.1, "level/L2/correct_rate": 0.0,
        "progress/completion_fraction": 0.25, "optim/learning_rate": 1e-3, **TIMINGS,
    }  # fmt: skip
    # No `rollout/worker_idle_frac`: the events were appended at one instant, so the rollout has no window.
    assert m.keys() == expected.keys()
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, abs=1e-12), key
    assert sorted(proj.scores(0).rewards.values()) == sorted(rewards)
    # Group advantages by hand: group 0 mean 0.5 → ±0.5; group 1 mean -0.1 → -0.9, +0.9 (the failed one: none).
    hist = proj.step_histograms(0)
    assert hist["hist/advantage"] == pytest.approx([0.5, -0.5, -0.9, 0.9])
    assert hist["hist/reward"] == pytest.approx(rewards)
    assert hist["hist/speedup"] == [2.0]
    assert "multiturn/success_rate" not in m  # single-turn: no turns > 0

    # A step still waiting: counted as pending, no reward or rates to show yet.
    m1 = proj.step_scalars(1)
    assert m1 == {"samples": 1.0, "eval/failed": 0.0, "eval/pending": 1.0, "progress/completion_fraction": 0.5}
    # replay's step_metrics (what older callers use) is the same function.
    state = replay_run(store, RUN)
    assert step_metrics(state.steps[0], proj.scores(0), n_steps=4) == m


def test_sample_rows_carry_verdicts_scores_and_levels(store: EventStore) -> None:
    store.append(single_turn_events())
    rows = {r.sample_id: r for r in project_run(store, RUN).sample_rows()}
    assert len(rows) == 6
    correct = rows[f"{RUN}/s0/g0/t0/turn0"]
    assert (correct.category, correct.level, correct.speedup, correct.reward, correct.advantage, correct.final,
            correct.worker, correct.eval_seconds) == ("CORRECT", 1, 2.0, 1.0, 0.5, True, "w0", 1.5)  # fmt: skip
    failed = rows[f"{RUN}/s0/g1/t2/turn0"]
    assert failed.category is None and failed.failed == "reference broke" and failed.reward is None
    pending = rows[f"{RUN}/s1/g0/t0/turn0"]
    assert pending.category is None and pending.final is False and pending.level == 1


def test_multiturn_metrics_from_turns(store: EventStore) -> None:
    """Two trajectories of one group: A fails to compile, then is wrong, then CORRECT; B has no format, then
    fails to compile. Success 1/2, 2.5 turns on average, per-turn compile/correct rates by hand."""
    p = "builtin/L1/5"
    a = [verdict("COMPILATION_ERROR", True, False), verdict("CORRECTNESS_ERROR", True, True),
         verdict("CORRECT", True, True)]  # rewards 0.3, 0.8, 1.0
    b = [verdict("FORMAT_ERROR", False, False), verdict("COMPILATION_ERROR", True, False)]  # rewards 0.0, 0.3
    events = [started(), NewEvent(RUN, "step/0", f"{RUN}/s0/problems", ProblemsSelected(step=0, problem_ids=[p]))]
    for j, turns in enumerate((a, b)):
        for t, result in enumerate(turns):
            events.append(sample(0, 0, j, p, turn=t, text=f"turn {t}"))
            events.append(judged(f"{RUN}/s0/g0/t{j}/turn{t}", p, result))
    store.append(events)
    proj = project_run(store, RUN)
    m = proj.step_scalars(0)
    expected = {
        "multiturn/success_rate": 0.5, "multiturn/avg_turns": 2.5,
        "multiturn/turn_0/compile_rate": 0.0, "multiturn/turn_0/correct_rate": 0.0,
        "multiturn/turn_1/compile_rate": 0.5, "multiturn/turn_1/correct_rate": 0.0,
        "multiturn/turn_2/compile_rate": 1.0, "multiturn/turn_2/correct_rate": 1.0,
    }  # fmt: skip
    assert {k: v for k, v in m.items() if k.startswith("multiturn/")} == pytest.approx(expected)
    assert m["reward/mean"] == pytest.approx((0.3 + 0.8 + 1.0 + 0.0 + 0.3) / 5)
    # Returns with γ = 0.4: A = [0.78, 1.2, 1.0], B = [0.12, 0.3]; centred per turn index: turn 0 mean 0.45,
    # turn 1 mean 0.75, turn 2 only A (advantage 0).
    adv = proj.scores(0).advantages
    assert [adv[f"{RUN}/s0/g0/t0/turn{t}"] for t in range(3)] == pytest.approx([0.33, 0.45, 0.0])
    assert [adv[f"{RUN}/s0/g0/t1/turn{t}"] for t in range(2)] == pytest.approx([-0.33, -0.45])
    assert [t for t in proj.trajectories(0)] == ["s0/g0/t0", "s0/g0/t1"]
    assert [s.turn for s in proj.trajectories(0)["s0/g0/t0"]] == [0, 1, 2]


def test_multiturn_mode_reports_turn_metrics_even_when_every_trajectory_ends_at_turn_0(store: EventStore) -> None:
    p = "builtin/L1/5"
    store.append([started(mode="multi_turn"), sample(0, 0, 0, p), sample(0, 0, 1, p),
                  judged(f"{RUN}/s0/g0/t0/turn0", p, verdict("CORRECT", True, True)),
                  judged(f"{RUN}/s0/g0/t1/turn0", p, verdict("FORMAT_ERROR", False, False))])  # fmt: skip
    m = project_run(store, RUN).step_scalars(0)
    assert m["multiturn/success_rate"] == 0.5 and m["multiturn/avg_turns"] == 1.0
    assert m["multiturn/turn_0/correct_rate"] == 0.5


def test_worker_idle_fraction_of_hand_made_intervals() -> None:
    # Window [0, 10], two workers. A: [1, 4] and [3, 6] overlap → busy 5 s; B: [2, 5] and [9, 12] clipped to
    # [9, 10] → busy 4 s. Idle = 1 - (5 + 4) / (2 · 10) = 0.55.
    intervals = [("A", 1.0, 4.0), ("A", 3.0, 6.0), ("B", 2.0, 5.0), ("B", 9.0, 12.0)]
    assert worker_idle_fraction(intervals, 0.0, 10.0) == pytest.approx(0.55, abs=1e-12)
    # An interval before the window counts for its worker (n_w = 3) but adds no busy time: 1 - 9 / 30.
    assert worker_idle_fraction([*intervals, ("C", -5.0, -1.0)], 0.0, 10.0) == pytest.approx(0.7, abs=1e-12)
    # One worker always busy: never idle. No window or no evaluations: nothing to report.
    assert worker_idle_fraction([("A", 0.0, 10.0), ("A", 2.0, 3.0)], 0.0, 10.0) == 0.0
    assert worker_idle_fraction(intervals, 5.0, 5.0) is None
    assert worker_idle_fraction([], 0.0, 10.0) is None


def test_worker_idle_fraction_of_a_step_from_event_times(store: EventStore) -> None:
    """The projection's `rollout/worker_idle_frac`: window from the step's first sample to its last verdict,
    each verdict's evaluation [recorded_at - seconds, recorded_at] on its worker."""
    from datetime import UTC, datetime, timedelta

    l1 = "builtin/L1/5"
    k = f"{RUN}/s0/g0"
    store.append([started(), sample(0, 0, 0, l1), sample(0, 0, 1, l1), sample(0, 0, 2, l1),
                  judged(f"{k}/t0/turn0", l1, verdict("CORRECT", True, True), seconds=3.0),
                  judged(f"{k}/t1/turn0", l1, verdict("CORRECT", True, True), seconds=3.0),
                  judged(f"{k}/t2/turn0", l1, verdict("CORRECT", True, True), seconds=1.0)])  # fmt: skip
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    sampled = {f"{k}/t0/turn0": 0.0, f"{k}/t1/turn0": 1.0, f"{k}/t2/turn0": 2.0}  # seconds after t0
    judged_at = {f"{k}/t0/turn0": (4.0, "A"), f"{k}/t1/turn0": (6.0, "A"), f"{k}/t2/turn0": (10.0, "B")}
    events = []
    for e in store.read(run_id=RUN):
        if e.type == "KernelEvaluated":
            seconds, worker = judged_at[e.payload["sample_id"]]
            e = e._replace(created_at=t0 + timedelta(seconds=seconds), payload={**e.payload, "worker": worker})
        else:
            e = e._replace(created_at=t0 + timedelta(seconds=sampled.get(e.key, 0.0)))
        events.append(e)
    proj = RunProjection(RUN)
    proj.feed(events)
    # Window [0, 10]; A ran [1, 4] and [3, 6] (busy 5 s), B ran [9, 10] (1 s): idle = 1 - 6 / 20 = 0.7.
    m = proj.step_scalars(0)
    assert m["rollout/worker_idle_frac"] == pytest.approx(0.7, abs=1e-9)
    assert m["rollout/workers"] == 2.0


def test_incremental_update_equals_full_replay(store: EventStore) -> None:
    """The live dashboard folds only new events into its projection; the result must equal a fresh one."""
    events = single_turn_events()
    live = RunProjection(RUN)
    for cut in (4, 8, len(events)):
        store.append(events[:cut])
        live.update(store)
        fresh = project_run(store, RUN)
        assert live.scalars() == fresh.scalars()
        assert live.sample_rows() == fresh.sample_rows()
    assert live.update(store) == 0  # nothing new: nothing read twice
    assert live.last_position == store.last_position(RUN)


def test_eval_run_rows_come_from_requests_and_verdicts(store: EventStore) -> None:
    run = "eval-x"
    p = "builtin/L1/5"
    store.append([
        NewEvent(run, f"run/{run}", f"{run}/started", EvalRunStarted(kind="dashboard", n_candidates=2)),
        NewEvent(run, "sample/a", f"{run}/a/requested", EvalRequested(sample_id="a", problem_id=p, text="kernel A")),
        NewEvent(run, "sample/b", f"{run}/b/requested", EvalRequested(sample_id="b", problem_id=p, text="kernel B")),
        NewEvent(run, "sample/a", f"{run}/a/evaluated",
                 KernelEvaluated(sample_id="a", problem_id=p, worker="gpu0", result=verdict("CORRECT", True, True, 1.5))),
    ])  # fmt: skip
    proj = project_run(store, run)
    rows = {r.sample_id: r for r in proj.sample_rows()}
    assert (rows["a"].category, rows["a"].speedup, rows["a"].worker, rows["a"].step) == ("CORRECT", 1.5, "gpu0", None)
    assert rows["b"].category is None and proj.text("b") == "kernel B"
    assert proj.scalars() == {}  # no training steps


def test_tensorboard_files_hold_the_projected_scalars_and_histograms(store: EventStore, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    store.append(single_turn_events())
    log_dir = tmp_path / "tensorboard"
    assert write_tensorboard(store, RUN, log_dir, histogram_every=1) == 2
    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    proj = project_run(store, RUN)
    for number in (0, 1):
        for tag, value in proj.step_scalars(number).items():
            points = {e.step: e.value for e in acc.Scalars(tag)}
            assert points[number] == pytest.approx(value, rel=1e-6), tag  # stored as float32
    assert {e.step: e.value for e in acc.Scalars("reward/mean")} == {0: pytest.approx(0.2)}
    assert set(acc.Tags()["histograms"]) == {"hist/reward", "hist/advantage", "hist/speedup"}
    (reward_hist,) = acc.Histograms("hist/reward")
    assert (reward_hist.step, reward_hist.histogram_value.num) == (0, 4)
    assert reward_hist.histogram_value.sum == pytest.approx(0.8)
    assert (reward_hist.histogram_value.min, reward_hist.histogram_value.max) == (-1.0, 1.0)


def test_log_step_writes_histograms_only_every_n_steps(store: EventStore, tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = single_turn_events()
    # Give step 1 a verdict so it has a reward histogram too.
    events.append(judged(f"{RUN}/s1/g0/t0/turn0", "builtin/L1/5", verdict("CORRECT", True, True)))
    store.append(events)
    proj = project_run(store, RUN)
    with MetricsLogger(tmp_path / "tb") as logger:
        written = [log_step(logger, proj, n, histogram_every=2) for n in (0, 1)]
    assert written == [proj.step_scalars(0), proj.step_scalars(1)]
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"histograms": 0})
    acc.Reload()
    assert [h.step for h in acc.Histograms("hist/reward")] == [0]


def test_level_and_number_format() -> None:
    assert [level_of(p) for p in ("builtin/L1/5", "kernelbench/L3/42", "L2/7", "custom/x")] == [1, 3, 2, None]
    assert (fmt(0.125), fmt(None), fmt(2.0, 2)) == ("0.1250", "-", "2.00")


def test_print_metrics_json_is_the_projection(store: EventStore, sqlite_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`kbrl replay RUN --metrics --json` prints the same scalars TensorBoard and the dashboard get."""
    import json

    store.append(single_turn_events())
    assert print_metrics(sqlite_url, RUN, as_json=True) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    proj = project_run(store, RUN)
    assert lines == [{"step": n, **proj.step_scalars(n)} for n in (0, 1)]
    assert print_metrics(sqlite_url, "no-such-run", as_json=True) == 1

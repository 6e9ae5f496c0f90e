"""Replay of a training run's events into rewards and advantages, on a hand-built event log."""

from __future__ import annotations

import pytest

from kbrl.events import payloads as p
from kbrl.events.store import EventStore, NewEvent
from kbrl.training.replay import decode_numbers, encode_numbers, replay_run, step_advantages
from kbrl.training.rewards import preset

CORRECT = {"problem_id": "builtin/L1/5", "category": "CORRECT", "format_ok": True, "compiled": True, "correct": True}
FORMAT = {"problem_id": "builtin/L1/5", "category": "FORMAT_ERROR", "format_ok": False, "compiled": False, "correct": False}
NO_BUILD = {"problem_id": "builtin/L1/5", "category": "COMPILATION_ERROR", "format_ok": True, "compiled": False,
            "correct": False}  # fmt: skip


def _sample(run: str, step: int, group: int, j: int, turn: int = 0) -> NewEvent:
    traj = f"s{step}/g{group}/t{j}"
    return NewEvent(run, f"traj/{traj}", f"{run}/{traj}/turn{turn}",
                    p.SampleGenerated(step=step, group=group, traj=traj, turn=turn, problem_id="builtin/L1/5",
                                      text=f"answer {j}"))  # fmt: skip


def _verdict(run: str, sample_id: str, result: dict) -> NewEvent:
    return NewEvent(run, f"sample/{sample_id}", f"{run}/{sample_id}/evaluated",
                    p.KernelEvaluated(sample_id=sample_id, problem_id="builtin/L1/5", worker="w", result=result))  # fmt: skip


@pytest.fixture
def store(tmp_path) -> EventStore:
    return EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")


def test_single_turn_group_advantages_by_hand(store: EventStore) -> None:
    run = "r"
    samples = [_sample(run, 0, 0, j) for j in range(5)]
    store.append(samples)
    results = [CORRECT, FORMAT, NO_BUILD, NO_BUILD]
    store.append([_verdict(run, s.key, r) for s, r in zip(samples, results)])
    store.append_one(NewEvent(run, "x", "failed", p.EvalFailed(sample_id=samples[4].key, worker="w", error="boom")))
    step = replay_run(store, run).steps[0]
    assert step.pending() == [] and step.samples[samples[4].key].failed == "boom"
    scores = step_advantages(step, preset(1), gamma=0.4)
    # stage 1: format 0.3, compile 0.5, correctness 0.2 → rewards 1.0, 0.0, 0.3, 0.3; mean 0.4
    assert [scores.rewards[s.key] for s in samples[:4]] == pytest.approx([1.0, 0.0, 0.3, 0.3])
    assert [scores.advantages[s.key] for s in samples[:4]] == pytest.approx([0.6, -0.4, -0.1, -0.1])
    assert samples[4].key not in scores.advantages  # no verdict: no reward, no datum


def test_groups_are_separate_and_multi_turn_returns_are_discounted(store: EventStore) -> None:
    run = "r"
    # group 0: two trajectories of two turns; group 1: two single-turn samples with equal rewards
    events = [_sample(run, 0, 0, 0, 0), _sample(run, 0, 0, 0, 1), _sample(run, 0, 0, 1, 0), _sample(run, 0, 0, 1, 1),
              _sample(run, 0, 1, 0), _sample(run, 0, 1, 1)]  # fmt: skip
    store.append(events)
    results = [FORMAT, CORRECT, NO_BUILD, NO_BUILD, CORRECT, CORRECT]
    store.append([_verdict(run, e.key, r) for e, r in zip(events, results)])
    scores = step_advantages(replay_run(store, run).steps[0], preset(1), gamma=0.4)
    # traj 0: scores (0, 1) → returns (0 + 0.4·1, 1) = (0.4, 1); traj 1: (0.3, 0.3) → (0.42, 0.3)
    # turn 0: mean(0.4, 0.42) = 0.41 → (-0.01, 0.01); turn 1: mean(1, 0.3) = 0.65 → (0.35, -0.35)
    adv = [scores.advantages[e.key] for e in events]
    assert adv[:4] == pytest.approx([-0.01, 0.35, 0.01, -0.35])
    assert adv[4:] == [0.0, 0.0]  # a zero-variance group


def test_number_blobs_round_trip_exactly() -> None:
    logprobs = [-0.1, -1e-12, -3.3333333333333335, 0.0]
    assert decode_numbers(encode_numbers(logprobs)) == logprobs
    assert decode_numbers(encode_numbers([1, 2, 300000])) == [1, 2, 300000]

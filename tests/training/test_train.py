"""`kbrl train` end to end on CPU: tiny local model, built-in problems, LocalQueue, SQLite — killed with
SIGKILL in the middle of a step, resumed, and checked against its own event log."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from kbrl.events.payloads import PolicyUpdated, RunFinished, SampleGenerated
from kbrl.events.store import EventStore
from kbrl.training.replay import replay_advantages, replay_run

N_STEPS = 4
PER_STEP = 2 * 4  # batch_size × group_size of the tiny_cpu config


def _kbrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "kbrl.cli", *args]


def test_train_killed_mid_step_resumes_without_losing_or_repeating_work(
    tmp_path: Path, kbrl_train_killed_when: Callable[..., tuple[dict[str, str], EventStore]]
) -> None:
    def step_sampled_not_updated(store: EventStore) -> bool:
        s = replay_run(store, "e2e").steps.get(2)
        return s is not None and len(s.samples) > 0 and s.update is None

    env, store = kbrl_train_killed_when(
        ["--config", "tiny_cpu", "run_id=e2e", f"n_steps={N_STEPS}", f"log_path={tmp_path}/runs/{{run_id}}"],
        step_sampled_not_updated, 300, "step 2 was never sampled")
    at_kill = replay_run(store, "e2e")
    assert at_kill.steps[2].update is None, "the kill was meant to land between sampling and update"
    sampled_before = {sid: s.text for sid, s in at_kill.steps[2].samples.items()}
    assert [n for n, s in sorted(at_kill.steps.items()) if s.done] == [0, 1]

    resumed = subprocess.run(_kbrl("train", "--resume", "e2e"), env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "resuming e2e after step 1" in resumed.stdout

    state = replay_run(store, "e2e")
    assert sorted(state.steps) == list(range(N_STEPS)) and all(s.done for s in state.steps.values())
    assert store.count("e2e", [PolicyUpdated]) == N_STEPS  # no step updated twice
    for step in state.steps.values():
        assert len(step.samples) == PER_STEP, f"step {step.step}: {len(step.samples)} samples"
        assert all(s.verdict is not None for s in step.samples.values())  # every sample evaluated
    assert store.count("e2e", [SampleGenerated]) == N_STEPS * PER_STEP  # none lost, none drawn twice
    for sid, text in sampled_before.items():  # the interrupted step kept the samples it had drawn
        assert state.steps[2].samples[sid].text == text

    # The machinery really trained: some step had reward variance, so datums and an optimizer step.
    updates = [s.update for s in state.steps.values()]
    assert any(u["n_datums"] > 0 for u in updates) and updates[-1]["policy_version"] > 0
    categories = {s.verdict["category"] for st in state.steps.values() for s in st.samples.values()}
    assert len(categories) > 1, categories

    # Replay reproduces the live numbers exactly, through the library and through the CLI.
    for number, (scores, update) in replay_advantages(store, "e2e").items():
        assert update is not None
        assert scores.advantages == update["advantages"] and scores.rewards == update["rewards"], number
    check = subprocess.run(_kbrl("replay", "e2e", "--advantages"), env=env, capture_output=True, text=True, timeout=120)
    assert check.returncode == 0 and "NO" not in check.stdout, check.stdout + check.stderr
    what_if = subprocess.run(_kbrl("replay", "e2e", "--reward-weights", "stage3", "--json"), env=env,
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert what_if.returncode == 0, what_if.stderr

    finished = [e.payload["status"] for e in store.read(run_id="e2e", types=[RunFinished])]
    assert finished[-1] == "finished"
    from kbrl.metrics.tensorboard import read_scalars

    scalars = read_scalars(tmp_path / "runs" / "e2e" / "tensorboard")
    assert {step for step, _ in scalars["reward/mean"]} == set(range(N_STEPS))

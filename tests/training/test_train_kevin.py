"""`kbrl train --config kbrl/config/rl_kernelbench_kevin.yaml` end to end on CPU (tiny model, built-in problems,
LocalQueue, SQLite), SIGKILLed mid-trajectory and resumed: the resumed run continues each trajectory at the
turn where its events stop, samples and evaluates nothing twice, and `kbrl replay --advantages` reproduces
the logged advantages."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from kbrl.events.payloads import (
    EvalFailed,
    EvalRequested,
    KernelEvaluated,
    PolicyUpdated,
    RunFinished,
    SampleGenerated,
    TrajectoryCompleted,
    TurnCompleted,
)
from kbrl.events.store import EventStore
from kbrl.training.replay import replay_advantages, replay_run

ROOT = Path(__file__).resolve().parents[2]
N_STEPS, BATCH, GROUP, TURNS = 2, 2, 2, 2
# Stage 3 (the Kevin config's) measures performance, so a trajectory keeps going after a correct turn and
# every trajectory takes both turns: 2 problems × 2 trajectories × 2 turns per step.
PER_STEP = BATCH * GROUP * TURNS


def _kbrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "kbrl.cli", *args]


@pytest.mark.slow  # 1-2 min on 2 cores: CI runs it in its slow pass
def test_kevin_train_killed_mid_trajectory_resumes_at_the_right_turn(
    tmp_path: Path, kbrl_train_killed_when: Callable[..., tuple[dict[str, str], EventStore]]
) -> None:
    config = str(ROOT / "kbrl" / "config" / "rl_kernelbench_kevin.yaml")
    overrides = ["run_id=kevin", f"n_steps={N_STEPS}", f"batch_size={BATCH}", f"group_size={GROUP}",
                 f"max_turns={TURNS}", "model_name=tiny", "backend=local", "problem_source=builtin",
                 "problem_ids=[builtin/L1/5, builtin/L1/6]", "max_tokens=320", "max_prompt_tokens=4096",
                 "learning_rate=3e-3", "lora_rank=8", "eval_device=cpu", "eval_n_trials=2", "eval_timeout_s=120",
                 f"log_path={tmp_path}/runs/{{run_id}}"]  # fmt: skip

    def mid_trajectory(store: EventStore) -> bool:
        """Step 1 has a turn-1 sample and is not updated: some trajectory is past its first turn."""
        s = replay_run(store, "kevin").steps.get(1)
        return s is not None and s.update is None and any(x.turn >= 1 for x in s.samples.values())

    env, store = kbrl_train_killed_when(["--config", config, *overrides], mid_trajectory, 600,
                                        "step 1 never reached turn 1")  # fmt: skip
    at_kill = replay_run(store, "kevin")
    killed = at_kill.steps[1]
    assert killed.update is None and at_kill.steps[0].done
    sampled_before = {sid: s.text for sid, s in killed.samples.items()}
    turns_before = Counter(s.traj for s in killed.samples.values())
    assert max(turns_before.values()) >= 2  # a trajectory had its turn 1 sampled when the run died
    assert len(killed.completed) < BATCH * GROUP  # ... and the step had trajectories unfinished

    resumed = subprocess.run(_kbrl("train", "--resume", "kevin"), env=env, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert "resuming kevin after step 0" in resumed.stdout

    state = replay_run(store, "kevin")
    assert sorted(state.steps) == list(range(N_STEPS)) and all(s.done for s in state.steps.values())
    assert store.count("kevin", [PolicyUpdated]) == N_STEPS
    for sid, text in sampled_before.items():  # the interrupted step kept the turns it had drawn
        assert state.steps[1].samples[sid].text == text

    # Every (trajectory, turn) sampled once, judged once; turns contiguous from 0; each turn and trajectory
    # completed once.
    samples = [e.payload for e in store.read(run_id="kevin", types=[SampleGenerated])]
    keys = Counter((p["traj"], p["turn"]) for p in samples)
    assert len(samples) == N_STEPS * PER_STEP and set(keys.values()) == {1}, keys
    by_traj: dict[str, list[int]] = {}
    for traj, turn in keys:
        by_traj.setdefault(traj, []).append(turn)
    assert len(by_traj) == N_STEPS * BATCH * GROUP
    assert all(sorted(turns) == list(range(TURNS)) for turns in by_traj.values()), by_traj
    verdicts = Counter(e.payload["sample_id"] for e in store.read(run_id="kevin", types=[KernelEvaluated]))
    sample_ids = {e.key for e in store.read(run_id="kevin", types=[SampleGenerated])}
    assert set(verdicts) == sample_ids and set(verdicts.values()) == {1}
    assert store.count("kevin", [EvalFailed]) == 0
    assert store.count("kevin", [EvalRequested]) == len(sample_ids)  # each turn queued once (keys dedupe)
    turns_done = Counter((e.payload["traj"], e.payload["turn"]) for e in store.read(run_id="kevin", types=[TurnCompleted]))
    assert set(turns_done) == set(keys) and set(turns_done.values()) == {1}
    trajs_done = Counter(e.payload["traj"] for e in store.read(run_id="kevin", types=[TrajectoryCompleted]))
    assert set(trajs_done) == set(by_traj) and set(trajs_done.values()) == {1}
    # The resumed run picked each unfinished trajectory up where its events stopped: whatever turn the kill
    # left it at, it now has exactly TURNS turns (above), and the turns it had were not redrawn (above).

    # Replay reproduces the live numbers exactly, through the library and through the CLI.
    for number, (scores, update) in replay_advantages(store, "kevin").items():
        assert update is not None
        assert scores.advantages == update["advantages"] and scores.rewards == update["rewards"], number
        assert set(update["advantages"]) == {sid for sid, s in state.steps[number].samples.items()}
    check = subprocess.run(_kbrl("replay", "kevin", "--advantages"), env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    assert check.returncode == 0 and "NO" not in check.stdout, check.stdout + check.stderr
    assert [e.payload["status"] for e in store.read(run_id="kevin", types=[RunFinished])][-1] == "finished"

    # Each step's worker usage is projected from the verdicts of the in-process pool's two named workers.
    from kbrl.metrics.projections import project_run

    projection = project_run(store, "kevin")
    workers = {e.payload["worker"] for e in store.read(run_id="kevin", types=[KernelEvaluated])}
    assert workers <= {"local/0", "local/1"}, workers
    for number in range(N_STEPS):
        m = projection.step_scalars(number)
        assert 0.0 <= m["rollout/worker_idle_frac"] < 1.0 and 1.0 <= m["rollout/workers"] <= 2.0, m

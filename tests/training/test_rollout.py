"""Multi-turn rollouts (Kevin mode) through the real evaluator, driven by a scripted policy.

The policy answers turn 0 with a Triton ReLU whose kernel misspells `tl.maximum`, and a later turn with
the kernel fixed by reading the misspelled name out of the evaluator's feedback. No model: the point is
the driver — events, turn prompts, returns, asynchrony — with the real queue, evaluator and store.
"""

from __future__ import annotations

import difflib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kbrl.config import load_config
from kbrl.events.payloads import KernelEvaluated, TrajectoryCompleted, TurnCompleted
from kbrl.events.store import EventStore
from kbrl.kernels.evaluator import EvalConfig
from kbrl.problems import builtin_solutions, get_problem
from kbrl.training.backends.base import AdamParams, Backend, SampledSequence
from kbrl.training.replay import replay_run, run_step_scores
from kbrl.training.rollout import StepRollout
from kbrl.workers.queue import CeleryQueue, LocalQueue

RELU = get_problem("builtin/L1/5")
GOOD = builtin_solutions(RELU)["triton"]
BROKEN = GOOD.replace("tl.maximum", "tl.maximun")
SLOW = "import time\ntime.sleep(20)\n"
EVAL = EvalConfig(device="cpu", n_trials=2, timeout_s=120)


class CharTokenizer:
    """Characters as token ids: enough for prompts to carry their text back to the scripted policy."""

    eos_token_id = 0
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


class ScriptedPolicy(Backend):
    """Turn 0: the broken kernel (the first of each group slow to evaluate when `slow_first`). Later turns:
    the previous kernel with the name the feedback reports missing replaced by the closest real one."""

    name = "scripted"

    def __init__(self, slow_first: bool = False) -> None:
        super().__init__()
        self.slow_first = slow_first
        self._tok = CharTokenizer()

    @property
    def tokenizer(self) -> CharTokenizer:
        return self._tok

    def sample(self, prompts: Sequence[Any], n: int, max_tokens: int, temperature: float = 1.0,
               stop: Any = None) -> list[list[SampledSequence]]:  # fmt: skip
        out = []
        for prompt in prompts:
            text = self._tok.decode(prompt)
            answers = [self._answer(text, j) for j in range(n)]
            out.append([SampledSequence(tuple(self._tok.encode(a)), tuple([-0.5] * len(a)), a, "stop") for a in answers])
        return out

    def _answer(self, prompt: str, j: int) -> str:
        missing = re.findall(r"has no attribute '(\w+)'", prompt)
        if not missing:  # the first turn
            return f"```python\n{SLOW if (self.slow_first and j == 0) else ''}{BROKEN}\n```"
        previous = re.findall(r"```python\n(.*?)```", prompt, flags=re.S)[-1]
        fix = difflib.get_close_matches(missing[-1], ["maximum", "minimum", "load", "store"], n=1)[0]
        return f"```python\n{previous.replace(missing[-1], fix)}```"

    def forward_backward(self, datums: Any, loss: str = "importance_sampling") -> dict[str, float]:
        return {"loss": 0.0}

    def optim_step(self, params: AdamParams) -> dict[str, float]:
        self._policy_version += 1
        return {}

    def save_checkpoint(self, name: str) -> str:
        return f"scripted://{name}"

    def load_checkpoint(self, path: str) -> None:
        pass

    def refresh_sampler(self) -> None:
        self._sampler_version = self._policy_version


def _rollout(store: EventStore, queue: Any, policy: Backend, group_size: int = 2) -> StepRollout:
    cfg = load_config(None, ["mode=multi_turn", "max_turns=3", f"group_size={group_size}", "eval_device=cpu"])
    return StepRollout(store=store, queue=queue, backend=policy, problems={RELU.id: RELU}, run_id="mt", cfg=cfg,
                       eval_config=EVAL, device="cpu", weights=cfg.reward_weights())  # fmt: skip


def _check_two_turn_trajectories(store: EventStore) -> None:
    step = replay_run(store, "mt").steps[0]
    trajs = step.trajectories()
    assert sorted(trajs) == ["s0/g0/t0", "s0/g0/t1"]
    for turns in trajs.values():
        assert [t.turn for t in turns] == [0, 1]
        assert [t.verdict["category"] for t in turns] == ["RUNTIME_ERROR", "CORRECT"]
        assert "tl.maximun" in turns[0].text and "tl.maximum" in turns[1].text
    completed = {e.payload["traj"]: e.payload for e in store.read(run_id="mt", types=[TrajectoryCompleted])}
    assert {k: (v["turns"], v["solved"], v["stopped"]) for k, v in completed.items()} == {
        "s0/g0/t0": (2, True, "solved"), "s0/g0/t1": (2, True, "solved")}  # fmt: skip
    turns_done = [(e.payload["traj"], e.payload["turn"], e.payload["category"], e.payload["done"])
                  for e in store.read(run_id="mt", types=[TurnCompleted])]  # fmt: skip
    assert sorted(turns_done) == [("s0/g0/t0", 0, "RUNTIME_ERROR", False), ("s0/g0/t0", 1, "CORRECT", True),
                                  ("s0/g0/t1", 0, "RUNTIME_ERROR", False), ("s0/g0/t1", 1, "CORRECT", True)]  # fmt: skip
    # Stage 1: turn 0 (format ok, compiled, wrong) = 0.3 + 0.5 = 0.8; turn 1 (correct) = 1.0.
    # Returns with γ = 0.4: R0 = 0.8 + 0.4·1.0 = 1.2, R1 = 1.0; both trajectories equal → advantages 0.
    cfg = load_config(None, ["mode=multi_turn"])
    scores = run_step_scores(step, cfg)
    assert [scores.rewards[t.sample_id] for t in trajs["s0/g0/t0"]] == pytest.approx([0.8, 1.0])
    assert set(scores.advantages.values()) == {0.0}
    # The turn-1 prompt shows the task, the broken kernel and its feedback.
    from kbrl.training.replay import decode_numbers

    prompt = "".join(chr(i) for i in decode_numbers(store.get_blob(trajs["s0/g0/t0"][1].prompt_ref)))
    assert RELU.code.strip() in prompt and "tl.maximun" in prompt and "Status: RUNTIME_ERROR" in prompt


def test_scripted_fix_through_local_queue(tmp_path: Path) -> None:
    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    queue = LocalQueue(store, workers=2)
    try:
        timings = _rollout(store, queue, ScriptedPolicy()).run(0, [RELU.id])
    finally:
        queue.close()
    _check_two_turn_trajectories(store)
    assert timings["rollout/turns"] == 4.0


def test_fast_trajectories_move_on_while_slow_ones_are_still_evaluated(tmp_path: Path) -> None:
    """Trajectory t0's kernel sleeps 20 s at import (margin on a loaded machine); t1's second turn is judged first."""
    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    queue = LocalQueue(store, workers=2)
    try:
        _rollout(store, queue, ScriptedPolicy(slow_first=True)).run(0, [RELU.id])
    finally:
        queue.close()
    position = {e.payload["sample_id"]: e.position for e in store.read(run_id="mt", types=[KernelEvaluated])}
    assert position["mt/s0/g0/t1/turn1"] < position["mt/s0/g0/t0/turn0"]
    assert replay_run(store, "mt").steps[0].completed.keys() == {"s0/g0/t0", "s0/g0/t1"}


def test_scripted_fix_through_a_celery_worker(tmp_path: Path) -> None:
    import socket

    try:
        socket.create_connection(("127.0.0.1", 6379), timeout=1).close()
    except OSError:
        pytest.skip("no Redis server at 127.0.0.1:6379")
    import redis

    db = 7
    redis.Redis(db=db).flushdb()
    url = f"sqlite:///{tmp_path / 'kbrl.db'}"
    env = dict(os.environ, KBRL_BROKER_URL=f"redis://127.0.0.1:6379/{db}", KBRL_DATABASE_URL=url,
               KBRL_WORKER_NAME="mt-worker")  # fmt: skip
    worker = subprocess.Popen([sys.executable, "-m", "kbrl.cli", "worker", "--cpu", "--concurrency", "2"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    store = EventStore(url)
    queue = CeleryQueue(store, env["KBRL_BROKER_URL"])
    try:
        _rollout(store, queue, ScriptedPolicy()).run(0, [RELU.id])
    finally:
        queue.close()
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
        redis.Redis(db=db).flushdb()
    _check_two_turn_trajectories(store)
    workers = {e.payload["worker"] for e in store.read(run_id="mt", types=[KernelEvaluated])}
    assert workers and all(w.startswith("mt-worker") for w in workers)


def test_eval_model_reports_what_each_turn_budget_buys(tmp_path: Path) -> None:
    """`kbrl eval-model --max-turns 2` with the scripted policy: nothing passes in one turn, all in two."""
    import json

    from kbrl.training.model_eval import evaluate_model

    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    queue = LocalQueue(store, workers=2)
    try:
        report = evaluate_model(ScriptedPolicy(), [RELU], k=2, max_tokens=4096, temperature=1.0,
                                kernel_backend="triton", store=store, queue=queue, eval_config=EVAL, device="cpu",
                                model_label="scripted", run_id="ev-mt", progress=False, max_turns=2,
                                out=tmp_path / "results.json")  # fmt: skip
    finally:
        queue.close()
    one, two = report.by_turn_budget[1], report.by_turn_budget[2]
    assert (one.pass_at[1], one.correct_rate, one.compile_rate) == (0.0, 0.0, 1.0)
    assert (two.pass_at[1], two.pass_at[2], two.correct_rate) == (1.0, 1.0, 1.0)
    assert two.fast_p[1.0] is None  # CPU: not timed, not zero
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["by_turn_budget"]["1"]["pass@1"] == 0.0 and summary["by_turn_budget"]["2"]["pass@1"] == 1.0
    assert store.count("ev-mt", [KernelEvaluated]) == 4

"""Kevin mode on a toy task whose turn-0 feedback tells the answer, through the real training path.

Environment: `SecretQueue`, a `JobQueue` whose verdict on a trajectory's turn says whether the answer's first
character is the trajectory's secret (one of K symbols, drawn from a hash of the trajectory id) and, in its
feedback text, what the secret is. Turn 0 cannot know it: whatever the policy does, its expected turn-0
reward is at most 1/K. Turn 1's prompt is built by the real rollout from that feedback, so a policy that
learns to copy the symbol from the feedback reaches reward 1 at turn 1.

Everything else is the real training path: `Trainer` (problem selection, `StepRollout` driving both turns,
`Replayer`, per-turn group advantages, datums, the `local` backend's importance-sampling update and AdamW,
checkpoints, `PolicyUpdated`). The policy is kbrl's tiny model with the K symbols given a head start
(`warm_started_model`: the same for every secret, so it teaches no copying; each turn starts at ≈ 1/K).

Shown: turn-1 reward rises over the steps (the policy learns to read the feedback) while turn-0 reward,
which nothing can raise, stays at chance; and the plumbing under it (the secret reaches exactly the turn-1
prompts, turn-1 samples are rewarded and trained on, the logged advantages replay).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from kbrl.config import load_config
from kbrl.events.payloads import KernelEvaluated
from kbrl.events.store import EventStore, NewEvent
from kbrl.problems.model import Problem
from kbrl.prompts import REFINE, Turn, refinement_messages, task_messages
from kbrl.training.replay import replay_run
from kbrl.training.trainer import Trainer, make_policy
from kbrl.workers.jobs import EvalJob, evaluated_key, load_text
from kbrl.workers.queue import record_requests

pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

CANDIDATES = "$%&?!^~|"
"""Symbols a secret may be: single tokens of the tiny tokenizer; those in the prompts' text are dropped."""

INIT_RANGE = 0.1
"""Weight init std of the toy policy: at kbrl's default 0.02 the tiny model's next token barely depends on
its context (changing the secret moves the symbols' logits by ~0.05 nats), so there is nothing for RL to
amplify; at 0.1 it moves them by ~0.5-1 nats."""
LEAD = 4.0

REFERENCE = "import torch\n\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n"


def toy_problems(n: int) -> list[Problem]:
    return [Problem("toy", 1, i + 1, f"copy{i + 1}", REFERENCE) for i in range(n)]


def secret_of(traj: str, symbols: str, seed: int) -> str:
    """The trajectory's secret: fixed by its id (so a re-evaluated turn gets the same one), uniform over K."""
    digest = hashlib.sha256(f"{seed}/{traj}".encode()).digest()
    return symbols[int.from_bytes(digest[:8], "big") % len(symbols)]


REPEAT = 64
"""How many times the feedback repeats the secret (see `feedback`)."""


def feedback(correct: bool, secret: str) -> str:
    """The verdict and the secret, repeated: a 2-layer random-init model's attention starts out averaging
    over the whole prompt, and a run of the secret makes that average carry it (one copy would be 1/600 of
    it), so learning to read it is a matter of steps, not of growing a sharp copying head."""
    status = "CORRECT" if correct else "CORRECTNESS_ERROR"
    return f"Status: {status}\nThe expected answer:\n{secret * REPEAT}"


class SecretQueue:
    """A `JobQueue` judging "does the answer start with the trajectory's secret?" and saying the secret.

    Verdicts go to the store as `KernelEvaluated` under the same key the real task body uses, so the
    rollout, replay and projections read them exactly as they read the evaluator's.
    """

    def __init__(self, store: EventStore, symbols: str, seed: int = 0) -> None:
        self.store, self.symbols, self.seed = store, symbols, seed

    def submit(self, jobs: Sequence[EvalJob]) -> None:
        record_requests(self.store, jobs)
        for job in jobs:
            traj = job.sample_id.removeprefix(f"{job.run_id}/").rsplit("/turn", 1)[0]
            secret = secret_of(traj, self.symbols, self.seed)
            correct = load_text(self.store, job).strip()[:1] == secret
            result = {"category": "CORRECT" if correct else "CORRECTNESS_ERROR", "format_ok": True, "compiled": True,
                      "correct": correct, "feedback": feedback(correct, secret), "stage_seconds": {"total": 0.0}}  # fmt: skip
            payload = KernelEvaluated(sample_id=job.sample_id, problem_id=job.problem_id, worker="toy", gpu="cpu",
                                      result=result, seconds=0.0)  # fmt: skip
            self.store.append_one(NewEvent(job.run_id, f"sample/{job.sample_id}",
                                           evaluated_key(job.run_id, job.sample_id), payload))  # fmt: skip

    def close(self) -> None:
        pass


def pick_symbols(k: int, tokenizer: object, problems: list[Problem]) -> str:
    """K candidate symbols that are one token each and appear nowhere in the task or refinement text, so
    the only copy of the secret a turn-1 prompt holds is the one in the feedback (and the turn-0 answer)."""
    text = "".join(m["content"] for m in task_messages(problems[0])) + REFINE + feedback(False, "")
    chosen = [c for c in CANDIDATES if c not in text and len(tokenizer.encode(c, add_special_tokens=False)) == 1]  # type: ignore[attr-defined]
    assert len(chosen) >= k, chosen
    return "".join(chosen[:k])


def warm_started_model(path: Path, k: int, problems: list[Problem], seed: int = 0) -> tuple[Path, str]:
    """The tiny model (init std `INIT_RANGE`) with the K symbols' unembedding rows moved along the mean final
    hidden state, so each symbol's logit is ~`LEAD` nats above the rest of the vocabulary on these prompts.

    No training on any prompt and the same shift for every secret: this gives the policy a base rate (~1/K
    per turn) without teaching it anything about the feedback. (A supervised warm start on random symbols
    washed the context dependence out: the next token then varied by < 0.01 nats with the secret.)
    """
    import random

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kbrl.training.backends.base import encode_chat
    from kbrl.training.tiny import build_tiny_model

    build_tiny_model(path, seed=seed, initializer_range=INIT_RANGE)
    tokenizer = AutoTokenizer.from_pretrained(path)
    symbols = pick_symbols(k, tokenizer, problems)
    rng = random.Random(seed)
    prompts = [task_messages(p) for p in problems]
    prompts += [refinement_messages(p, [Turn(rng.choice(symbols), feedback(False, rng.choice(symbols)))])
                for p in problems for _ in range(2)]  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = [tokenizer.encode(c, add_special_tokens=False)[0] for c in symbols]
    with torch.no_grad():
        hidden = torch.stack([model(input_ids=torch.tensor([encode_chat(tokenizer, m)]), output_hidden_states=True)
                              .hidden_states[-1][0, -1] for m in prompts])  # fmt: skip
        weight = model.get_output_embeddings().weight
        logits = hidden @ weight.T
        others = logits.clone()
        others[:, ids] = -float("inf")
        mean_h = hidden.mean(0)
        for i in ids:
            shift = float((others.max(-1).values + LEAD - logits[:, i]).mean())
            weight[i] += shift * mean_h / mean_h.dot(mean_h)
    model.save_pretrained(path)
    return path, symbols


def decoded_prompt(store: EventStore, ref: str | None, tokenizer: object) -> str:
    from kbrl.training.replay import decode_numbers

    assert ref is not None
    return tokenizer.decode(decode_numbers(store.get_blob(ref)))  # type: ignore[attr-defined]


def turn_rewards(store: EventStore, run_id: str) -> dict[int, list[float]]:
    """turn → that turn's mean reward per step, from the rewards each step's update recorded."""
    state = replay_run(store, run_id)
    out: dict[int, list[float]] = {}
    for number, step in sorted(state.steps.items()):
        assert step.update is not None, f"step {number} has no recorded update"
        by_turn: dict[int, list[float]] = {}
        for sid, reward in step.update["rewards"].items():
            by_turn.setdefault(step.samples[sid].turn, []).append(reward)
        for turn, values in by_turn.items():
            out.setdefault(turn, []).append(math.fsum(values) / len(values))
    return out


def run_toy(tmp_path: Path, *, n_steps: int, k: int = 4, n_problems: int = 4, group_size: int = 8,
            learning_rate: float = 3e-2, seed: int = 0) -> tuple[dict[int, list[float]], float, str]:  # fmt: skip
    """Train on the toy task (store: tmp_path/kbrl.db, run "toy"); returns the per-turn mean rewards by
    step, the training seconds and the secret symbols."""
    import torch

    problems = toy_problems(n_problems)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the host's cores are shared; one thread is also faster for this tiny model
    try:
        model, symbols = warm_started_model(tmp_path / "model", k, problems, seed=seed)
    finally:
        torch.set_num_threads(threads)
    cfg = load_config(None, [
        "backend=local", f"model_name={model}", "mode=multi_turn", "max_turns=2", f"n_steps={n_steps}",
        f"batch_size={n_problems}", f"group_size={group_size}", "max_tokens=1", f"learning_rate={learning_rate}",
        "lora_rank=8", "eval_device=cpu", "tensorboard_enabled=false", f"seed={seed}", "run_id=toy",
        f"log_path={tmp_path}/runs/{{run_id}}", "dataset_builder.reward_format_weight=0",
        "dataset_builder.reward_compile_weight=0", "dataset_builder.reward_correctness_weight=1",
        "dataset_builder.measure_performance=true",  # every trajectory takes both turns, even if turn 0 hit
    ])  # fmt: skip
    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    log_path = tmp_path / "runs" / "toy"
    log_path.mkdir(parents=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    backend = make_policy(cfg, log_path, problems)
    started = time.perf_counter()
    try:
        Trainer(cfg, store, SecretQueue(store, symbols, seed), backend, problems, "toy", log_path).run()
    finally:
        backend.close()
        torch.set_num_threads(threads)
    return turn_rewards(store, "toy"), time.perf_counter() - started, symbols


@pytest.mark.slow
def test_turn_1_reward_rises_by_reading_the_feedback(tmp_path: Path) -> None:
    """10 steps of 4 problems × 8 two-turn trajectories, K = 4 (chance = 0.25), fixed seed. Seen: turn 1
    0.12, 0.38, 0.38 on the first three steps, 0.72, 0.84, 0.78 on the last three (0.9-1.0 from step 10 on
    in a 25-step run); turn 0 0.09-0.38 throughout."""
    k = 4
    rewards, seconds, _ = run_toy(tmp_path, n_steps=10, k=k, learning_rate=1e-2)
    turn0, turn1 = rewards[0], rewards[1]
    first, last = sum(turn1[:3]) / 3, sum(turn1[-3:]) / 3
    assert last > 0.6 and last - first > 0.3, (turn0, turn1)
    # The control: turn 0 cannot know the secret, so its expected reward is at most 1/K whatever is learnt.
    assert sum(turn0[-3:]) / 3 < 1 / k + 0.15, (turn0, turn1)
    assert last - sum(turn0[-3:]) / 3 > 0.3, (turn0, turn1, seconds)


def test_toy_feedback_reaches_turn_1_prompts_and_turn_1_is_trained(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from kbrl.training.replay import replay_advantages

    k, steps = 4, 2
    rewards, _, symbols = run_toy(tmp_path, n_steps=steps, k=k, n_problems=2, group_size=4)
    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    state = replay_run(store, "toy")
    for number in range(steps):
        step = state.steps[number]
        trajs = step.trajectories()
        assert len(trajs) == 2 * 4 and all([t.turn for t in turns] == [0, 1] for turns in trajs.values())
        for traj, (first, second) in trajs.items():
            secret = secret_of(traj, symbols, 0)
            assert first.verdict is not None and second.verdict is not None
            assert first.verdict["correct"] == (first.text.strip()[:1] == secret)
            # Only the turn-1 prompt, built by the rollout from the turn-0 verdict, carries the secret run.
            assert secret * REPEAT in decoded_prompt(store, second.prompt_ref, tokenizer)
            assert not any(c * 2 in decoded_prompt(store, first.prompt_ref, tokenizer) for c in symbols)
        update = step.update
        assert update is not None
        # Turn-1 samples are in the update (rewarded, with advantages), and some had a non-zero advantage.
        turn1 = [sid for sid, smp in step.samples.items() if smp.turn == 1]
        assert set(turn1) <= set(update["advantages"])
    assert any(state.steps[n].update["n_datums"] > 0 for n in range(steps))  # type: ignore[index]
    for number, (scores, update) in replay_advantages(store, "toy").items():
        assert update is not None and scores.advantages == update["advantages"], number
    assert sorted(rewards) == [0, 1] and all(len(v) == steps for v in rewards.values())

"""One step's rollout: drive every trajectory to its end, each at its own pace (Kevin mode when T > 1).

A trajectory is G per problem; turn 0 is sampled for a whole group at once, later turns one trajectory at
a time: as soon as a turn's verdict arrives, its trajectory's next prompt (the task, the earlier kernels
and the evaluator's feedback) is sampled and queued. A fast trajectory's turn 2 never waits for a slow
trajectory's turn 1; the step ends when every trajectory has (or the step's deadline passes).

Everything is decided from the store (`Replayer`), so a restarted trainer picks up each trajectory where
its events stop: a turn without a verdict is re-queued (the verdict key makes that idempotent), a judged
turn without a successor is continued. Single-turn training is the T = 1 case of the same code.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kbrl.events.payloads import (
    EvalFailed,
    KernelEvaluated,
    SampleGenerated,
    TrajectoryCompleted,
    TurnCompleted,
)
from kbrl.events.store import EventStore, NewEvent
from kbrl.kernels.evaluator import EvalConfig
from kbrl.problems.model import Problem
from kbrl.prompts import Turn, refinement_messages
from kbrl.training.backends import Backend
from kbrl.training.raicl import first_turn_prompt
from kbrl.training.replay import Replayer, Sample, Step, encode_numbers
from kbrl.training.rewards import RewardWeights, finite_speedup, score
from kbrl.workers.jobs import EvalJob
from kbrl.workers.queue import JobQueue

if TYPE_CHECKING:
    from kbrl.rag.retrieve import Retriever


class RolloutError(RuntimeError):
    """A step's rollout cannot finish (e.g. a problem id the run does not know)."""


class StepRollout:
    """Runs the rollout of training step `number` against the store, the queue and the policy."""

    def __init__(self, *, store: EventStore, queue: JobQueue, backend: Backend, problems: dict[str, Problem],
                 run_id: str, cfg: Any, eval_config: EvalConfig, device: str, weights: RewardWeights,
                 replayer: Replayer | None = None, retriever: Retriever | None = None) -> None:  # fmt: skip
        self.store, self.queue, self.backend, self.problems = store, queue, backend, problems
        self.retriever = retriever  # RA-ICL examples in turn-0 prompts (kbrl/training/raicl.py)
        self.run_id, self.cfg, self.eval_config, self.device, self.weights = run_id, cfg, eval_config, device, weights
        self.max_turns = cfg.max_turns if cfg.mode == "multi_turn" else 1
        self.replayer = replayer or Replayer(store, run_id)
        self._submitted: set[str] = set()
        self.sample_seconds = 0.0

    # ------------------------------------------------------------------ driver

    def run(self, number: int, problem_ids: list[str]) -> dict[str, float]:
        """Drive step `number` to completion; returns rollout timing metrics."""
        started = time.perf_counter()
        deadline = None if self.cfg.step_deadline_s is None else time.monotonic() + self.cfg.step_deadline_s
        self._sample_first_turns(number, problem_ids)
        while True:
            continuing = self._advance(self.replayer.update().steps[number])
            step = self.replayer.update().steps[number]
            if continuing:
                self._sample_next_turns(number, continuing)
                continue
            pending = step.pending()
            self._submit([s for s in pending if s.sample_id not in self._submitted])
            if len(step.completed) == len(step.trajectories()):
                break
            if deadline is not None and time.monotonic() > deadline:
                self._stop_at_deadline(step)
                break
            self._wait_for_verdict()
        return self._timings(number, time.perf_counter() - started)

    def _advance(self, step: Step) -> list[list[Sample]]:
        """Record finished turns and trajectories; return the trajectories that get another turn."""
        events: list[NewEvent] = []
        continuing = []
        for traj, turns in step.trajectories().items():
            if traj in step.completed:
                continue
            last = turns[-1]
            if last.verdict is None and last.failed is None:
                continue  # still being evaluated
            stopped = self._stop_reason(turns)
            if last.sample_id not in step.turns_completed:
                events.append(self._turn_completed(last, done=stopped is not None))
            if stopped is None:
                continuing.append(turns)
            else:
                events.append(self._trajectory_completed(step.step, turns, stopped))
        if events:
            self.store.append(events)
        return continuing

    def _stop_reason(self, turns: list[Sample]) -> str | None:
        """Solved (correct, unless speed is being optimized), out of turns, or unjudgeable; else None."""
        last = turns[-1]
        if last.failed is not None:
            return "failed"
        correct_now = last.verdict is not None and last.verdict.get("category") == "CORRECT"
        if correct_now and not self.weights.measure_performance:
            return "solved"
        if len(turns) >= self.max_turns:
            solved = any(t.verdict is not None and t.verdict.get("category") == "CORRECT" for t in turns)
            return "solved" if solved else "max_turns"
        return None

    def _stop_at_deadline(self, step: Step) -> None:
        """Close what is unfinished; its unjudged last turns get no reward (like an `EvalFailed`)."""
        events = [self._trajectory_completed(step.step, turns, "deadline")
                  for traj, turns in step.trajectories().items() if traj not in step.completed]  # fmt: skip
        if events:
            self.store.append(events)

    def _wait_for_verdict(self, timeout: float = 2.0) -> None:
        after = self.replayer.state.last_position
        for _ in self.store.follow(run_id=self.run_id, after=after, types=[KernelEvaluated, EvalFailed],
                                   poll_interval=0.05, timeout=timeout):  # fmt: skip
            return

    # ------------------------------------------------------------------ sampling

    def _sample_first_turns(self, number: int, problem_ids: list[str]) -> None:
        """G completions per group that has none yet; one transaction per group."""
        step = self.replayer.update().steps.get(number) or Step(number)
        have = {s.group for s in step.samples.values()}
        for group, problem_id in enumerate(problem_ids):
            if group in have:
                continue
            problem = self._problem(problem_id, number)
            prompt, rag = first_turn_prompt(problem, backend=self.backend, kernel_backend=self.cfg.kernel_backend,
                                            retriever=self.retriever, k=self.cfg.dataset_builder.raicl_k,
                                            max_prompt_tokens=self.cfg.max_prompt_tokens)  # fmt: skip
            (sequences,) = self._sample([prompt], n=self.cfg.group_size)
            self.store.append([self._sample_event(number, group, f"s{number}/g{group}/t{j}", 0, problem_id, prompt, seq, rag)
                               for j, seq in enumerate(sequences)])  # fmt: skip

    def _sample_next_turns(self, number: int, trajectories: list[list[Sample]]) -> None:
        """One completion for each trajectory's next turn, sampled together, appended together."""
        prompts = [self._refinement_prompt(turns) for turns in trajectories]
        outputs = self._sample(prompts, n=1)
        events = []
        for turns, prompt, (seq,) in zip(trajectories, prompts, outputs, strict=True):
            last = turns[-1]
            events.append(self._sample_event(number, last.group, last.traj, last.turn + 1, last.problem_id, prompt, seq))
        self.store.append(events)

    def _refinement_prompt(self, turns: list[Sample]) -> list[int]:
        """Task + earlier kernels + feedback, shortened (oldest turns summarized) to `max_prompt_tokens`."""
        problem = self._problem(turns[0].problem_id, turns[0].step)
        history = [Turn(t.text, str((t.verdict or {}).get("feedback") or f"Status: {t.failed or 'unknown'}"))
                   for t in turns]  # fmt: skip
        ids: list[int] = []
        for keep in range(len(history), 0, -1):
            ids = self.backend.encode_prompt(refinement_messages(problem, history, self.cfg.kernel_backend,
                                                                 keep_last=keep))  # fmt: skip
            if len(ids) <= self.cfg.max_prompt_tokens:
                break
        return ids

    def _sample(self, prompts: list[list[int]], n: int) -> list[list[Any]]:
        t0 = time.perf_counter()
        out = self.backend.sample(prompts, n=n, max_tokens=self.cfg.max_tokens, temperature=self.cfg.temperature)
        self.sample_seconds += time.perf_counter() - t0
        return out

    def _sample_event(self, number: int, group: int, traj: str, turn: int, problem_id: str, prompt: list[int],
                      seq: Any, rag: dict[str, Any] | None = None) -> NewEvent:  # fmt: skip
        refs = self.store.put_blobs([encode_numbers(prompt), encode_numbers(seq.tokens), encode_numbers(seq.logprobs)])
        payload = SampleGenerated(step=number, group=group, traj=traj, turn=turn, problem_id=problem_id,
                                  prompt_ref=refs[0], completion_ref=refs[1], logprobs_ref=refs[2], text=seq.text,
                                  policy_version=self.backend.sampler_version, n_prompt_tokens=len(prompt),
                                  n_completion_tokens=len(seq.tokens), stop_reason=seq.stop_reason,
                                  **(rag or {}))  # fmt: skip
        return NewEvent(self.run_id, f"traj/{traj}", f"{self.run_id}/{traj}/turn{turn}", payload)

    # ------------------------------------------------------------------ events

    def _submit(self, samples: list[Sample]) -> None:
        jobs = [EvalJob.for_problem(self.run_id, s.sample_id, self.problems[s.problem_id], None, self.device,  # type: ignore[arg-type]
                                    self.eval_config) for s in samples]  # fmt: skip
        if jobs:
            self.queue.submit(jobs)
            self._submitted.update(s.sample_id for s in samples)

    def _turn_completed(self, sample: Sample, done: bool) -> NewEvent:
        verdict = sample.verdict or {}
        breakdown = score(verdict, self.weights) if sample.verdict is not None else None
        payload = TurnCompleted(traj=sample.traj, turn=sample.turn, problem_id=sample.problem_id,
                                sample_id=sample.sample_id, category=verdict.get("category", "EVAL_FAILED"),
                                correct=verdict.get("category") == "CORRECT",
                                speedup=finite_speedup(verdict.get("speedup_eager")),
                                reward=breakdown.total if breakdown else None, done=done)  # fmt: skip
        return NewEvent(self.run_id, f"traj/{sample.traj}", f"{sample.sample_id}/completed", payload)

    def _trajectory_completed(self, number: int, turns: list[Sample], stopped: str) -> NewEvent:
        correct = [t for t in turns if t.verdict is not None and t.verdict.get("category") == "CORRECT"]
        speedups = [x for t in correct if (x := finite_speedup(t.verdict.get("speedup_eager"))) is not None]  # type: ignore[union-attr]
        payload = TrajectoryCompleted(traj=turns[0].traj, turns=len(turns), solved=bool(correct),
                                      best_speedup=max(speedups) if speedups else None,
                                      problem_id=turns[0].problem_id, step=number, stopped=stopped)  # fmt: skip
        return NewEvent(self.run_id, f"traj/{turns[0].traj}", f"{self.run_id}/{turns[0].traj}/completed", payload)

    # ------------------------------------------------------------------ helpers

    def _problem(self, problem_id: str, number: int) -> Problem:
        problem = self.problems.get(problem_id)
        if problem is None:
            raise RolloutError(f"step {number} uses {problem_id!r}, which is not in this run's problem set")
        return problem

    def _timings(self, number: int, wall: float) -> dict[str, float]:
        """Rollout time, sampling time, and how busy evaluation kept the workers (mean evaluations in
        flight = Σ evaluation seconds / rollout wall time): what asynchronous turns are for."""
        step = self.replayer.update().steps[number]
        eval_s = sum(float((s.verdict or {}).get("stage_seconds", {}).get("total", 0.0)) for s in step.samples.values())
        return {"time/rollout_s": wall, "time/sample_s": self.sample_seconds, "time/eval_sum_s": eval_s,
                "rollout/evals_in_flight": eval_s / wall if wall > 0 else 0.0,
                "rollout/turns": float(len(step.samples))}  # fmt: skip

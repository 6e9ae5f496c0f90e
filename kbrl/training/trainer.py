"""The GRPO training loop: select problems → sample G per problem → evaluate through the queue → replay the
step's events into advantages → importance-sampling update → checkpoint. Every fact is an event first.

Crash safety comes from the order of writes:

1. `ProblemsSelected` and each group's `SampleGenerated` events are appended before anything uses them,
   so a restarted run reuses the exact samples (tokens and logprobs are blobs) instead of drawing new ones.
2. Jobs are (re)submitted for every sample without a verdict; the queue's keys make that idempotent.
3. The update is computed from a replay of the store (`kbrl.training.replay`), then the checkpoint is
   saved, and only then `PolicyUpdated` + `CheckpointSaved` are appended together, in one transaction.
   A step is done exactly when its `CheckpointSaved` exists; a restart loads the last such checkpoint and
   redoes (from the same samples) any step whose record is missing, so no step is applied twice.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kbrl.config import TrainConfig, config_to_dict
from kbrl.evalrun import new_run_id
from kbrl.events.payloads import (
    CheckpointSaved,
    PolicyUpdated,
    ProblemsSelected,
    RunFinished,
    RunStarted,
)
from kbrl.events.store import EventStore, NewEvent
from kbrl.kernels.evaluator import EvalConfig
from kbrl.metrics.projections import MetricsLogger, RunProjection, log_step
from kbrl.problems import load_problems
from kbrl.problems.model import Problem
from kbrl.prompts import task_messages
from kbrl.training.backends import AdamParams, Backend, make_backend
from kbrl.training.datums import TrainDatum, build_datum
from kbrl.training.raicl import open_retriever
from kbrl.training.replay import (
    Replayer,
    Step,
    StepScores,
    decode_numbers,
    replay_run,
    run_step_scores,
)
from kbrl.training.rollout import StepRollout
from kbrl.workers.queue import JobQueue, resolve_eval_device

if TYPE_CHECKING:
    from kbrl.rag.retrieve import Retriever


class TrainingError(RuntimeError):
    """The run cannot go on (bad config for this run, a resume that does not match, no problems)."""


@dataclass
class StepReport:
    step: int
    metrics: dict[str, float]
    seconds: float


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def resolve_model(cfg: TrainConfig, log_path: Path, problems: list[Problem]) -> str:
    """`model_name`, except "tiny": kbrl's tiny model, built once in the run's directory and warm-started
    on the run's prompts (see `kbrl.training.tiny.warm_start`): a CPU smoke run of the whole loop."""
    if cfg.model_name != "tiny":
        return cfg.model_name
    from kbrl.training.tiny import build_tiny_model, warm_start

    path = log_path / "tiny-model"
    if not path.is_dir():
        building = log_path / "tiny-model.building"
        shutil.rmtree(building, ignore_errors=True)
        build_tiny_model(building, seed=cfg.seed)
        warm_start(building, [task_messages(p, cfg.kernel_backend) for p in problems], seed=cfg.seed)
        building.rename(path)  # complete or absent, even if the run is killed meanwhile
    return str(path)


def make_policy(cfg: TrainConfig, log_path: Path, problems: list[Problem]) -> Backend:
    model = resolve_model(cfg, log_path, problems)
    if cfg.backend == "local":
        checkpoints = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else log_path / "checkpoints"
        return make_backend("local", model, lora_rank=cfg.lora_rank, seed=cfg.seed, checkpoint_dir=checkpoints)
    return make_backend("tinker", model, lora_rank=cfg.lora_rank, seed=cfg.seed)


def eval_config(cfg: TrainConfig) -> tuple[EvalConfig, str]:
    """Evaluator settings for the run's jobs, and the queue device (cuda → GPU workers, cpu → CPU workers)."""
    device = resolve_eval_device(cfg.eval_device)
    weights = cfg.reward_weights()
    config = EvalConfig(n_trials=cfg.eval_n_trials, tolerance=cfg.eval_tolerance, timeout_s=cfg.eval_timeout_s,
                        measure_performance=weights.measure_performance, device=device)  # fmt: skip
    return config, "cuda" if device.startswith("cuda") else "cpu"


class Trainer:
    """Runs (or resumes) one training run; every decision is read back from the store it writes."""

    def __init__(self, cfg: TrainConfig, store: EventStore, queue: JobQueue, backend: Backend,
                 problems: list[Problem], run_id: str, log_path: Path, console: Any = None) -> None:  # fmt: skip
        if not problems:
            raise TrainingError("no problems to train on: check problem_source, level and problem_ids")
        self.retriever = open_run_retriever(cfg)
        self.cfg, self.store, self.queue, self.backend = cfg, store, queue, backend
        self.problems = {p.id: p for p in problems}
        self.run_id, self.log_path = run_id, log_path
        self.weights = cfg.reward_weights()
        self.eval_config, self.device = eval_config(cfg)
        self.console = console
        # One incremental fold of the run's events, shared with each step's rollout: every decision reads
        # the store, and no step re-reads the whole run.
        self.replayer = Replayer(store, run_id)

    # ------------------------------------------------------------------ run

    def run(self) -> list[StepReport]:
        """Train until `n_steps` steps are done; returns the reports of the steps done in this call."""
        state = self.replayer.update()
        if not state.config:
            self._append(NewEvent(self.run_id, f"run/{self.run_id}", f"{self.run_id}/started",
                                  RunStarted(config=config_to_dict(self.cfg), git_sha=git_sha(),
                                             backend=self.cfg.backend, model=self.cfg.model_name)))  # fmt: skip
        last = state.last_done_step()
        if last is not None:
            assert last.checkpoint is not None and last.update is not None
            self.backend.load_checkpoint(last.checkpoint)
            self.backend.restore_version(int(last.update["policy_version"]))
            self.backend.refresh_sampler()
            self._say(f"resuming {self.run_id} after step {last.step} (checkpoint {last.checkpoint})")
        first = 0 if last is None else last.step + 1
        # purge_step: points a killed attempt wrote for steps being redone are dropped, not plotted twice.
        self.scalars = MetricsLogger(self.log_path / "tensorboard", enabled=self.cfg.tensorboard_enabled,
                                     purge_step=first if first else None)  # fmt: skip
        # What TensorBoard shows is projected from the store after each commit, as the dashboard and
        # `kbrl replay` project it: one definition of every metric (kbrl.metrics.projections).
        self.projection = RunProjection(self.run_id)
        reports = []
        status, error = "failed", None
        try:
            for number in range(first, self.cfg.n_steps):
                reports.append(self.train_step(number))
            status = "finished"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.scalars.close()
            # Keyed by time: a run interrupted and resumed records each ending; `kbrl runs` shows the last.
            self._append(NewEvent(self.run_id, f"run/{self.run_id}", f"{self.run_id}/{status}/{time.time_ns()}",
                                  RunFinished(status=status, error=error)))  # fmt: skip
        return reports

    def train_step(self, number: int) -> StepReport:
        started = time.perf_counter()
        step = self.replayer.update().steps.get(number)
        problem_ids = (step.problem_ids if step else None) or self._select_problems(number)
        rollout = StepRollout(store=self.store, queue=self.queue, backend=self.backend, problems=self.problems,
                              run_id=self.run_id, cfg=self.cfg, eval_config=self.eval_config, device=self.device,
                              weights=self.weights, replayer=self.replayer, retriever=self.retriever)  # fmt: skip
        timings = rollout.run(number, problem_ids)
        timings["time/eval_s"] = timings["time/rollout_s"] - timings["time/sample_s"]  # waiting on verdicts
        step = self.replayer.update().steps[number]
        scores = run_step_scores(step, self.cfg, self.weights)
        self._update(number, step, scores, started, timings)
        self.projection.update(self.store)
        metrics = log_step(self.scalars, self.projection, number)
        nan = float("nan")
        self._say(f"step {number + 1}/{self.cfg.n_steps}: reward {metrics.get('reward/mean', nan):.3f}  "
                  f"correct {metrics.get('eval/correct_rate', nan):.0%}  datums {int(metrics['train/n_datums'])}  "
                  f"loss {metrics['train/loss']:.4f}  {metrics['time/total_s']:.1f} s")  # fmt: skip
        return StepReport(number, metrics, metrics["time/total_s"])

    # ------------------------------------------------------------------ stages

    def _select_problems(self, number: int) -> list[str]:
        """A deterministic draw per (seed, step): a resumed run picks what the original would have."""
        ids = sorted(self.problems)
        rng = random.Random(f"{self.cfg.seed}/{number}")
        chosen = rng.sample(ids, min(self.cfg.batch_size, len(ids)))
        self._append(NewEvent(self.run_id, f"step/{number}", f"{self.run_id}/s{number}/problems",
                              ProblemsSelected(step=number, problem_ids=chosen)))  # fmt: skip
        return chosen

    def _datums(self, step: Step, scores: StepScores) -> list[TrainDatum]:
        """One datum per judged sample with a non-zero advantage (zero adds no gradient, only compute)."""
        datums = []
        for sid, advantage in sorted(scores.advantages.items()):
            sample = step.samples[sid]
            if advantage == 0.0 or not (sample.prompt_ref and sample.completion_ref and sample.logprobs_ref):
                continue
            prompt = decode_numbers(self.store.get_blob(sample.prompt_ref))
            tokens = decode_numbers(self.store.get_blob(sample.completion_ref))
            logprobs = decode_numbers(self.store.get_blob(sample.logprobs_ref))
            if tokens:
                datums.append(build_datum(prompt, tokens, logprobs, advantage))
        return datums

    def _update(self, number: int, step: Step, scores: StepScores, started: float,
                timings: dict[str, float]) -> dict[str, float]:  # fmt: skip
        """Update, save, then record the step; the recorded metrics include the step's timings (`time/*`,
        seconds since `started`), so every view of the run reads them from the store."""
        datums = self._datums(step, scores)
        metrics: dict[str, float] = {"train/n_datums": float(len(datums)), "train/loss": 0.0, **timings}
        train_started = time.perf_counter()
        if datums:
            fb = self.backend.forward_backward(datums, loss="importance_sampling")
            a = self.cfg.adam
            opt = self.backend.optim_step(AdamParams(learning_rate=self.cfg.learning_rate, beta1=a.beta1,
                                                     beta2=a.beta2, eps=a.eps, weight_decay=a.weight_decay,
                                                     grad_clip_norm=a.grad_clip_norm))  # fmt: skip
            metrics["train/loss"] = fb["loss"]
            metrics.update({f"train/{k}": float(v) for k, v in {**fb, **opt}.items() if k != "loss"})
        save_started = time.perf_counter()
        metrics["time/train_s"] = save_started - train_started
        path = self.backend.save_checkpoint(f"step_{number:05d}")
        self.backend.refresh_sampler()
        version = self.backend.policy_version
        done = time.perf_counter()
        metrics["time/save_s"] = done - save_started
        metrics["time/total_s"] = done - started
        self.store.append([
            NewEvent(self.run_id, f"step/{number}", f"{self.run_id}/s{number}/updated", PolicyUpdated(
                step=number, loss=metrics["train/loss"], n_datums=len(datums), lr=self.cfg.learning_rate,
                policy_version=version, metrics={k: v for k, v in metrics.items() if k.startswith(("train/", "time/"))},
                rewards=scores.rewards, advantages=scores.advantages)),
            NewEvent(self.run_id, f"step/{number}", f"{self.run_id}/s{number}/checkpoint",
                     CheckpointSaved(path=path, step=number, policy_version=version)),
        ])  # fmt: skip
        return metrics

    # ------------------------------------------------------------------ helpers

    def _append(self, event: NewEvent) -> None:
        self.store.append_one(event)

    def _say(self, text: str) -> None:
        if self.console is not None:
            self.console.print(text, highlight=False)


def open_run_retriever(cfg: TrainConfig) -> Retriever | None:
    """The RA-ICL retriever when `dataset_builder.prompt_option=raicl` (None for basic prompts)."""
    db = cfg.dataset_builder
    if db.prompt_option != "raicl":
        return None
    if not db.rag_index_path:
        raise TrainingError("dataset_builder.prompt_option=raicl needs dataset_builder.rag_index_path (an index "
                            "built by `kbrl build-rag-index --output DIR`)")  # fmt: skip
    try:
        return open_retriever(db.rag_index_path, allow_same_task=db.raicl_allow_same_task)
    except ValueError as exc:
        raise TrainingError(f"dataset_builder.rag_index_path: {exc}") from exc


def load_run_problems(cfg: TrainConfig) -> list[Problem]:
    problems = load_problems(cfg.problem_source, level=cfg.level)
    if cfg.problem_ids:
        wanted = set(cfg.problem_ids)
        missing = wanted - {p.id for p in problems}
        if missing:
            raise TrainingError(f"problem_ids not in source {cfg.problem_source!r}: {sorted(missing)}")
        problems = [p for p in problems if p.id in wanted]
    return problems


def train(cfg: TrainConfig | None = None, *, resume: str | None = None, store: EventStore | None = None,
          queue: JobQueue | None = None, console: Any = None) -> tuple[str, list[StepReport]]:  # fmt: skip
    """Start a run from `cfg`, or resume run `resume` with the config it recorded; returns (run_id, reports)."""
    from kbrl import settings
    from kbrl.workers.queue import make_queue

    store = store or EventStore(settings.database_url())
    if resume is not None:
        state = replay_run(store, resume)
        if not state.config:
            raise TrainingError(f"no training run {resume!r} in the store (see `kbrl runs`)")
        recorded = TrainConfig.model_validate(state.config)
        if cfg is not None and cfg.n_steps != recorded.n_steps:  # the one setting a resume may change
            recorded = recorded.model_copy(update={"n_steps": cfg.n_steps})
        cfg, run_id = recorded, resume
    else:
        if cfg is None:
            raise TrainingError("train() needs a config or a run id to resume")
        run_id = cfg.run_id or new_run_id("train")
        if store.has_run(run_id):
            raise TrainingError(f"run {run_id!r} exists already: resume it with `kbrl train --resume {run_id}`")
        cfg = cfg.model_copy(update={"run_id": run_id})
    log_path = Path(cfg.log_path.format(run_id=run_id))
    log_path.mkdir(parents=True, exist_ok=True)
    own_queue = queue is None
    queue = queue or make_queue(store, local_workers=cfg.local_workers)
    problems = load_run_problems(cfg)
    backend = make_policy(cfg, log_path, problems)
    try:
        trainer = Trainer(cfg, store, queue, backend, problems, run_id, log_path, console)
        return run_id, trainer.run()
    finally:
        backend.close()
        if own_queue:
            queue.close()

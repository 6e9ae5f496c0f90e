"""`kbrl eval-model`: score a policy (a base model or a training checkpoint) on a problem set, KernelBench-style.

For each problem the policy writes k completions from the task prompt (`kbrl.prompts.task_messages`); each is
recorded as a `SampleGenerated` event and judged through the job queue like a training sample, so a model
evaluation uses exactly the evaluator, sandbox and workers that produced the training reward. The run is
bracketed by `EvalRunStarted` / `EvalRunFinished` (kind "eval-model"); the finish event's summary is
`ModelEvalReport.to_dict()`, and the same numbers (plus every sample's verdict) go to a results JSON.

Metrics (see `compute_metrics`; KernelBench's own definitions are in `/work/shared/notes/kernelbench.md`,
"Metrics", and upstream `scripts/eval_from_generations.py` / `scripts/benchmark_eval_analysis.py`):

* `pass@k'`: Chen et al. (2021)'s unbiased estimator 1 - C(n-c, k')/C(n, k') per problem, averaged over
  problems, where c counts samples whose category is CORRECT (KernelBench's `calc_pass_at_k`), for k' in
  1, 2, 4, … and k.
* `fast_p` (per sample): KernelBench's fast_p is over problems with one sample each (its analysis script
  keeps sample 0). With k samples we report its expectation for one random sample per problem: the mean
  over problems of the fraction of that problem's samples that are CORRECT with `speedup_eager > p`.
  This equals the mean over all samples when every problem has k verdicts.
* `fast_p@k'` (best of k'): the same unbiased estimator as pass@k', with c = the number of samples that
  are correct and faster than p; at k' = n it is the fraction of problems whose best sample qualifies.
* fast_p values are None, never 0, when the run could not time kernels (CPU device, or
  `measure_performance` off): "not measured" must not read as "never fast".

Samples whose evaluation failed (`EvalFailed`: the evaluator, not the candidate, broke) or whose verdict
never arrived count as incorrect, and are counted separately (`n_eval_failed`, `n_missing`).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kbrl.evalrun import new_run_id
from kbrl.events.payloads import EvalFailed, EvalRunFinished, EvalRunStarted, KernelEvaluated, SampleGenerated
from kbrl.events.store import Event, EventStore, NewEvent
from kbrl.kernels.evaluator import EvalConfig, config_dict
from kbrl.problems.model import Problem
from kbrl.prompts import BACKEND_NAMES
from kbrl.training.backends import BACKENDS, Backend, make_backend
from kbrl.training.raicl import first_turn_prompt, open_retriever
from kbrl.training.replay import encode_numbers
from kbrl.workers.jobs import EvalJob, wait_for_verdicts
from kbrl.workers.queue import JobQueue

if TYPE_CHECKING:
    from kbrl.rag.retrieve import Retriever

log = logging.getLogger(__name__)

KIND = "eval-model"
DEFAULT_PS: tuple[float, ...] = (0.0, 1.0, 1.5, 2.0)
CORRECT = "CORRECT"
NOT_TIMED_NOTE = ("fast_p not measured: kernels were not timed ({why}); the values are None, not 0 — "
                  "use pass@k for correctness")  # fmt: skip

Device = Literal["cuda", "cpu"]


# ------------------------------------------------------------------------------------------ estimators


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021): probability that at least one of k samples drawn without replacement from n
    (c of them correct) is correct, 1 - C(n-c, k)/C(n, k); unbiased, unlike 1 - (1 - c/n)^k."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    total = math.comb(n, k)
    return (total - math.comb(n - c, k)) / total  # one correctly rounded division of exact integers


def pass_ks(k: int) -> list[int]:
    """The k' reported for k samples per problem: 1, the powers of two below k, and k itself."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    out, j = [], 1
    while j < k:
        out.append(j)
        j *= 2
    return [*out, k]


def p_label(p: float) -> str:
    """`fast_{p}` key fragment as `result_summary` spells it: 0, 1, 1.5, 2."""
    return f"{p:g}"


# ------------------------------------------------------------------------------------------ metrics


@dataclass(frozen=True)
class SampleOutcome:
    """One sample's verdict as the metrics see it. `result` is `EvalResult.to_dict()` (any mapping with
    `category`, `compiled`, `speedup_eager` works); None when there is none, with `error` saying why."""

    sample_id: str
    problem_id: str
    result: Mapping[str, Any] | None = None
    error: str | None = None
    missing: bool = False
    """True when no verdict arrived at all (as opposed to an `EvalFailed`)."""

    @property
    def category(self) -> str | None:
        return None if self.result is None else str(self.result.get("category"))

    @property
    def correct(self) -> bool:
        return self.category == CORRECT

    @property
    def compiled(self) -> bool:
        return bool(self.result is not None and self.result.get("compiled"))

    @property
    def speedup(self) -> float | None:
        """`speedup_eager` as a float (the store keeps non-finite floats as strings), None if unmeasured."""
        value = None if self.result is None else self.result.get("speedup_eager")
        if value is None:
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            return None

    def fast(self, p: float) -> bool:
        """KernelBench's per-sample fast_p test: correct and strictly faster than p × the eager reference."""
        s = self.speedup
        return self.correct and s is not None and s > p


@dataclass
class ProblemScore:
    """Per-problem tallies (the table rows and the results JSON's `problems`)."""

    problem_id: str
    n: int
    n_correct: int
    n_compiled: int
    best_speedup: float | None
    categories: dict[str, int]


@dataclass
class ModelMetrics:
    """Aggregates over a problem set; see the module docstring for the definitions."""

    k: int
    n_problems: int
    n_samples: int
    n_evaluated: int
    n_eval_failed: int
    n_missing: int
    pass_at: dict[int, float]
    fast_at: dict[int, dict[float, float | None]]
    """k' → p → fast_p@k'; k' = 1 is the per-sample `fast_p`. All None when `timed` is False."""
    timed: bool
    compile_rate: float
    correct_rate: float
    categories: dict[str, int]
    mean_speedup: float | None
    geomean_speedup: float | None
    problems: list[ProblemScore] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def fast_p(self) -> dict[float, float | None]:
        """Per-sample fast_p (expected KernelBench fast_p with one sample per problem)."""
        return self.fast_at.get(1, {})

    @property
    def fast_p_at_k(self) -> dict[float, float | None]:
        """Best-of-k fast_p: fraction of problems with at least one sample correct and faster than p."""
        return self.fast_at.get(self.k, {})

    def to_dict(self) -> dict[str, Any]:
        """Flat keys, compatible with `result_summary` (`n`, `compile_rate`, `fast_1`, …) plus `pass@k'`
        and `fast_{p}@{k'}`, so dashboards that read eval-kernels runs read these too."""
        out: dict[str, Any] = {
            "k": self.k,
            "n_problems": self.n_problems,
            "n": self.n_samples,
            "n_evaluated": self.n_evaluated,
            "n_eval_failed": self.n_eval_failed,
            "n_missing": self.n_missing,
            "timed": self.timed,
            "compile_rate": self.compile_rate,
            "correct_rate": self.correct_rate,
            "categories": dict(self.categories),
            "mean_speedup": self.mean_speedup,
            "geomean_speedup": self.geomean_speedup,
        }
        for kk, value in self.pass_at.items():
            out[f"pass@{kk}"] = value
        for kk, by_p in self.fast_at.items():
            for p, value in by_p.items():
                out[f"fast_{p_label(p)}" if kk == 1 else f"fast_{p_label(p)}@{kk}"] = value
        out["problems"] = [asdict(s) for s in self.problems]
        out["notes"] = list(self.notes)
        return out


def compute_metrics(outcomes: Sequence[SampleOutcome], *, k: int, ps: Sequence[float] = DEFAULT_PS,
                    timed: bool, not_timed_reason: str = "no GPU timing") -> ModelMetrics:  # fmt: skip
    """pass@k', fast_p (per sample), fast_p@k' (best of k'), rates, histogram and speedup means.

    `timed`: whether the run measured speedups at all (device cuda and `measure_performance`); decided by
    the run's settings, not by the verdicts, since a GPU run with no correct kernel has no timings either
    and its fast_p is a true 0. A problem counts every sample drawn for it; failed or missing verdicts
    count as incorrect. k' values above the smallest per-problem sample count are left out (with a note).
    """
    by_problem: dict[str, list[SampleOutcome]] = {}
    for o in outcomes:
        by_problem.setdefault(o.problem_id, []).append(o)
    n_samples = len(outcomes)
    notes: list[str] = []
    ks = pass_ks(k)
    if by_problem:
        smallest = min(len(v) for v in by_problem.values())
        if smallest < k:
            notes.append(
                f"some problem has only {smallest} of {k} samples: pass@k' reported for k' <= {smallest}"
            )
        ks = [kk for kk in ks if kk <= smallest]
    categories: dict[str, int] = {}
    for o in outcomes:
        if o.category is not None:
            categories[o.category] = categories.get(o.category, 0) + 1
    n_failed = sum(1 for o in outcomes if o.result is None and not o.missing)
    n_missing = sum(1 for o in outcomes if o.missing)
    if n_failed:
        notes.append(
            f"{n_failed} sample(s) got no verdict because the evaluator failed (EvalFailed); counted incorrect"
        )
    if n_missing:
        notes.append(f"{n_missing} sample(s) have no verdict (timed out waiting); counted incorrect")

    def mean(values: Sequence[float]) -> float:
        return math.fsum(values) / len(values) if values else 0.0

    pass_at = {
        kk: mean([pass_at_k(len(v), sum(o.correct for o in v), kk) for v in by_problem.values()]) for kk in ks
    }
    fast_at: dict[int, dict[float, float | None]] = {}
    for kk in ks:
        fast_at[kk] = {
            p: mean([pass_at_k(len(v), sum(o.fast(p) for o in v), kk) for v in by_problem.values()])
            if timed
            else None
            for p in ps
        }
    if not timed:
        notes.append(NOT_TIMED_NOTE.format(why=not_timed_reason))
    speedups = [
        s for o in outcomes if o.correct and (s := o.speedup) is not None and math.isfinite(s) and s > 0
    ]
    problems = []
    for pid, group in by_problem.items():
        cats: dict[str, int] = {}
        for o in group:
            label = o.category or ("MISSING" if o.missing else "EVAL_FAILED")
            cats[label] = cats.get(label, 0) + 1
        best = [s for o in group if o.correct and (s := o.speedup) is not None]
        problems.append(ProblemScore(problem_id=pid, n=len(group), n_correct=sum(o.correct for o in group),
                                     n_compiled=sum(o.compiled for o in group),
                                     best_speedup=max(best) if best else None, categories=cats))  # fmt: skip
    return ModelMetrics(
        k=k, n_problems=len(by_problem), n_samples=n_samples, n_evaluated=n_samples - n_failed - n_missing,
        n_eval_failed=n_failed, n_missing=n_missing, pass_at=pass_at, fast_at=fast_at, timed=timed,
        compile_rate=sum(o.compiled for o in outcomes) / n_samples if n_samples else 0.0,
        correct_rate=sum(o.correct for o in outcomes) / n_samples if n_samples else 0.0,
        categories=categories, mean_speedup=mean(speedups) if speedups else None,
        geomean_speedup=math.exp(mean([math.log(s) for s in speedups])) if speedups else None,
        problems=problems, notes=notes,
    )  # fmt: skip


@dataclass
class ModelEvalReport:
    """What one `kbrl eval-model` run measured, with the settings that make it reproducible."""

    run_id: str
    model: str
    status: str
    config: dict[str, Any]
    metrics: ModelMetrics
    error: str | None = None
    results_path: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    by_turn_budget: dict[int, ModelMetrics] = field(default_factory=dict)
    """Multi-turn runs: the metrics of each trajectory cut to its first t turns (t = 1 … max_turns)."""

    def to_dict(self) -> dict[str, Any]:
        """The `EvalRunFinished.summary` and the results JSON's header: metrics flat, settings nested."""
        out = {"run_id": self.run_id, "model": self.model, "status": self.status, "error": self.error,
               **self.metrics.to_dict(), "config": self.config, "results_path": self.results_path,
               "seconds": dict(self.seconds)}  # fmt: skip
        if self.by_turn_budget:
            out["by_turn_budget"] = {str(t): m.to_dict() for t, m in self.by_turn_budget.items()}
        return out

    def scalars(self, prefix: str = "eval_model/") -> dict[str, float]:
        """Headline numbers for TensorBoard (None values left out: unmeasured is not zero)."""
        m = self.metrics
        values: dict[str, float | None] = {
            "compile_rate": m.compile_rate,
            "correct_rate": m.correct_rate,
            "mean_speedup": m.mean_speedup,
            "geomean_speedup": m.geomean_speedup,
        }
        values |= {f"pass@{kk}": v for kk, v in m.pass_at.items()}
        for kk, by_p in m.fast_at.items():
            values |= {
                (f"fast_{p_label(p)}" if kk == 1 else f"fast_{p_label(p)}@{kk}"): v for p, v in by_p.items()
            }
        for t, mt in self.by_turn_budget.items():
            values |= {f"turns_le_{t}/pass@{kk}": v for kk, v in mt.pass_at.items()}
            values[f"turns_le_{t}/correct_rate"] = mt.correct_rate
        return {prefix + key: float(v) for key, v in values.items() if v is not None}


# ------------------------------------------------------------------------------------------ the run


def sample_id_for(run_id: str, problem: Problem, index: int) -> str:
    """A sample's id (its `SampleGenerated` key): readable, and unique per run, problem and draw."""
    return f"{run_id}/{problem.id}/s{index}"


def evaluate_model(
    backend: Backend,
    problems: Sequence[Problem],
    *,
    k: int,
    max_tokens: int,
    temperature: float,
    kernel_backend: str,
    store: EventStore,
    queue: JobQueue,
    eval_config: EvalConfig,
    device: Device,
    model_label: str,
    ps: Sequence[float] = DEFAULT_PS,
    run_id: str | None = None,
    progress: bool = True,
    out: Path | None = None,
    tensorboard_dir: Path | None = None,
    tensorboard_step: int | None = None,
    sample_batch: int = 8,
    verdict_timeout: float | None = None,
    max_turns: int = 1,
    retriever: Retriever | None = None,
    raicl_k: int = 3,
    max_prompt_tokens: int = 16384,
) -> ModelEvalReport:
    """Sample k completions per problem, evaluate them through `queue`, score them; every fact an event.

    Problems are sampled `sample_batch` at a time (Tinker samples a batch's prompts concurrently) and each
    batch's jobs are submitted at once, so evaluation overlaps the sampling of the next batch. Jobs carry
    no text: the worker reads it from the `SampleGenerated` event (the one copy in the store; the cost is
    that Celery's CUDA prebuild hint, which needs the text in the message, is skipped). Jobs carry no
    `expected` either, so no worker closes the run with a bare `result_summary`: this function appends
    `EvalRunFinished` itself, with the full report, after all verdicts are in (or `verdict_timeout`,
    default timeout_s × jobs + 600 s, has passed: then status "failed", the missing ones counted wrong).
    `tensorboard_step` defaults to the policy version, so evaluations of checkpoints line up with training.

    `max_turns` > 1 evaluates in Kevin mode: each of the k samples of a problem is a trajectory that sees its
    previous kernels' feedback (the training rollout, `kbrl.training.rollout`), and the report adds the
    metrics for every turn budget (`by_turn_budget[t]`: each trajectory's best verdict within its first t
    turns), so a user sees what the extra turns buy.

    With a `retriever` (RA-ICL), each first-turn prompt carries the `raicl_k` nearest examples that fit in
    `max_prompt_tokens` (kbrl/training/raicl.py); each `SampleGenerated` records their ids.
    """
    problems = list(problems)
    _check_args(problems, k, kernel_backend, device, sample_batch)
    run_id = run_id or new_run_id(KIND)
    if store.has_run(run_id):
        raise ValueError(f"run {run_id!r} already exists in {store!r}; choose another run id")
    timed = device == "cuda" and eval_config.measure_performance
    why_not = (
        "evaluated on cpu: Triton ran in the interpreter" if device != "cuda" else "measure_performance=false"
    )
    eval_cfg = config_dict(eval_config) | {"device": device}
    config = {"model": model_label, "backend": backend.name, "policy_version": backend.policy_version, "k": k,
              "max_tokens": max_tokens, "temperature": temperature, "kernel_backend": kernel_backend,
              "device": device, "ps": list(ps), "eval": eval_cfg,
              "prompt_option": "raicl" if retriever is not None else "basic"}  # fmt: skip
    if retriever is not None:
        config |= {"raicl_k": raicl_k, "max_prompt_tokens": max_prompt_tokens,
                   "rag_model": retriever.embedder.model_id, "raicl_allow_same_task": retriever.allow_same_task}  # fmt: skip
    started = store.append_one(NewEvent(run_id=run_id, stream=f"run/{run_id}", key=f"{run_id}/started",
                                        payload=EvalRunStarted(kind=KIND, config=config, model=model_label,
                                                               problem_ids=[p.id for p in problems],
                                                               n_candidates=len(problems) * k)))  # fmt: skip
    samples: dict[str, SampleGenerated] = {}
    seconds: dict[str, float] = {}
    timeout = (
        verdict_timeout if verdict_timeout is not None else eval_config.timeout_s * len(problems) * k + 600
    )
    if max_turns > 1:
        return _evaluate_multi_turn(backend, problems, k=k, max_tokens=max_tokens, temperature=temperature,
                                    kernel_backend=kernel_backend, store=store, queue=queue, eval_config=eval_config,
                                    device=device, model_label=model_label, ps=ps, run_id=run_id, out=out,
                                    tensorboard_dir=tensorboard_dir, tensorboard_step=tensorboard_step,
                                    max_turns=max_turns, config=config, timed=timed, why_not=why_not,
                                    retriever=retriever, raicl_k=raicl_k, max_prompt_tokens=max_prompt_tokens)  # fmt: skip
    try:
        t0 = time.perf_counter()
        with _progress(progress) as bar:
            sampling = bar.add_task("sampling", total=len(problems)) if bar else None
            evaluating = bar.add_task("evaluating", total=len(problems) * k) if bar else None
            for start in range(0, len(problems), sample_batch):
                batch = problems[start : start + sample_batch]
                samples |= _sample_batch(backend, store, queue, run_id, batch, start, k=k, max_tokens=max_tokens,
                                         temperature=temperature, kernel_backend=kernel_backend, device=device,
                                         eval_config=eval_config, retriever=retriever, raicl_k=raicl_k,
                                         max_prompt_tokens=max_prompt_tokens)  # fmt: skip
                if bar:
                    bar.update(sampling, advance=len(batch), description=f"sampling ({batch[-1].id})")
            seconds["sampling"] = time.perf_counter() - t0

            def advance(event: Event) -> None:
                if bar:
                    category = event.payload.get("result", {}).get("category", event.type)
                    bar.update(evaluating, advance=1, description=f"evaluating ({category})")

            found = wait_for_verdicts(store, run_id, list(samples), timeout=timeout, on_event=advance,
                                      after=started.position)  # fmt: skip
            seconds["total"] = time.perf_counter() - t0
    except BaseException as exc:
        _record_abort(store, run_id, exc)
        raise
    outcomes = [_outcome(sid, s.problem_id, found.get(sid)) for sid, s in samples.items()]
    metrics = compute_metrics(outcomes, k=k, ps=ps, timed=timed, not_timed_reason=why_not)
    missing = metrics.n_missing
    report = ModelEvalReport(
        run_id=run_id, model=model_label, status="failed" if missing else "finished", config=config,
        metrics=metrics, error=f"{missing} of {len(samples)} verdicts did not arrive in {timeout:.0f} s" if missing else None,
        results_path=str(out) if out is not None else None, seconds=seconds,
    )  # fmt: skip
    if out is not None:
        write_results(out, report, samples, outcomes)
    finished = store.append_one(NewEvent(run_id=run_id, stream=f"run/{run_id}", key=f"{run_id}/finished",
                                         payload=EvalRunFinished(status=report.status, summary=report.to_dict(),
                                                                 error=report.error)))  # fmt: skip
    if finished.payload.get("summary", {}).get("run_id") != run_id:
        log.warning("run %s was already closed by another writer; its EvalRunFinished lacks this report "
                    "(the results JSON has it)", run_id)  # fmt: skip
    if tensorboard_dir is not None:
        log_tensorboard(
            report, tensorboard_dir, backend.policy_version if tensorboard_step is None else tensorboard_step
        )
    return report


def _record_abort(store: EventStore, run_id: str, exc: BaseException) -> None:
    """Close a run that an exception (or Ctrl-C) ended, so `kbrl runs` does not show it running forever."""
    status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
    store.append_one(NewEvent(run_id=run_id, stream=f"run/{run_id}", key=f"{run_id}/finished",
                              payload=EvalRunFinished(status=status, error=f"{type(exc).__name__}: {exc}"[-4000:])))  # fmt: skip


def _evaluate_multi_turn(backend: Backend, problems: list[Problem], *, k: int, max_tokens: int, temperature: float,
                         kernel_backend: str, store: EventStore, queue: JobQueue, eval_config: EvalConfig,
                         device: Device, model_label: str, ps: Sequence[float], run_id: str, out: Path | None,
                         tensorboard_dir: Path | None, tensorboard_step: int | None, max_turns: int,
                         config: dict[str, Any], timed: bool, why_not: str, retriever: Retriever | None = None,
                         raicl_k: int = 3, max_prompt_tokens: int = 16384) -> ModelEvalReport:  # fmt: skip
    """Kevin-mode evaluation: the training rollout with k trajectories per problem, scored per turn budget."""
    from dataclasses import replace

    from kbrl.config import DatasetBuilder, TrainConfig
    from kbrl.training.replay import replay_run
    from kbrl.training.rewards import preset
    from kbrl.training.rollout import StepRollout

    cfg = TrainConfig(mode="multi_turn", max_turns=max_turns, group_size=k, kernel_backend=kernel_backend,  # type: ignore[arg-type]
                      max_tokens=max_tokens, temperature=temperature, eval_device=device,
                      max_prompt_tokens=max_prompt_tokens, dataset_builder=DatasetBuilder(raicl_k=raicl_k))  # fmt: skip
    weights = replace(preset(1), measure_performance=eval_config.measure_performance)
    t0 = time.perf_counter()
    try:
        StepRollout(store=store, queue=queue, backend=backend, problems={p.id: p for p in problems}, run_id=run_id,
                    cfg=cfg, eval_config=eval_config, device=device, weights=weights,
                    retriever=retriever).run(0, [p.id for p in problems])  # fmt: skip
    except BaseException as exc:
        _record_abort(store, run_id, exc)
        raise
    step = replay_run(store, run_id).steps[0]
    trajectories = step.trajectories()

    def best(turns: list[Any]) -> SampleOutcome:
        """A trajectory's verdict within a budget: its fastest correct turn, else its last turn."""
        outcomes = [SampleOutcome(t.sample_id, t.problem_id, t.verdict, t.failed) for t in turns]
        correct = [o for o in outcomes if o.correct]
        return max(correct, key=lambda o: o.speedup or 0.0) if correct else outcomes[-1]

    by_budget = {t: compute_metrics([best(turns[:t]) for turns in trajectories.values()], k=k, ps=ps, timed=timed,
                                    not_timed_reason=why_not) for t in range(1, max_turns + 1)}  # fmt: skip
    metrics = by_budget[max_turns]
    report = ModelEvalReport(run_id=run_id, model=model_label, status="finished", config=config | {"max_turns": max_turns},
                             metrics=metrics, results_path=str(out) if out is not None else None,
                             seconds={"total": time.perf_counter() - t0}, by_turn_budget=by_budget)  # fmt: skip
    if out is not None:
        samples = {e.key: SampleGenerated.model_validate(e.payload) for e in store.read(run_id=run_id, types=[SampleGenerated])}
        outcomes = [SampleOutcome(s.sample_id, s.problem_id, s.verdict, s.failed) for s in step.samples.values()]
        write_results(out, report, samples, outcomes)
    store.append_one(NewEvent(run_id=run_id, stream=f"run/{run_id}", key=f"{run_id}/finished",
                              payload=EvalRunFinished(status=report.status, summary=report.to_dict())))  # fmt: skip
    if tensorboard_dir is not None:
        log_tensorboard(report, tensorboard_dir, backend.policy_version if tensorboard_step is None else tensorboard_step)
    return report


def _check_args(problems: list[Problem], k: int, kernel_backend: str, device: str, sample_batch: int) -> None:
    if not problems:
        raise ValueError("no problems to evaluate")
    ids = [p.id for p in problems]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate problem ids: {sorted({i for i in ids if ids.count(i) > 1})}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if kernel_backend not in BACKEND_NAMES:
        raise ValueError(f"unknown kernel backend {kernel_backend!r}; choose one of {sorted(BACKEND_NAMES)}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be cuda or cpu, got {device!r}")
    if sample_batch < 1:
        raise ValueError(f"sample_batch must be >= 1, got {sample_batch}")


def _sample_batch(backend: Backend, store: EventStore, queue: JobQueue, run_id: str, batch: list[Problem],
                  first_group: int, *, k: int, max_tokens: int, temperature: float, kernel_backend: str,
                  device: Device, eval_config: EvalConfig, retriever: Retriever | None = None, raicl_k: int = 3,
                  max_prompt_tokens: int = 16384) -> dict[str, SampleGenerated]:  # fmt: skip
    """Sample, record (blobs, then one transaction of `SampleGenerated` per batch), then queue the jobs:
    a job is only submitted once the sample its worker will read is in the store."""
    built = [first_turn_prompt(p, backend=backend, kernel_backend=kernel_backend, retriever=retriever, k=raicl_k,
                               max_prompt_tokens=max_prompt_tokens) for p in batch]  # fmt: skip
    prompts = [prompt for prompt, _ in built]
    groups = backend.sample(prompts, n=k, max_tokens=max_tokens, temperature=temperature)
    events: list[NewEvent] = []
    jobs: list[EvalJob] = []
    out: dict[str, SampleGenerated] = {}
    for offset, (problem, (prompt, rag), sequences) in enumerate(zip(batch, built, groups, strict=True)):
        prompt_ref = store.put_blob(encode_numbers(prompt))
        refs = store.put_blobs([blob for seq in sequences
                                for blob in (encode_numbers(seq.tokens), encode_numbers(seq.logprobs))])  # fmt: skip
        for i, seq in enumerate(sequences):
            sid = sample_id_for(run_id, problem, i)
            payload = SampleGenerated(step=0, group=first_group + offset, traj=f"{problem.id}/{i}", turn=0,
                                      problem_id=problem.id, prompt_ref=prompt_ref, completion_ref=refs[2 * i],
                                      logprobs_ref=refs[2 * i + 1], text=seq.text,
                                      policy_version=backend.sampler_version, n_prompt_tokens=len(prompt),
                                      n_completion_tokens=len(seq.tokens), stop_reason=seq.stop_reason, **rag)  # fmt: skip
            events.append(NewEvent(run_id=run_id, stream=f"sample/{sid}", key=sid, payload=payload))
            jobs.append(EvalJob.for_problem(run_id, sid, problem, None, device, eval_config))
            out[sid] = payload
    store.append(events)
    queue.submit(jobs)
    return out


def _outcome(sample_id: str, problem_id: str, event: Event | None) -> SampleOutcome:
    if event is None:
        return SampleOutcome(sample_id, problem_id, error="no verdict", missing=True)
    if event.type == KernelEvaluated.event_type:
        return SampleOutcome(sample_id, problem_id, result=event.payload["result"])
    if event.type == EvalFailed.event_type:
        return SampleOutcome(sample_id, problem_id, error=str(event.payload.get("error")))
    raise ValueError(f"unexpected verdict event type {event.type!r} for {sample_id}")


@contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    """A rich progress bar on stderr (stdout stays for the summary), or None."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True)) as bar:  # fmt: skip
        yield bar


def write_results(out: Path, report: ModelEvalReport, samples: Mapping[str, SampleGenerated],
                  outcomes: Sequence[SampleOutcome]) -> None:  # fmt: skip
    """The report plus every sample (text, verdict) as JSON, written atomically (tmp file, then rename)."""
    rows = []
    for o in outcomes:
        s = samples[o.sample_id]
        rows.append({"sample_id": o.sample_id, "problem_id": o.problem_id, "text": s.text,
                     "n_completion_tokens": s.n_completion_tokens, "stop_reason": s.stop_reason,
                     "result": dict(o.result) if o.result is not None else None, "error": o.error})  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps({**report.to_dict(), "samples": rows}, indent=1, default=str))
    tmp.replace(out)


def log_tensorboard(report: ModelEvalReport, log_dir: Path, step: int) -> None:
    """The report's headline scalars at `step` (`kbrl.metrics.tensorboard.ScalarLogger`, never fatal)."""
    from kbrl.metrics.tensorboard import ScalarLogger

    with ScalarLogger(log_dir) as writer:
        writer.log(step, report.scalars())


# ------------------------------------------------------------------------------------------ the policy


TINY = "tiny"


def tiny_model_dir(seed: int = 0, root: Path | None = None) -> Path:
    """kbrl's tiny random model (for CPU smoke runs), built once per seed under `root` (default: the
    kbrl cache dir); built aside and renamed, so a killed build leaves nothing half-written behind."""
    from kbrl import settings
    from kbrl.training.tiny import build_tiny_model

    root = root if root is not None else settings.cache_dir()
    path = root / f"tiny-model-seed{seed}"
    if not path.is_dir():
        building = root / f"tiny-model-seed{seed}.building"
        shutil.rmtree(building, ignore_errors=True)
        build_tiny_model(building, seed=seed)
        building.rename(path)
    return path


def _adapter_options(checkpoint: str) -> dict[str, Any]:
    """LoRA shape of a local checkpoint (peft's adapter_config.json): the fresh LoRA must match it."""
    path = Path(checkpoint) / "adapter_config.json"
    if not path.is_file():
        return {}
    cfg = json.loads(path.read_text())
    options: dict[str, Any] = {}
    if cfg.get("r"):
        options["lora_rank"] = int(cfg["r"])
    if cfg.get("lora_alpha"):
        options["lora_alpha"] = float(cfg["lora_alpha"])
    targets = cfg.get("target_modules")
    if targets:
        options["target_modules"] = sorted(targets) if not isinstance(targets, str) else [targets]
    if cfg.get("base_model_name_or_path"):
        options["_base"] = str(cfg["base_model_name_or_path"])
    return options


def load_policy(model: str, backend_kind: str, checkpoint: str | None = None, *, seed: int = 0,
                tiny_root: Path | None = None, **options: Any) -> Backend:  # fmt: skip
    """The policy to evaluate: `make_backend(backend_kind, model, …)`, then `load_checkpoint(checkpoint)`.

    `model` "tiny" (local only) is kbrl's tiny random model, built in the cache dir; with a local
    checkpoint whose adapter names an existing base directory (a `kbrl train` tiny run's warm-started
    `log_path/tiny-model`), that base is used instead, since a LoRA only means something on its own base.
    For a local checkpoint the LoRA rank, alpha and target modules are read from its adapter_config.json
    (explicit `options` win). `options` go to the backend's constructor.
    """
    if backend_kind not in BACKENDS:
        raise ValueError(f"unknown backend {backend_kind!r}; choose one of {', '.join(BACKENDS)}")
    if backend_kind == "local":
        if checkpoint and not Path(checkpoint).is_dir():
            raise FileNotFoundError(f"no checkpoint directory {checkpoint}")
        adapter = _adapter_options(checkpoint) if checkpoint else {}
        base = adapter.pop("_base", None)
        if model == TINY:
            model = base if base and Path(base).is_dir() else str(tiny_model_dir(seed, tiny_root))
        options = adapter | options
    elif model == TINY:
        raise ValueError("model 'tiny' is a local model: use --backend local")
    options.setdefault("seed", seed)
    policy = make_backend(backend_kind, model, **options)
    if checkpoint:
        try:
            policy.load_checkpoint(checkpoint)  # the sampler follows (Backend contract)
        except BaseException:
            policy.close()
            raise
    return policy


# ------------------------------------------------------------------------------------------ the command


def eval_model_cli(
    model: str,
    backend: str,
    checkpoint: str | None,
    level: int | None,
    source: str,
    problem_ids: list[str] | None,
    k: int,
    max_tokens: int,
    temperature: float,
    kernel_backend: str,
    device: str,
    out: Path,
    timeout: float,
    trials: int,
    tensorboard_dir: Path | None,
    tensorboard_step: int | None,
    *,
    seed: int = 0,
    run_id: str | None = None,
    ps: Sequence[float] = DEFAULT_PS,
    progress: bool = True,
    console: Any = None,
    max_turns: int = 1,
    rag_index: str | None = None,
    raicl_k: int = 3,
    allow_same_task: bool = False,
    max_prompt_tokens: int = 16384,
) -> int:
    """`kbrl eval-model`: build store, queue, problems and policy from the options, run, print a summary.

    Exit code 0 when every verdict arrived, 1 when the run failed or some verdicts are missing, 2 for bad
    options (unknown problem ids or backends, a missing checkpoint). `device` "auto" means the GPU
    workers when a broker is configured, else this host's GPU if it has one, else cpu.
    """
    from rich.console import Console

    from kbrl import settings
    from kbrl.problems import ProblemLoadError, load_problems
    from kbrl.workers.queue import make_queue, resolve_eval_device

    console = console or Console()

    def fail(message: str) -> int:
        console.print(f"[red]error:[/] {message}", markup=True, highlight=False)
        return 2

    device = resolve_eval_device(device)
    if device not in ("cuda", "cpu"):
        return fail(f"--device must be auto, cuda or cpu, not {device!r}")
    if kernel_backend not in BACKEND_NAMES:
        return fail(
            f"--kernel-backend must be one of {', '.join(sorted(BACKEND_NAMES))}, not {kernel_backend!r}"
        )
    if backend not in BACKENDS:
        return fail(f"--backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if k < 1 or max_tokens < 1 or max_turns < 1 or raicl_k < 1:
        return fail("--k, --max-tokens, --max-turns and --raicl-k must be at least 1")
    try:
        problems = load_problems(source, level=level)
        eval_config = EvalConfig(n_trials=trials, timeout_s=timeout, device=device)
    except (ProblemLoadError, ValueError) as exc:
        return fail(str(exc))
    if problem_ids:
        by_id = {p.id: p for p in problems}
        unknown = [pid for pid in problem_ids if pid not in by_id]
        if unknown:
            return fail(f"no problem {', '.join(unknown)} in source {source!r}"
                        + (f" level {level}" if level is not None else ""))  # fmt: skip
        problems = [by_id[pid] for pid in dict.fromkeys(problem_ids)]
    if not problems:
        return fail(
            f"source {source!r} has no problems" + (f" at level {level}" if level is not None else "")
        )
    label = model if not checkpoint else f"{model}@{checkpoint}"
    try:
        retriever = open_retriever(rag_index, allow_same_task=allow_same_task) if rag_index else None
    except ValueError as exc:
        return fail(f"--rag-index: {exc}")
    try:
        policy = load_policy(model, backend, checkpoint, seed=seed)
    except (FileNotFoundError, ValueError) as exc:
        return fail(str(exc))
    store = EventStore(settings.database_url())
    queue = make_queue(store)
    try:
        with policy:
            report = evaluate_model(policy, problems, k=k, max_tokens=max_tokens, temperature=temperature,
                                    kernel_backend=kernel_backend, store=store, queue=queue, eval_config=eval_config,
                                    device=device, model_label=label, ps=ps, run_id=run_id, progress=progress,
                                    out=out, tensorboard_dir=tensorboard_dir, tensorboard_step=tensorboard_step,
                                    max_turns=max_turns, retriever=retriever, raicl_k=raicl_k,
                                    max_prompt_tokens=max_prompt_tokens)  # fmt: skip
    except ValueError as exc:
        return fail(str(exc))
    finally:
        queue.close()
    print_report(console, report)
    return 0 if report.status == "finished" else 1


def print_report(console: Any, report: ModelEvalReport) -> None:
    """Per-problem table, then the headline metrics and the notes (why a value is missing)."""
    from rich.table import Table

    m = report.metrics

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{100 * v:.1f}%"

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    table = Table(
        "problem", "correct", "compiled", "best speedup", "categories", title=f"eval-model: {report.model}"
    )
    for s in m.problems:
        cats = ", ".join(f"{c} {n}" for c, n in sorted(s.categories.items()))
        table.add_row(s.problem_id, f"{s.n_correct}/{s.n}", f"{s.n_compiled}/{s.n}", x(s.best_speedup), cats)
    console.print(table)
    headline = Table("metric", "value", title=f"{m.n_problems} problems × k={m.k}", show_header=False)
    for kk, v in m.pass_at.items():
        headline.add_row(f"pass@{kk}", pct(v))
    for p, v in m.fast_p.items():
        headline.add_row(f"fast_{p_label(p)} (per sample)", pct(v))
    if m.k in m.fast_at and m.k > 1:
        for p, v in m.fast_p_at_k.items():
            headline.add_row(f"fast_{p_label(p)}@{m.k} (best of {m.k})", pct(v))
    headline.add_row("compile rate", pct(m.compile_rate))
    headline.add_row("correct rate", pct(m.correct_rate))
    headline.add_row("speedup of correct (mean / geomean)", f"{x(m.mean_speedup)} / {x(m.geomean_speedup)}")
    headline.add_row("categories", ", ".join(f"{c} {n}" for c, n in sorted(m.categories.items())) or "-")
    console.print(headline)
    if report.by_turn_budget:
        budgets = Table("turns ≤", "pass@1", f"pass@{max(m.pass_at)}", "correct rate", "compile rate", "fast_1",
                        title="what the extra turns buy")  # fmt: skip
        for t, mt in report.by_turn_budget.items():
            budgets.add_row(str(t), pct(mt.pass_at.get(1)), pct(mt.pass_at.get(max(mt.pass_at))), pct(mt.correct_rate),
                            pct(mt.compile_rate), pct(mt.fast_p.get(1.0)))  # fmt: skip
        console.print(budgets)
    for note in m.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    status = f"status {report.status}" + (f" ({report.error})" if report.error else "")
    console.print(f"run id: {report.run_id}   {status}" + (f"   results: {report.results_path}" if report.results_path else ""),
                  markup=False, highlight=False)  # fmt: skip


__all__ = [
    "DEFAULT_PS",
    "ModelEvalReport",
    "ModelMetrics",
    "ProblemScore",
    "SampleOutcome",
    "compute_metrics",
    "eval_model_cli",
    "evaluate_model",
    "load_policy",
    "pass_at_k",
    "pass_ks",
    "print_report",
    "tiny_model_dir",
]

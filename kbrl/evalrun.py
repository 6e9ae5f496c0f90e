"""An evaluation run: candidates → evaluator → `KernelEvaluated` events, results JSON and a summary.

Shared by `kbrl eval-kernels` and `kbrl demo`. Results are written after every candidate, so a crash
loses nothing already evaluated.
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kbrl.kernels.evaluator import EvalConfig, Evaluator, config_dict, result_summary
from kbrl.kernels.result import Category, EvalResult
from kbrl.problems import get_problem, load_problems
from kbrl.problems.model import Problem

GENERATION_FILE = re.compile(r"level_(\d+)_problem_(\d+)_sample_(\d+)_kernel\.py$")


@dataclass
class Candidate:
    sample_id: str
    problem: Problem
    text: str


def builtin_candidates(level: int | None = None, backend: str | None = None) -> list[Candidate]:
    """kbrl's own correct solutions for its built-in problems (the demo and the tests use them)."""
    from kbrl.problems import builtin_solutions

    out = []
    for problem in load_problems("builtin", level=level):
        for name, source in sorted(builtin_solutions(problem).items()):
            if backend is None or name == backend:
                out.append(Candidate(f"{problem.id}/{name}", problem, source))
    return out


def collect_candidates(path: Path, problem_id: str | None, source: str | None) -> list[Candidate]:
    """One file (with `--problem`) or a KernelBench generations directory."""
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_file():
        if problem_id is None:
            raise ValueError("a single candidate file needs --problem (e.g. --problem builtin/L1/1)")
        problem = get_problem(problem_id, source=source or problem_id.split("/", 1)[0])
        return [Candidate(path.stem, problem, path.read_text())]
    source = source or ("kernelbench" if os.environ.get("KERNELBENCH_ROOT") else "builtin")
    by_key = {(p.level, p.number): p for p in load_problems(source)}
    out = []
    files = sorted(path.glob("level_*_problem_*_sample_*_kernel.py"))
    if not files:
        raise ValueError(f"{path} holds no level_{{L}}_problem_{{N}}_sample_{{S}}_kernel.py files")
    for f in files:
        m = GENERATION_FILE.search(f.name)
        if m is None:
            continue
        level, number, sample = (int(g) for g in m.groups())
        if (level, number) not in by_key:
            raise KeyError(f"{f.name}: no level {level} problem {number} in source {source!r}")
        out.append(Candidate(f"L{level}/P{number}/S{sample}", by_key[(level, number)], f.read_text()))
    return out


def new_run_id(kind: str) -> str:
    """Readable, sortable and unique: `{kind}-{UTC time}-{random}`."""
    return f"{kind}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def _write_results(out: Path, meta: dict[str, Any], results: dict[str, EvalResult]) -> None:
    payload = {**meta, "results": {k: r.to_dict() for k, r in results.items()},
               "summary": result_summary(list(results.values()))}  # fmt: skip
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(out)


def run_evaluation(
    candidates: list[Candidate],
    config: EvalConfig,
    *,
    jobs: int = 1,
    out: Path | None = None,
    as_json: bool = False,
    record: bool = True,
    kind: str = "eval-kernels",
    store_url: str | None = None,
) -> list[EvalResult]:
    """Evaluate all candidates with a progress bar; record events; print a summary; return results in order."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=as_json)
    evaluator = Evaluator(config)
    run_id = new_run_id(kind)
    meta = {"run_id": run_id, "device": evaluator.device, "config": config_dict(config)}
    store = None
    if record:
        from kbrl.events.payloads import EvalRunStarted
        from kbrl.events.store import EventStore, NewEvent

        store = EventStore(store_url)
        problem_ids = sorted({c.problem.id for c in candidates})
        store.append([NewEvent(run_id=run_id, stream=f"run/{run_id}", key=f"{run_id}/started",
                               payload=EvalRunStarted(kind=kind, config=meta["config"], problem_ids=problem_ids,
                                                      n_candidates=len(candidates)))])  # fmt: skip
    results: dict[str, EvalResult] = {}
    worker = socket.gethostname()
    status = "failed"
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=as_json) as bar:  # fmt: skip
            task = bar.add_task(f"evaluating on {evaluator.device}", total=len(candidates))
            pairs = [(c.problem, c.text) for c in candidates]
            for index, result in evaluator.evaluate_many(pairs, jobs=jobs):
                cand = candidates[index]
                results[cand.sample_id] = result
                if store is not None:
                    from kbrl.events.payloads import KernelEvaluated
                    from kbrl.events.store import NewEvent
                    from kbrl.workers.jobs import evaluated_key

                    store.append([NewEvent(run_id=run_id, stream=f"sample/{cand.sample_id}",
                                           key=evaluated_key(run_id, cand.sample_id),
                                           payload=KernelEvaluated(sample_id=cand.sample_id, problem_id=cand.problem.id,
                                                                   worker=worker, gpu=evaluator.device,
                                                                   result=result.to_dict()))])  # fmt: skip
                if out is not None:
                    _write_results(out, meta, results)
                bar.update(task, advance=1, description=f"{cand.sample_id}: {result.category}")
        status = "finished"
    finally:
        if store is not None:
            from kbrl.events.payloads import EvalRunFinished
            from kbrl.events.store import NewEvent

            summary = result_summary(list(results.values()))
            store.append([NewEvent(run_id=run_id, stream=f"run/{run_id}", key=f"{run_id}/finished",
                                   payload=EvalRunFinished(status=status, summary=summary))])  # fmt: skip
    ordered = [results[c.sample_id] for c in candidates]
    if as_json:
        print(json.dumps({**meta, "results": {c.sample_id: results[c.sample_id].to_dict() for c in candidates},
                          "summary": result_summary(ordered)}))  # fmt: skip
    else:
        _print_tables(console, candidates, ordered, run_id, out)
    return ordered


def _print_tables(console: Any, candidates: list[Candidate], results: list[EvalResult], run_id: str,
                  out: Path | None) -> None:  # fmt: skip
    from rich.table import Table

    table = Table("sample", "backend", "category", "trials", "max err", "runtime ms", "vs eager", "vs compile",
                  "seconds", title="Candidates")  # fmt: skip
    for cand, r in zip(candidates, results):
        style = {Category.CORRECT: "green", Category.UNVERIFIED: "yellow"}.get(r.category, "red")
        table.add_row(
            cand.sample_id, r.backend, f"[{style}]{r.category}[/]", f"{r.n_correct}/{r.n_trials}",
            f"{r.max_abs_err:.2e}" if r.max_abs_err is not None else "-",
            f"{r.runtime.median_ms:.4f}" if r.runtime else "-",
            f"{r.speedup_eager:.2f}x" if r.speedup_eager else "-",
            f"{r.speedup_compile:.2f}x" if r.speedup_compile else "-",
            f"{r.stage_seconds.get('total', 0):.1f}",
        )  # fmt: skip
    console.print(table)
    if len(results) == 1:
        from rich.panel import Panel

        console.print(Panel(results[0].feedback, title="feedback", expand=False), markup=False)
    s = result_summary(results)

    def pct(v: float | None) -> str:
        return "n/a (no timing)" if v is None else f"{100 * v:.1f}%"

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    console.print(
        f"[bold]{s['n']} candidates[/]  compiled {pct(s['compile_rate'])}  correct {pct(s['correct_rate'])}  "
        f"fast_1 {pct(s['fast_1'])}  mean speedup {x(s['mean_speedup'])}  geomean {x(s['geomean_speedup'])}"
    )
    console.print(f"categories: {s['categories']}")
    console.print(f"run id: {run_id}" + (f"   results: {out}" if out else ""))

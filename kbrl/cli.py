"""The `kbrl` command. Heavy imports happen inside commands so `kbrl --help` stays instant."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kbrl import settings

app = typer.Typer(
    help="kbrl: train LLMs with RL to write fast, correct CUDA/Triton kernels (KernelBench environment).\n\n"
    "Store: KBRL_DATABASE_URL (default sqlite:///./kbrl.db). Queue: KBRL_BROKER_URL (default: in-process).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)
db_app = typer.Typer(help="Event store maintenance.", no_args_is_help=True)
enqueue_app = typer.Typer(help="Push jobs to the queue (needs KBRL_BROKER_URL) — not built yet.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(enqueue_app, name="enqueue")


@app.callback()
def _main() -> None:
    settings.load_dotenv()


def _not_built(what: str, issue: int) -> None:
    typer.echo(f"`kbrl {what}` is not built yet (planned in issue #{issue}); nothing was done.", err=True)
    raise typer.Exit(2)


# ------------------------------------------------------------------------------------------ store


@db_app.command("upgrade")
def db_upgrade(
    url: Annotated[str | None, typer.Option(help="Database URL (default: KBRL_DATABASE_URL or ./kbrl.db).")] = None,
) -> None:
    """Apply the event store's Alembic migrations (also done automatically on first use)."""
    from kbrl.events import commands

    commands.db_upgrade(url or settings.database_url())


@app.command()
def runs(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """List runs (training and evaluation) with their status."""
    from kbrl.events import commands

    commands.list_runs(settings.database_url(), as_json)


@app.command()
def replay(
    run_id: Annotated[str, typer.Argument(help="Run id, as printed by `kbrl runs`.")],
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines instead of a table.")] = False,
    types: Annotated[list[str] | None, typer.Option("--type", help="Only these event types (repeatable).")] = None,
    advantages: Annotated[bool, typer.Option(help="Recompute rewards/advantages (issue #5).")] = False,
    reward_weights: Annotated[str | None, typer.Option(help="What-if re-scoring weights (issue #5).")] = None,
) -> None:
    """Print the event log of a run, in order."""
    if advantages or reward_weights:
        _not_built("replay --advantages/--reward-weights", 5)
    from kbrl.events import commands

    if commands.replay(settings.database_url(), run_id, as_json, types) < 0:
        raise typer.Exit(1)


# ------------------------------------------------------------------------------------------ evaluation


@app.command()
def problems(
    source: Annotated[str, typer.Option(help="builtin | kernelbench (KERNELBENCH_ROOT) | hf[:ID or path] | DIR")] = "builtin",
    level: Annotated[int | None, typer.Option(help="Only this level.")] = None,
) -> None:
    """List the problems of a source."""
    from rich.console import Console
    from rich.table import Table

    from kbrl.problems import load_problems

    table = Table("id", "name", "lines")
    for p in load_problems(source, level=level):
        table.add_row(p.id, p.name, str(p.code.count("\n") + 1))
    Console().print(table)


@app.command("eval-kernels")
def eval_kernels(
    path: Annotated[Path, typer.Argument(help="A candidate file, or a generations directory of "
                                              "level_{L}_problem_{N}_sample_{S}_kernel.py files.")],
    problem: Annotated[str | None, typer.Option(help="Problem id for a single file, e.g. builtin/L1/1.")] = None,
    source: Annotated[str | None, typer.Option(help="Problem source for a generations directory "
                                                    "(default: kernelbench if KERNELBENCH_ROOT is set, else builtin).")] = None,
    out: Annotated[Path | None, typer.Option(help="Results JSON path.")] = Path("eval_results.json"),
    as_json: Annotated[bool, typer.Option("--json", help="Print results as JSON instead of tables.")] = False,
    jobs: Annotated[int, typer.Option(help="Candidates evaluated concurrently (GPU timing stays serial).")] = 1,
    device: Annotated[str, typer.Option(help="auto | cuda | cpu")] = "auto",
    trials: Annotated[int, typer.Option(help="Correctness trials with fresh seeded inputs.")] = 5,
    timing_trials: Annotated[int, typer.Option(help="Timed runs per kernel (GPU).")] = 100,
    tolerance: Annotated[str, typer.Option(help="v0.1 (1e-2, KernelBench v0/v0.1) | upstream (fp32 1e-4)")] = "v0.1",
    precision: Annotated[str, typer.Option(help="fp32 | fp16 | bf16")] = "fp32",
    timing: Annotated[bool, typer.Option(help="Measure performance on a GPU.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds per candidate.")] = 180.0,
    record: Annotated[bool, typer.Option(help="Record an eval run in the event store.")] = True,
) -> None:
    """Evaluate kernel candidates: static checks, sandboxed compile, correctness, timing, feedback."""
    from kbrl.evalrun import collect_candidates, run_evaluation
    from kbrl.kernels.evaluator import EvalConfig

    try:
        config = EvalConfig(n_trials=trials, n_timing_trials=timing_trials, tolerance=tolerance,
                            precision=precision, measure_performance=timing, timeout_s=timeout, device=device)  # fmt: skip
        candidates = collect_candidates(path, problem, source)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    run_evaluation(candidates, config, jobs=jobs, out=out, as_json=as_json, record=record, kind="eval-kernels")


@app.command()
def demo(
    backend: Annotated[str, typer.Option(help="triton | cuda | all (default: all on a GPU, triton on CPU).")] = "auto",
    level: Annotated[int | None, typer.Option(help="Only this level.")] = None,
    jobs: Annotated[int, typer.Option(help="Candidates evaluated concurrently.")] = 2,
    out: Annotated[Path, typer.Option(help="Results JSON path.")] = Path("demo_results.json"),
) -> None:
    """The embedded main job: evaluate kbrl's built-in reference kernels and record the run (SQLite, no services).

    Until `kbrl train` lands (issue #5) this is the zero-service end-to-end path: problems → sandboxed
    evaluator → events in the store → `kbrl runs` / `kbrl replay`.
    """
    from kbrl.evalrun import builtin_candidates, run_evaluation
    from kbrl.kernels.evaluator import EvalConfig, resolve_device

    config = EvalConfig()
    if backend == "auto":
        backend = "all" if resolve_device(config.device) == "cuda" else "triton"
    if backend not in ("triton", "cuda", "all"):
        typer.echo("error: --backend must be triton, cuda or all", err=True)
        raise typer.Exit(2)
    candidates = builtin_candidates(level, None if backend == "all" else backend)
    results = run_evaluation(candidates, config, jobs=jobs, out=out, as_json=False, record=True, kind="demo")
    failed = [r.problem_id for r in results if r.category not in ("CORRECT", "UNVERIFIED")]
    if failed:
        typer.echo(f"built-in solutions failed for: {', '.join(failed)}", err=True)
        raise typer.Exit(1)


# ------------------------------------------------------------------------------------------ planned


@app.command()
def worker(
    gpu: Annotated[str | None, typer.Option(help="GPU index, or 'all' for one worker per GPU.")] = None,
) -> None:
    """Start a Celery GPU worker (issue #4, not built yet)."""
    _not_built("worker", 4)


@enqueue_app.command("eval")
def enqueue_eval(
    target: Annotated[str, typer.Argument(help="Generations directory, checkpoint or problem list.")],
) -> None:
    """Enqueue evaluation jobs on Redis (issue #4, not built yet)."""
    _not_built("enqueue eval", 4)


@app.command()
def status(run_id: Annotated[str, typer.Argument(help="Run id.")]) -> None:
    """Progress of a run from the event store: done / in flight / failed by category (issue #4, not built yet)."""
    _not_built("status", 4)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(config: Annotated[Path | None, typer.Option(help="YAML config in kbrl/config/.")] = None) -> None:
    """GRPO training with LoRA through Tinker or a local backend (issue #5, not built yet)."""
    _not_built("train", 5)


@app.command("eval-model", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def eval_model() -> None:
    """pass@k and fast_p of a checkpoint or base model (issue #5, not built yet)."""
    _not_built("eval-model", 5)


@app.command()
def dashboard() -> None:
    """Streamlit dashboard of live runs, trajectories and kernels (issue #6, not built yet)."""
    _not_built("dashboard", 6)


@app.command("build-rag-index", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def build_rag_index() -> None:
    """Build the RA-ICL retrieval index from KernelBook / Sakana archive (issue #8, not built yet)."""
    _not_built("build-rag-index", 8)


if __name__ == "__main__":
    app()

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
enqueue_app = typer.Typer(help="Push jobs to the queue (needs KBRL_BROKER_URL).", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(enqueue_app, name="enqueue")


@app.callback()
def _main() -> None:
    settings.load_dotenv()


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
    advantages: Annotated[bool, typer.Option(help="Recompute every step's rewards and advantages from the "
                                                  "events and compare them with the ones the updates used.")] = False,
    reward_weights: Annotated[str | None, typer.Option(help="What-if: re-score with these weights, e.g. "
                                                            "'stage3' or 'reward_speed_weight=0.5,reward_format_weight=0'.")] = None,
    gamma: Annotated[float | None, typer.Option(help="What-if: another discount for multi-turn returns.")] = None,
    metrics: Annotated[bool, typer.Option(help="Per-step metrics projected from the events (as TensorBoard and the dashboard show them).")] = False,
    tensorboard: Annotated[Path | None, typer.Option(help="Rebuild the run's TensorBoard files in this directory from its events.")] = None,
    samples: Annotated[bool, typer.Option("--samples", help="Each sample's prompt: decoded text, RA-ICL example ids "
                                                            "and the leakage guard's removals.")] = False,
    tokenizer: Annotated[str | None, typer.Option(help="With --samples: tokenizer (HF id or directory) to decode "
                                                       "prompts with (default: the run's model).")] = None,
) -> None:
    """Print the event log of a run, in order (or, with --advantages, its rewards and advantages)."""
    if samples:
        from kbrl.training.report import print_samples

        raise typer.Exit(print_samples(settings.database_url(), run_id, tokenizer, as_json))
    if metrics or tensorboard:
        from kbrl.events.store import EventStore
        from kbrl.metrics.projections import print_metrics, write_tensorboard

        if tensorboard:
            write_tensorboard(EventStore(settings.database_url()), run_id, tensorboard)
        raise typer.Exit(print_metrics(settings.database_url(), run_id, as_json) if metrics else 0)
    if advantages or reward_weights or gamma is not None:
        from kbrl.training.report import print_advantages

        try:
            code = print_advantages(settings.database_url(), run_id, reward_weights, as_json, gamma)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        raise typer.Exit(code)
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


# ------------------------------------------------------------------------------------------ queue


@app.command()
def worker(
    gpu: Annotated[str | None, typer.Option(help="Own this GPU index (sets CUDA_VISIBLE_DEVICES); queue kbrl.gpu.")] = None,
    gpus: Annotated[str | None, typer.Option(help="'all': one worker process per visible GPU.")] = None,
    cpu: Annotated[bool, typer.Option("--cpu", help="CPU worker (queue kbrl.cpu): CUDA prebuilds, CPU evaluations.")] = False,
    concurrency: Annotated[int | None, typer.Option(help="Jobs at once on a CPU worker (default: CPU count).")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level.")] = "info",
) -> None:
    """Start a Celery worker on KBRL_BROKER_URL (with no option: one per GPU, or a CPU worker without GPUs).

    Jobs are acked only when done, so a worker that dies loses nothing: its job is redelivered. SIGTERM
    finishes the job in hand, then exits; a second SIGTERM (or SIGQUIT) stops at once and the job is
    redelivered.
    """
    import os

    from kbrl.workers import launch

    if not settings.broker_url():
        typer.echo("error: KBRL_BROKER_URL is not set (e.g. redis://127.0.0.1:6379/0); without a broker kbrl "
                   "evaluates in-process and needs no worker", err=True)  # fmt: skip
        raise typer.Exit(2)
    if sum(x is not None and x is not False for x in (gpu, gpus, cpu or None)) > 1:
        typer.echo("error: choose one of --gpu N, --gpus all, --cpu", err=True)
        raise typer.Exit(2)
    if gpu is not None:
        launch.exec_gpu_worker(gpu, loglevel)
    if gpus is not None and gpus != "all":
        typer.echo("error: --gpus takes 'all' (use --gpu N for one GPU)", err=True)
        raise typer.Exit(2)
    visible = launch.visible_gpus() if not cpu else []
    if visible:
        raise typer.Exit(launch.run_gpu_fleet(visible, loglevel))
    if gpus == "all":
        typer.echo("error: --gpus all, but no GPU is visible on this host (use --cpu)", err=True)
        raise typer.Exit(2)
    launch.exec_cpu_worker(concurrency or os.cpu_count() or 1, loglevel)


@enqueue_app.command("eval")
def enqueue_eval(
    target: Annotated[str, typer.Argument(help="A generations directory (level_{L}_problem_{N}_sample_{S}_kernel.py), "
                                               "one candidate file (with --problem), or 'builtin' for kbrl's own "
                                               "reference kernels (a smoke test of the fleet).")],
    problem: Annotated[str | None, typer.Option(help="Problem id for a single file, e.g. builtin/L1/1.")] = None,
    source: Annotated[str | None, typer.Option(help="Problem source for a generations directory.")] = None,
    problems: Annotated[str | None, typer.Option(help="With 'builtin': comma-separated problem ids to include.")] = None,
    backend: Annotated[str | None, typer.Option(help="With 'builtin': triton or cuda only.")] = None,
    device: Annotated[str, typer.Option(help="cuda (GPU workers, queue kbrl.gpu) | cpu (CPU workers: "
                                             "Triton interpreter, CUDA compile-only; queue kbrl.cpu)")] = "cuda",
    trials: Annotated[int, typer.Option(help="Correctness trials with fresh seeded inputs.")] = 5,
    timing_trials: Annotated[int, typer.Option(help="Timed runs per kernel (GPU).")] = 100,
    tolerance: Annotated[str, typer.Option(help="v0.1 (1e-2) | upstream (fp32 1e-4)")] = "v0.1",
    timeout: Annotated[float, typer.Option(help="Seconds per candidate.")] = 180.0,
    wait: Annotated[bool, typer.Option(help="Follow the verdicts with a progress bar until all are in.")] = False,
    wait_timeout: Annotated[float | None, typer.Option(help="Give up waiting after this many seconds.")] = None,
) -> None:
    """Push evaluation jobs to the queue (KBRL_BROKER_URL) and print the run id for `kbrl status`.

    To evaluate a checkpoint or a base model on the fleet, use `kbrl eval-model` with KBRL_BROKER_URL set: it
    samples first, then enqueues one job per sample the same way.
    """
    from pathlib import Path

    from kbrl.evalrun import builtin_candidates, collect_candidates
    from kbrl.events.store import EventStore
    from kbrl.kernels.evaluator import EvalConfig
    from kbrl.workers.enqueue import enqueue_eval as push
    from kbrl.workers.enqueue import wait_with_progress
    from kbrl.workers.queue import CeleryQueue
    from kbrl.workers.status import print_status

    if not settings.broker_url():
        typer.echo("error: KBRL_BROKER_URL is not set, so there is no queue to push to; evaluate in this process "
                   "with `kbrl eval-kernels PATH` instead", err=True)  # fmt: skip
        raise typer.Exit(2)
    if device not in ("cuda", "cpu"):
        typer.echo("error: --device must be cuda or cpu", err=True)
        raise typer.Exit(2)
    try:
        config = EvalConfig(n_trials=trials, n_timing_trials=timing_trials, tolerance=tolerance, timeout_s=timeout)
        if target == "builtin":
            candidates = builtin_candidates(None, backend)
            if problems:
                wanted = {p.strip() for p in problems.split(",") if p.strip()}
                candidates = [c for c in candidates if c.problem.id in wanted]
        else:
            candidates = collect_candidates(Path(target), problem, source)
        store = EventStore(settings.database_url())
        queue = CeleryQueue(store)
        run_id, jobs = push(store, queue, candidates, config, device)  # type: ignore[arg-type]
    except (ValueError, FileNotFoundError, KeyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    queue.close()
    typer.echo(run_id)
    if wait:
        found = wait_with_progress(store, run_id, jobs, wait_timeout)
        print_status(store, run_id)
        if len(found) < len(jobs):
            raise typer.Exit(1)


@app.command()
def status(
    run_id: Annotated[str, typer.Argument(help="Run id (printed by `kbrl enqueue eval`, listed by `kbrl runs`).")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Progress of a run from the event store: done / in flight / failed, by category, and live workers."""
    from kbrl.events.store import EventStore
    from kbrl.workers.status import print_status

    raise typer.Exit(print_status(EventStore(settings.database_url()), run_id, as_json))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def train(
    ctx: typer.Context,
    config: Annotated[str | None, typer.Option(help="YAML config: a path, or a packaged name (default, stage1, "
                                                    "stage2, stage3, tiny_cpu). Then key=value overrides.")] = None,
    resume: Annotated[str | None, typer.Option(help="Resume this run id with the config it recorded "
                                                    "(an n_steps=N override may extend it).")] = None,
) -> None:
    """GRPO training with LoRA (Tinker or local): sample → evaluate through the queue → update → checkpoint.

    Overrides use the seed's names, e.g. `kbrl train --config stage2 model_name=Qwen/Qwen3-8B group_size=16
    dataset_builder.reward_speed_weight=0.3`. Every sample, evaluation and update is an event: a killed run
    resumes with `kbrl train --resume RUN_ID`, reusing its recorded samples. TensorBoard: log_path/tensorboard.
    """
    from rich.console import Console

    from kbrl.config import load_config
    from kbrl.training.trainer import TrainingError
    from kbrl.training.trainer import train as run_training

    console = Console()
    try:
        cfg = load_config(config, ctx.args) if (config or ctx.args or resume is None) else None
        run_id, reports = run_training(cfg, resume=resume, console=console)
    except (ValueError, TrainingError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    console.print(f"run {run_id}: {len(reports)} steps trained in this call; `kbrl replay {run_id} --advantages`")


@app.command("eval-model")
def eval_model(
    model: Annotated[str, typer.Option(help="HF id or local dir of the base model; 'tiny': kbrl's tiny random model (CPU smoke run).")] = "tiny",
    backend: Annotated[str, typer.Option(help="local | tinker")] = "local",
    checkpoint: Annotated[str | None, typer.Option(help="save_checkpoint path loaded on top of the model (local: LoRA dir).")] = None,
    level: Annotated[int | None, typer.Option(help="Only this level.")] = None,
    source: Annotated[str, typer.Option(help="builtin | kernelbench[:DIR] | hf[:NAME] | PATH")] = "builtin",
    problem: Annotated[list[str] | None, typer.Option("--problem", help="Problem id (repeatable), e.g. builtin/L1/5.")] = None,
    k: Annotated[int, typer.Option("--k", "-k", help="Samples per problem (pass@1..k, fast_p@k).")] = 1,
    max_tokens: Annotated[int, typer.Option(help="Completion length limit.")] = 4096,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (0: greedy).")] = 1.0,
    kernel_backend: Annotated[str, typer.Option(help="triton | cuda: what the prompt asks for.")] = "triton",
    device: Annotated[str, typer.Option(help="auto | cuda | cpu (cpu: correctness only, fast_p n/a).")] = "auto",
    out: Annotated[Path, typer.Option(help="Results JSON path.")] = Path("eval_model_results.json"),
    timeout: Annotated[float, typer.Option(help="Seconds per candidate evaluation.")] = 180.0,
    trials: Annotated[int, typer.Option(help="Correctness trials per candidate.")] = 5,
    tensorboard_dir: Annotated[Path | None, typer.Option(help="Write the headline scalars here.")] = None,
    tensorboard_step: Annotated[int | None, typer.Option(help="TensorBoard step (default: the policy version).")] = None,
    run_id: Annotated[str | None, typer.Option(help="Run id (default: eval-model-<time>-<rand>).")] = None,
    seed: Annotated[int, typer.Option(help="Sampling / tiny-model seed.")] = 0,
    max_turns: Annotated[int, typer.Option(help="Kevin mode: turns per trajectory, each seeing the previous "
                                                "kernel's feedback; reports every turn budget.")] = 1,
    rag_index: Annotated[str | None, typer.Option(help="RA-ICL: retrieve examples into the first-turn prompts "
                                                       "from this index (`kbrl build-rag-index`).")] = None,
    raicl_k: Annotated[int, typer.Option(help="RA-ICL: examples per prompt.")] = 3,
    allow_same_task: Annotated[bool, typer.Option("--allow-same-task", help="RA-ICL: turn the leakage guard off "
                                                                          "(ablations: shows a problem's own solutions).")] = False,
    max_prompt_tokens: Annotated[int, typer.Option(help="RA-ICL: examples are dropped (longest first) beyond this.")] = 16384,
) -> None:
    """pass@k and fast_p of a base model or checkpoint: sample k per problem, evaluate through the queue.

    Jobs go to the Celery workers when KBRL_BROKER_URL is set (this is how a checkpoint is evaluated on the
    GPU fleet), else to the in-process queue. Records an eval run in the store and writes a results JSON.
    """
    from kbrl.training.model_eval import eval_model_cli

    raise typer.Exit(eval_model_cli(model, backend, checkpoint, level, source, problem, k, max_tokens, temperature,
                                    kernel_backend, device, out, timeout, trials, tensorboard_dir, tensorboard_step,
                                    seed=seed, run_id=run_id, max_turns=max_turns, rag_index=rag_index,
                                    raicl_k=raicl_k, allow_same_task=allow_same_task,
                                    max_prompt_tokens=max_prompt_tokens))  # fmt: skip


@app.command()
def dashboard(
    host: Annotated[str, typer.Option(help="Address to bind; keep 127.0.0.1 unless an authenticating proxy is in front (dashboard/README.md).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8501,
) -> None:
    """Streamlit dashboard of live runs, trajectories, kernels and workers, read from the event store."""
    from kbrl.metrics.serve import launch

    raise typer.Exit(launch(host, port, settings.database_url()))


@app.command("build-rag-index")
def build_rag_index(
    output: Annotated[Path, typer.Option(help="Directory to write the index into (index.faiss, examples.jsonl, meta.json).")],
    kernelbook: Annotated[str, typer.Option(help="KernelBook: a Hugging Face id, a directory or .parquet file, or 'none'.")] = "GPUMODE/KernelBook",
    sakana: Annotated[str, typer.Option(help="AI CUDA Engineer archive: a Hugging Face id, a directory (level_N*.parquet) or 'none'.")] = "SakanaAI/AI-CUDA-Engineer-Archive",
    triton_only: Annotated[bool, typer.Option("--triton-only", help="Only Triton examples (KernelBook).")] = False,
    cuda_only: Annotated[bool, typer.Option("--cuda-only", help="Only CUDA examples (Sakana archive).")] = False,
    sakana_levels: Annotated[str, typer.Option(help="Sakana splits to read, e.g. 1,2.")] = "1,2,3",
    include_incorrect: Annotated[bool, typer.Option("--include-incorrect", help="Keep Sakana kernels marked incorrect.")] = False,
    model: Annotated[str, typer.Option(help="sentence-transformers model: a Hugging Face id or a local directory.")] = "BAAI/bge-code-v1",
    index_type: Annotated[str, typer.Option(help="auto (flat up to 200k) | flat (exact) | hnsw | ivf")] = "auto",
    batch_size: Annotated[int, typer.Option(help="Texts per embedding batch.")] = 32,
    device: Annotated[str | None, typer.Option(help="Embedding device (cpu, cuda); default cpu.")] = None,
) -> None:
    """Build the RA-ICL retrieval index: corpora → filter → de-duplicate → embed → FAISS, saved with metadata."""
    from kbrl.rag.corpus import CorpusError, CorpusFilter
    from kbrl.rag.embed import EmbedError
    from kbrl.rag.index import RagIndexError
    from kbrl.rag.index import build_rag_index as build

    try:
        levels = tuple(int(x) for x in sakana_levels.split(",") if x.strip())
    except ValueError:
        typer.echo(f"error: --sakana-levels takes comma-separated numbers, got {sakana_levels!r}", err=True)
        raise typer.Exit(2) from None
    if index_type not in ("auto", "flat", "hnsw", "ivf"):
        typer.echo("error: --index-type must be auto, flat, hnsw or ivf", err=True)
        raise typer.Exit(2)
    try:
        filters = CorpusFilter(triton_only=triton_only, cuda_only=cuda_only, sakana_levels=levels,
                               include_incorrect=include_incorrect)  # fmt: skip
        index = build(output, kernelbook=None if kernelbook == "none" else kernelbook,
                      sakana=None if sakana == "none" else sakana, filters=filters, model=model,
                      kind=index_type, batch_size=batch_size, device=device)  # type: ignore[arg-type]  # fmt: skip
    except (CorpusError, EmbedError, RagIndexError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    meta = index.meta
    typer.echo(f"{output}: {meta['n_examples']} examples ({meta['counts']['kept']}; read {meta['counts']['read']}, "
               f"{meta['counts']['filtered_out']} filtered out, {meta['counts']['duplicates']} duplicates), "
               f"{meta['index_type']} index of dimension {meta['dim']}, model {meta['model']}, {meta['total_seconds']:.1f} s")  # fmt: skip


if __name__ == "__main__":
    app()

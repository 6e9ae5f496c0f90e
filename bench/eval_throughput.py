"""Side-by-side throughput of kbrl's evaluator and KernelBench's own harness on the same candidates.

Usage (on a CUDA host, from the repo root; KernelBench is a checkout on that machine, never vendored):
    PYTHONPATH=. KERNELBENCH_ROOT=~/KernelBench python3 bench/eval_throughput.py --out throughput.json
    PYTHONPATH=. python3 bench/eval_throughput.py --device cpu --harness kbrl --backends triton --limit 3 \
        --repeats 2 --repeat-samples builtin/L1/5/triton   # CPU smoke check of the kbrl half

Candidates (`--candidates`): `builtin` = kbrl's own Triton and CUDA solutions of its built-in problems;
`kernelbench` = the same solutions on the KernelBench level-1/2 problems of the same name (e.g. L1/19
ReLU, L1/23 Softmax; KernelBench's large shapes); `--generations DIR` adds a KernelBench generations
directory (`level_{L}_problem_{N}_sample_{S}_kernel.py`, problems from the checkout).

KernelBench's eval imports, through its package's utils: torch, numpy, requests, tqdm, pydantic,
python-dotenv, openai and litellm. The driver stands in for openai and litellm (and dotenv) when they
are absent (LLM clients; the eval never calls them). pydantic must be importable: on the lent GPU
machines it travels as wheels in `.kb/wheels` (bench/prepare_kernelbench.sh, bench/device_run.sh
throughput), put on the KernelBench processes' path with `--kb-path` / $KB_SITE.

For each backend (triton first, then cuda), in this order and never two at once on the GPU:
  kbrl         one warm `Evaluator` (fresh cache dir per bench run, so this pass is cold: no CUDA
               build, Triton cache, reference output or baseline cached), the backend's candidates
               through `evaluate_many(jobs=--jobs)`; candidates/minute = n / wall of that pass.
  kbrl repeats each `--repeat-samples` candidate of the backend `--repeats` times through the same
               evaluator ("kbrl/warm": reference, baseline and CUDA build cached, as in training), then
               `--fresh-repeats` times through a fresh Evaluator with its baselines file deleted
               ("kbrl/fresh": the eager baseline is re-timed too; builds stay cached).
  kernelbench  each candidate (`--kb-only`/`--kb-limit` pick a subset) in a fresh
               `python3 bench/kb_eval_one.py` process, one after another, as KernelBench's single-sample
               path (scripts/run_and_check.py) runs: static check, `eval_kernel_against_ref` (5
               correctness trials, 100 timed, cuda_event), then the eager (and torch.compile) reference
               timing with `measure_ref_program_time`; speedup = eager mean / kernel mean, as run_and_check
               prints it. Wall per candidate includes process start and the torch import, which a
               per-candidate-process harness pays; candidates/minute = n / sum of walls.
  kb repeats   the repeat samples in fresh processes (everything redone; with the default
               `--kb-build-dir-mode run_and_check` a CUDA kernel is rebuilt every time, because
               run_and_check names its build dir by Python's per-process salted `hash()`).
Repeats report the speedups, their mean and coefficient of variation (population stdev / mean), and
the build seconds / build-cache hits. `--budget-s` stops starting KernelBench evaluations and kbrl's
fresh repeats once spent (kbrl passes and warm repeats always run).

Prints per-candidate rows (stage seconds) and a summary (candidates/minute per harness and backend and the
kbrl/kernelbench ratio, speedup spread); writes everything to `--out` as JSON after every phase, so a run
stopped by `--budget-s` or a timeout keeps what it finished.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HARNESSES = ("kbrl", "kernelbench")
BACKEND_ORDER = ("triton", "cuda", "other")
DRIVER = Path(__file__).resolve().parent / "kb_eval_one.py"
# Display order only: every stage key a harness reports is recorded, including ones not listed here.
KBRL_STAGE_ORDER = ("static", "reference_wait", "spawn", "fork", "build", "compile", "init", "first_call",
                    "correctness", "timing", "sandbox_wall", "total")  # fmt: skip
KB_STAGE_ORDER = ("python_start", "import_torch", "import_kernelbench", "static", "load_reference", "compile",
                  "correctness", "timing_kernel", "timing_reference", "eval", "ref_eager", "ref_compile",
                  "exit", "wall")  # fmt: skip


# ------------------------------------------------------------------------------------------ pure helpers


def cv(values: Iterable[float | None]) -> float | None:
    """Coefficient of variation (population stdev / mean) of the values that are not None; None if < 2."""
    xs = [float(v) for v in values if v is not None]
    if len(xs) < 2 or statistics.fmean(xs) == 0:
        return None
    return statistics.pstdev(xs) / statistics.fmean(xs)


def per_minute(n: int, wall_s: float | None) -> float | None:
    return 60.0 * n / wall_s if wall_s and wall_s > 0 else None


def backend_of(sample_id: str, code: str) -> str:
    """triton / cuda from a builtin id's suffix, else from the code (a `triton.jit` kernel, a C++ build)."""
    tail = sample_id.rsplit("/", 1)[-1]
    if tail in ("triton", "cuda"):
        return tail
    if re.search(r"@triton\.(jit|autotune)", code):
        return "triton"
    if "load_inline" in code or "cpp_extension" in code:
        return "cuda"
    return "other"


def kb_stages(driver: dict[str, Any], spawned_at: float, ended_at: float) -> dict[str, float]:
    """A KernelBench process's stages: its own, plus process start (spawn → first line) and exit."""
    stages = {k: float(v) for k, v in (driver.get("stages") or {}).items()}
    stamps = driver.get("stamps") or {}
    if "start" in stamps:
        stages["python_start"] = max(0.0, stamps["start"] - spawned_at)
    if "end" in stamps:
        stages["exit"] = max(0.0, ended_at - stamps["end"])
    stages["wall"] = ended_at - spawned_at
    return stages


def summarize(rows: list[dict[str, Any]], pass_walls: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Candidates/minute per harness and backend (first pass only) and the kbrl / kernelbench ratio.

    `pass_walls[harness][backend]` is the wall of that harness's pass over that backend's candidates
    (kbrl: one concurrent `evaluate_many`; kernelbench: the sum of its sequential processes).
    """
    out: dict[str, Any] = {}
    backends = sorted({b for walls in pass_walls.values() for b in walls},
                      key=lambda b: BACKEND_ORDER.index(b) if b in BACKEND_ORDER else 99)  # fmt: skip
    for backend in [*backends, "all"]:
        entry: dict[str, Any] = {}
        for harness in HARNESSES:
            walls = pass_walls.get(harness, {})
            mine = [r for r in rows if r["harness"] == harness and r["phase"] == "pass"
                    and (backend == "all" or r["backend"] == backend)]  # fmt: skip
            wall = sum(walls.values()) if backend == "all" else walls.get(backend)
            if not mine or wall is None:
                continue
            entry[harness] = {
                "n": len(mine), "wall_s": wall, "candidates_per_min": per_minute(len(mine), wall),
                "seconds_per_candidate": wall / len(mine),
                "correct": sum(1 for r in mine if r.get("correct")),
                "categories": _count(r.get("category", "?") for r in mine),
                "mean_stage_seconds": _mean_stages(mine),
            }  # fmt: skip
        a, b = entry.get("kbrl", {}), entry.get("kernelbench", {})
        if a.get("candidates_per_min") and b.get("candidates_per_min"):
            entry["ratio_kbrl_over_kernelbench"] = a["candidates_per_min"] / b["candidates_per_min"]
            samples = {h: sorted(r["sample"] for r in rows if r["harness"] == h and r["phase"] == "pass"
                                 and (backend == "all" or r["backend"] == backend)) for h in HARNESSES}  # fmt: skip
            # A rate over different candidate sets compares less well: say so (a subset for KernelBench is common).
            entry["same_candidates"] = samples["kbrl"] == samples["kernelbench"]
        if entry:
            out[backend] = entry
    return out


def spread(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """Speedup spread of one (sample, harness, variant)'s repeated evaluations."""
    speedups = [r.get("speedup_eager") for r in repeats]
    valid = [s for s in speedups if s is not None]
    runtimes = [r.get("runtime_ms") for r in repeats]
    return {
        "n": len(repeats), "speedups": speedups, "speedup_mean": statistics.fmean(valid) if valid else None,
        "speedup_cv": cv(speedups), "runtime_ms": runtimes, "runtime_cv": cv(runtimes),
        "eager_ms": [r.get("eager_ms") for r in repeats], "eager_cv": cv(r.get("eager_ms") for r in repeats),
        "build_cache_hits": [r.get("build_cache_hit") for r in repeats],
        "build_s": [(r.get("stages") or {}).get("build", (r.get("stages") or {}).get("compile")) for r in repeats],
        "wall_s": [r.get("wall_s") for r in repeats],
        "categories": _count(r.get("category", "?") for r in repeats),
    }  # fmt: skip


def _count(items: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts


def _mean_stages(rows: list[dict[str, Any]]) -> dict[str, float]:
    keys = {k for r in rows for k in (r.get("stages") or {})}
    return {k: statistics.fmean((r.get("stages") or {}).get(k, 0.0) for r in rows) for k in sorted(keys)}


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def _stage_text(stages: dict[str, float], order: tuple[str, ...]) -> str:
    keys = [k for k in order if k in stages] + sorted(k for k in stages if k not in order)
    return " ".join(f"{k}={stages[k]:.2f}" for k in keys if stages[k] >= 0.005)


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'harness':<11} {'phase':<13} {'sample':<32} {'backend':<7} {'category':<18} {'speedup':>8} "
             f"{'wall_s':>7}  stages (s)"]  # fmt: skip
    for r in rows:
        order = KBRL_STAGE_ORDER if r["harness"] == "kbrl" else KB_STAGE_ORDER
        lines.append(f"{r['harness']:<11} {r['phase']:<13} {r['sample']:<32} {r['backend']:<7} "
                     f"{r.get('category', '?'):<18} {_fmt(r.get('speedup_eager')):>8} {_fmt(r.get('wall_s')):>7}  "
                     f"{_stage_text(r.get('stages') or {}, order)}")  # fmt: skip
    return "\n".join(lines)


def format_summary(summary: dict[str, Any], spreads: dict[str, Any]) -> str:
    lines = [
        f"{'backend':<8} {'harness':<11} {'n':>4} {'wall_s':>8} {'s/cand':>8} {'cand/min':>9} {'correct':>8}"
    ]
    for backend, entry in summary.items():
        for harness in HARNESSES:
            e = entry.get(harness)
            if e:
                lines.append(f"{backend:<8} {harness:<11} {e['n']:>4} {e['wall_s']:>8.1f} "
                             f"{e['seconds_per_candidate']:>8.2f} {_fmt(e['candidates_per_min'], '.1f'):>9} "
                             f"{e['correct']:>8}")  # fmt: skip
        if "ratio_kbrl_over_kernelbench" in entry:
            caveat = "" if entry.get("same_candidates") else "  (over different candidate sets)"
            lines.append(f"{backend:<8} {'ratio':<11} kbrl/kernelbench candidates per minute = "
                         f"{entry['ratio_kbrl_over_kernelbench']:.2f}x{caveat}")  # fmt: skip
    if spreads:
        lines.append("")
        lines.append(
            f"{'repeated sample':<32} {'harness/variant':<20} {'speedups':<44} {'mean':>6} {'CV%':>6}  builds"
        )
        for sample, by_variant in spreads.items():
            for variant, s in by_variant.items():
                speedups = " ".join(_fmt(x, ".3f") for x in s["speedups"])
                builds = " ".join(_fmt(x, ".1f") for x in s["build_s"])
                hits = s["build_cache_hits"]
                hit_text = f" hits={hits}" if any(h is not None for h in hits) else ""
                cv_pct = None if s["speedup_cv"] is None else 100 * s["speedup_cv"]
                lines.append(f"{sample:<32} {variant:<20} {speedups:<44} {_fmt(s['speedup_mean'], '.3f'):>6} "
                             f"{_fmt(cv_pct, '.2f'):>6}  {builds}{hit_text}")  # fmt: skip
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ candidates


@dataclass
class BenchCandidate:
    sample_id: str
    problem: Any  # kbrl.problems.Problem
    text: str  # what kbrl gets (a completion or bare code)
    code: str  # what KernelBench gets: the extracted code
    backend: str
    origin: str  # builtin | kernelbench | generations


def kernelbench_pairs(root: Path) -> list[tuple[Any, Any]]:
    """(KernelBench problem, builtin problem) of the same level and name, e.g. L1/19_ReLU ↔ builtin L1/5_ReLU."""
    from kbrl.problems import load_kernelbench_dir, load_problems

    builtin = {(p.level, p.name): p for p in load_problems("builtin")}
    return [(kb, builtin[(kb.level, kb.name)]) for kb in load_kernelbench_dir(root)
            if kb.level in (1, 2) and (kb.level, kb.name) in builtin]  # fmt: skip


def gather_candidates(
    kinds: list[str], kernelbench_root: Path | None, generations: Path | None
) -> list[BenchCandidate]:
    from kbrl.evalrun import builtin_candidates, collect_candidates
    from kbrl.kernels.extract import extract_code
    from kbrl.problems import builtin_solutions

    def make(sample_id: str, problem: Any, text: str, origin: str) -> BenchCandidate:
        code = extract_code(text) or text
        return BenchCandidate(sample_id, problem, text, code, backend_of(sample_id, code), origin)

    out: list[BenchCandidate] = []
    if "builtin" in kinds:
        out += [make(c.sample_id, c.problem, c.text, "builtin") for c in builtin_candidates()]
    if "kernelbench" in kinds:
        if kernelbench_root is None:
            raise SystemExit("--candidates kernelbench needs --kernelbench-root or KERNELBENCH_ROOT")
        for kb_problem, builtin_problem in kernelbench_pairs(kernelbench_root):
            for backend, source in sorted(builtin_solutions(builtin_problem).items()):
                out.append(make(f"{kb_problem.id}/{backend}", kb_problem, source, "kernelbench"))
    if generations is not None:
        if kernelbench_root is not None:
            os.environ.setdefault("KERNELBENCH_ROOT", str(kernelbench_root))
        out += [make(c.sample_id, c.problem, c.text, "generations")
                for c in collect_candidates(generations, None, "kernelbench")]  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------ kbrl side


def kbrl_row(c: BenchCandidate, r: Any, phase: str, wall_s: float | None = None) -> dict[str, Any]:
    stages = {k: float(v) for k, v in (r.stage_seconds or {}).items()}
    return {
        "harness": "kbrl", "phase": phase, "sample": c.sample_id, "backend": c.backend, "origin": c.origin,
        "category": str(r.category), "compiled": r.compiled, "correct": r.correct, "n_correct": r.n_correct,
        "speedup_eager": r.speedup_eager, "speedup_compile": r.speedup_compile,
        "runtime_ms": r.runtime.median_ms if r.runtime else None,
        "runtime_mean_ms": r.runtime.mean_ms if r.runtime else None,
        "eager_ms": r.ref_eager.median_ms if r.ref_eager else None,
        "compile_ms": r.ref_compile.median_ms if r.ref_compile else None,
        "timing_method": r.runtime.method if r.runtime else None,
        "speedup_eager_ci": getattr(r, "speedup_eager_ci", None), "timing_trials": r.runtime.n_trials if r.runtime else None,
        "flags": [f.name for f in r.cheat_flags],
        "build_cache_hit": r.build_cache_hit, "stages": stages,
        "wall_s": wall_s if wall_s is not None else stages.get("total"),
        "error": (r.error or "")[-800:],
    }  # fmt: skip


def make_evaluator(args: argparse.Namespace, cache_dir: Path) -> Any:
    from kbrl.kernels.evaluator import EvalConfig, Evaluator

    wanted = {
        "device": args.device, "n_trials": args.correct_trials, "n_timing_trials": args.perf_trials,
        "baseline_compile": "compile" in args.baselines, "timeout_s": args.kbrl_timeout_s,
        "precision": args.precision,
    }  # fmt: skip
    if args.kbrl_timing_method:
        wanted["timing_method"] = args.kbrl_timing_method
    if args.kbrl_tolerance:
        wanted["tolerance"] = args.kbrl_tolerance
    if args.kbrl_warm_pool is not None:
        wanted["warm_pool"] = args.kbrl_warm_pool == "on"
    names = {f.name for f in dataclasses.fields(EvalConfig)}  # the evaluator's settings may change under us
    return Evaluator(EvalConfig(**{k: v for k, v in wanted.items() if k in names}), cache_dir=cache_dir)


def close_evaluator(ev: Any) -> None:
    """Release an evaluator's workers if this version of kbrl has any to release (close / shutdown)."""
    for name in ("close", "shutdown"):
        method = getattr(ev, name, None)
        if callable(method):
            method()
            return
    pool = getattr(ev, "_reference_pool", None)
    if pool is not None:
        pool.shutdown(wait=False)


def close_warm_servers() -> None:
    """Stop kbrl's warm fork servers (kbrl.kernels.warm_pool), in versions of kbrl that have them."""
    try:
        from kbrl.kernels import warm_pool
    except ImportError:
        return
    close_all = getattr(warm_pool, "close_all", None)
    if callable(close_all):
        close_all()


def run_kbrl_pass(
    ev: Any, cands: list[BenchCandidate], jobs: int, phase: str = "pass"
) -> tuple[list[dict[str, Any]], float]:
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for i, r in ev.evaluate_many([(c.problem, c.text) for c in cands], jobs=jobs):
        rows.append(kbrl_row(cands[i], r, phase))
        print(format_rows([rows[-1]]).splitlines()[1], flush=True)
    return rows, time.perf_counter() - started


# ------------------------------------------------------------------------------------------ KernelBench side


@dataclass
class KernelBenchHarness:
    root: Path
    work: Path
    python: str
    timeout_s: float
    correct_trials: int
    perf_trials: int
    baselines: str
    precision: str
    build_dir_mode: str
    static: str
    extra_path: list[str] = field(default_factory=list)
    counter: int = 0

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        paths = [*self.extra_path, str((self.root / "src").resolve())]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        # Cold at the start of the bench run, shared by its processes (as ~/.triton and the inductor cache are).
        env["TRITON_CACHE_DIR"] = str(self.work / "triton")
        env["TORCHINDUCTOR_CACHE_DIR"] = str(self.work / "inductor")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def evaluate(self, c: BenchCandidate, phase: str) -> dict[str, Any]:
        self.counter += 1
        job = self.work / "jobs" / f"{self.counter:04d}"
        job.mkdir(parents=True, exist_ok=True)
        (job / "ref.py").write_text(c.problem.code)
        (job / "kernel.py").write_text(c.code)
        result_path, log_path = job / "result.json", job / "log.txt"
        backend = c.backend if c.backend in ("cuda", "triton") else "cuda"
        cmd = [self.python, str(DRIVER), "--kernelbench-root", str(self.root), "--ref", str(job / "ref.py"),
               "--kernel", str(job / "kernel.py"), "--result", str(result_path), "--backend", backend,
               "--precision", self.precision, "--correct-trials", str(self.correct_trials),
               "--perf-trials", str(self.perf_trials), "--baselines", self.baselines,
               "--build-dir-prefix", str(self.work / "build"), "--build-dir-mode", self.build_dir_mode,
               "--static", self.static]  # fmt: skip
        timed_out = False
        with log_path.open("w") as log:
            spawned = time.time()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env(), cwd=job,
                                    start_new_session=True)  # fmt: skip
            try:
                proc.wait(timeout=self.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            ended = time.time()
        driver: dict[str, Any] = {}
        if result_path.exists():
            try:
                driver = json.loads(result_path.read_text())
            except json.JSONDecodeError:
                driver = {}
        category = "TIMEOUT" if timed_out else driver.get("category", f"CRASH(rc={proc.returncode})")
        log_tail = log_path.read_text(errors="replace")[-1500:]
        row = {
            "harness": "kernelbench", "phase": phase, "sample": c.sample_id, "backend": c.backend,
            "origin": c.origin, "category": category, "compiled": driver.get("compiled"),
            "correct": bool(driver.get("correct")), "speedup_eager": driver.get("speedup_eager"),
            "speedup_compile": driver.get("speedup_compile"), "speedup_internal": driver.get("speedup_internal"),
            "runtime_ms": driver.get("runtime_ms"), "eager_ms": driver.get("ref_eager_ms"),
            "compile_ms": driver.get("ref_compile_ms"), "ref_runtime_ms": driver.get("ref_runtime_ms"),
            "build_dir_existed": driver.get("build_dir_existed"), "static": driver.get("static"),
            "stubbed_modules": driver.get("stubbed_modules"), "kernelbench_module": driver.get("kernelbench_module"),
            "stages": kb_stages(driver, spawned, ended), "wall_s": ended - spawned, "returncode": proc.returncode,
            "error": driver.get("error") or (log_tail if category not in ("CORRECT", "CORRECTNESS_ERROR") else ""),
            "metadata": (driver.get("kernelbench_result") or {}).get("metadata"),
        }  # fmt: skip
        if category == "CORRECT":
            shutil.rmtree(job, ignore_errors=True)
        return row


def run_kb_pass(kb: KernelBenchHarness, cands: list[BenchCandidate], deadline: float | None,
                phase: str = "pass") -> tuple[list[dict[str, Any]], float, list[str]]:  # fmt: skip
    rows, skipped = [], []
    for c in cands:
        if deadline is not None and time.monotonic() > deadline:
            skipped.append(c.sample_id)
            continue
        rows.append(kb.evaluate(c, phase))
        print(format_rows([rows[-1]]).splitlines()[1], flush=True)
    return rows, sum(r["wall_s"] for r in rows), skipped


# ------------------------------------------------------------------------------------------ environment


def environment(args: argparse.Namespace) -> dict[str, Any]:
    import platform

    import torch

    env: dict[str, Any] = {
        "torch": torch.__version__, "python": platform.python_version(), "host": platform.node(),
        "cpus": os.cpu_count(), "cuda_available": torch.cuda.is_available(),
    }  # fmt: skip
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["gpu_capability"] = list(torch.cuda.get_device_capability())
        env["cuda"] = torch.version.cuda
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    env["kbrl_git_sha"] = os.environ.get("KBRL_GIT_SHA") or _git(["rev-parse", "HEAD"], Path(__file__).parent)
    if args.kernelbench_root:
        stamp = args.kernelbench_root / "KERNELBENCH_COMMIT"
        env["kernelbench_commit"] = (stamp.read_text().strip() if stamp.exists()
                                     else _git(["rev-parse", "HEAD"], args.kernelbench_root))  # fmt: skip
    return env


def _git(argv: list[str], cwd: Path) -> str | None:
    try:
        return subprocess.run(["git", *argv], cwd=cwd, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip() or None  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None


# ------------------------------------------------------------------------------------------ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench/results/eval_throughput.json"), help="result JSON")
    p.add_argument("--harness", default="kbrl,kernelbench", help="comma list of: kbrl, kernelbench")
    p.add_argument("--candidates", default="builtin", help="comma list of: builtin, kernelbench")
    p.add_argument(
        "--generations",
        type=Path,
        default=None,
        help="also a KernelBench generations dir (level_{L}_problem_{N}_sample_{S}_kernel.py)",
    )
    p.add_argument(
        "--kernelbench-root",
        type=Path,
        default=Path(os.environ["KERNELBENCH_ROOT"]) if os.environ.get("KERNELBENCH_ROOT") else None,
        help="KernelBench checkout (its src/ and KernelBench/level*/); default $KERNELBENCH_ROOT",
    )
    p.add_argument("--backends", default="triton,cuda", help="which candidate backends to run, in this order")
    p.add_argument("--only", default=None, help="regex on sample ids (e.g. 'builtin/L1/'), both harnesses")
    p.add_argument(
        "--kb-only", default=None, help="regex on sample ids: the subset KernelBench's harness runs"
    )
    p.add_argument("--limit", type=int, default=None, help="at most this many candidates per backend (both)")
    p.add_argument("--kb-limit", type=int, default=None, help="at most this many per backend for KernelBench")
    p.add_argument(
        "--device", default="cuda", help="kbrl's device (cpu for a smoke check: kbrl harness only)"
    )
    p.add_argument(
        "--jobs", type=int, default=8, help="kbrl evaluate_many concurrency (GPU work stays serial)"
    )
    p.add_argument("--repeats", type=int, default=5, help="evaluations of each repeated sample, per harness")
    p.add_argument(
        "--kb-cuda-repeats",
        type=int,
        default=None,
        help="KernelBench repeats of CUDA samples (each rebuilds; default --repeats)",
    )
    p.add_argument(
        "--repeat-samples",
        default="builtin/L1/5/triton,builtin/L1/1/cuda",
        help="comma list of sample ids to repeat ('' for none)",
    )
    p.add_argument(
        "--fresh-repeats",
        type=int,
        default=None,
        help="kbrl fresh-Evaluator repeats (baseline re-timed each time); default --repeats, 0: none",
    )
    p.add_argument("--correct-trials", type=int, default=5)
    p.add_argument("--perf-trials", type=int, default=100)
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    p.add_argument(
        "--baselines",
        default="eager,compile",
        help="reference timings both harnesses take: 'eager,compile' (as both do by default) or 'eager'",
    )
    p.add_argument(
        "--kbrl-timing-method", default=None, help="kbrl EvalConfig.timing_method (default: kbrl's)"
    )
    p.add_argument(
        "--kbrl-tolerance",
        default=None,
        help="kbrl EvalConfig.tolerance preset (default: kbrl's); 'upstream' judges fp32 at 1e-4 as "
        "KernelBench does, so both harnesses time the same correct candidates",
    )
    p.add_argument(
        "--kbrl-warm-pool",
        default=None,
        choices=["on", "off"],
        help="kbrl EvalConfig.warm_pool where this kbrl has it (default: kbrl's)",
    )
    p.add_argument("--kbrl-timeout-s", type=float, default=180.0, help="kbrl per-candidate sandbox timeout")
    p.add_argument(
        "--kb-timeout-s", type=float, default=300.0, help="KernelBench per-candidate process timeout"
    )
    p.add_argument(
        "--kb-build-dir-mode",
        default="run_and_check",
        choices=["run_and_check", "shared"],
        help="run_and_check: build dir named by per-process salted hash() (rebuilds); shared: by content",
    )
    p.add_argument(
        "--kb-static",
        default="record",
        choices=["record", "enforce", "off"],
        help="KernelBench's static checker: record its verdict, enforce it (run_and_check), or skip",
    )
    p.add_argument("--kb-python", default=sys.executable, help="python for KernelBench processes")
    p.add_argument(
        "--kb-path",
        default=os.environ.get("KB_SITE", ""),
        help="extra sys.path entries (os.pathsep-separated) for KernelBench's deps, e.g. unpacked wheels",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="stop starting KernelBench evaluations and repeats after this many seconds (0: none)",
    )
    p.add_argument(
        "--work-dir", type=Path, default=None, help="caches and scratch (default: a fresh temp dir)"
    )
    p.add_argument("--keep-work-dir", action="store_true")
    args = p.parse_args(argv)
    args.harnesses = [h for h in args.harness.split(",") if h]
    unknown = set(args.harnesses) - set(HARNESSES)
    if unknown:
        p.error(f"unknown harness {sorted(unknown)}; choose from {HARNESSES}")
    if "kernelbench" in args.harnesses and args.kernelbench_root is None:
        p.error("the kernelbench harness needs --kernelbench-root or KERNELBENCH_ROOT")
    if "kernelbench" in args.harnesses and not args.device.startswith("cuda"):
        p.error("KernelBench's harness needs a CUDA device: use --harness kbrl with --device cpu")
    return args


def select(
    cands: list[BenchCandidate], backend: str, pattern: str | None, limit: int | None
) -> list[BenchCandidate]:
    chosen = [
        c for c in cands if c.backend == backend and (pattern is None or re.search(pattern, c.sample_id))
    ]
    return chosen[:limit] if limit is not None else chosen


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = time.monotonic()
    deadline = started + args.budget_s if args.budget_s > 0 else None
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kbrl-throughput-"))
    work.mkdir(parents=True, exist_ok=True)
    kinds = [k for k in args.candidates.split(",") if k]
    cands = gather_candidates(kinds, args.kernelbench_root, args.generations)
    backends = [b for b in args.backends.split(",") if b]
    repeat_ids = [s for s in args.repeat_samples.split(",") if s]
    by_id = {c.sample_id: c for c in cands}
    missing = [s for s in repeat_ids if s not in by_id]
    if missing:
        raise SystemExit(f"--repeat-samples not among the candidates: {missing}")

    report: dict[str, Any] = {
        "environment": environment(args),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "work_dir": str(work),
        "notes": [
            "kbrl passes run per backend (triton first); a later backend's pass reuses the references and "
            "baselines its problems got in an earlier pass of the same evaluator.",
            "kernelbench speedups: measure_ref_program_time eager mean / eval_kernel_against_ref runtime mean "
            "(run_and_check.py); KernelBench rounds timing stats to 3 significant digits.",
            "kbrl speedups: eager median / kernel median, timed with kbrl's timing method.",
            "kbrl per-candidate 'total' in a concurrent pass includes waiting for the GPU slot and the "
            "reference; candidates/minute uses the pass wall, not the sum of per-candidate totals.",
            "kernelbench per-candidate wall includes interpreter start, imports and exit; candidates/minute "
            "= n / sum of walls (its single-sample path runs one process at a time).",
            "CV = population stdev / mean.",
        ],
        "rows": [], "pass_walls": {h: {} for h in args.harnesses}, "skipped": {}, "spread": {},
    }  # fmt: skip
    rows: list[dict[str, Any]] = report["rows"]

    def save() -> None:
        report["summary"] = summarize(rows, report["pass_walls"])
        report["elapsed_s"] = time.monotonic() - started
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1, default=str))

    env = report["environment"]
    print(f"device: {env.get('gpu', 'cpu')}  torch {env['torch']}  triton {env['triton']}  candidates: "
          f"{len(cands)}  harnesses: {args.harnesses}  work: {work}", flush=True)  # fmt: skip
    ev = make_evaluator(args, work / "kbrl-cache") if "kbrl" in args.harnesses else None
    kb = None
    if "kernelbench" in args.harnesses:
        kb = KernelBenchHarness(
            root=args.kernelbench_root, work=work / "kernelbench", python=args.kb_python, timeout_s=args.kb_timeout_s,
            correct_trials=args.correct_trials, perf_trials=args.perf_trials, baselines=args.baselines,
            precision=args.precision, build_dir_mode=args.kb_build_dir_mode, static=args.kb_static,
            extra_path=[p for p in args.kb_path.split(os.pathsep) if p],
        )  # fmt: skip
    try:
        for backend in backends:
            mine = select(cands, backend, args.only, args.limit)
            if not mine:
                continue
            repeats = [by_id[s] for s in repeat_ids if by_id[s].backend == backend]
            if ev is not None:
                print(f"--- kbrl pass: {len(mine)} {backend} candidates, jobs={args.jobs}", flush=True)
                new, wall = run_kbrl_pass(ev, mine, args.jobs)
                rows.extend(new)
                report["pass_walls"]["kbrl"][backend] = wall
                save()
                for c in repeats:
                    record_repeats(c, kbrl_repeats(args, c, ev, deadline), rows, report)
                    save()
            if kb is not None:
                subset = select(mine, backend, args.kb_only, args.kb_limit)
                print(
                    f"--- kernelbench pass: {len(subset)} {backend} candidates, one process each", flush=True
                )
                new, wall, skipped = run_kb_pass(kb, subset, deadline)
                rows.extend(new)
                if new:
                    report["pass_walls"]["kernelbench"][backend] = wall
                if skipped:
                    report["skipped"][f"kernelbench/{backend}"] = skipped
                save()
                for c in repeats:
                    record_repeats(c, kb_repeats(args, c, kb, deadline), rows, report)
                    save()
    finally:
        save()
        if ev is not None:
            close_evaluator(ev)
            close_warm_servers()
        if not args.keep_work_dir and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(format_rows(rows))
    print()
    print(format_summary(report["summary"], report["spread"]))
    print(f"\nwrote {args.out}  ({report['elapsed_s']:.0f} s)")
    return report


def kbrl_repeats(
    args: argparse.Namespace, c: BenchCandidate, ev: Any, deadline: float | None
) -> dict[str, list]:
    """kbrl/warm: the same evaluator again (reference, baseline and build cached; never cut by --budget-s).
    kbrl/fresh: a new Evaluator each time with baselines.json deleted, so the baseline is re-timed too."""
    variants: dict[str, list[dict[str, Any]]] = {"kbrl/warm": []}
    print(f"--- repeats of {c.sample_id}: kbrl, same evaluator", flush=True)
    for _ in range(args.repeats):
        t = time.perf_counter()
        r = ev.evaluate(c.problem, c.text)
        variants["kbrl/warm"].append(kbrl_row(c, r, "repeat/warm", time.perf_counter() - t))
    n_fresh = args.repeats if args.fresh_repeats is None else args.fresh_repeats
    if n_fresh > 0:
        print(f"--- repeats of {c.sample_id}: kbrl, fresh evaluator, baselines re-timed", flush=True)
        variants["kbrl/fresh"] = []
        for _ in range(n_fresh):
            if deadline is not None and time.monotonic() > deadline:
                break
            (ev.cache_dir / "baselines.json").unlink(missing_ok=True)
            t = time.perf_counter()
            fresh = make_evaluator(args, ev.cache_dir)
            try:
                r = fresh.evaluate(c.problem, c.text)
            finally:
                close_evaluator(fresh)
            variants["kbrl/fresh"].append(kbrl_row(c, r, "repeat/fresh", time.perf_counter() - t))
    return variants


def kb_repeats(
    args: argparse.Namespace, c: BenchCandidate, kb: KernelBenchHarness, deadline: float | None
) -> dict[str, list]:
    """KernelBench: fresh processes, everything redone (a CUDA kernel rebuilt in run_and_check build-dir mode)."""
    n = args.kb_cuda_repeats if c.backend == "cuda" and args.kb_cuda_repeats is not None else args.repeats
    print(f"--- repeats of {c.sample_id}: kernelbench, {n} fresh processes", flush=True)
    reps = []
    for _ in range(n):
        if deadline is not None and time.monotonic() > deadline:
            break
        reps.append(kb.evaluate(c, "repeat"))
    return {"kernelbench": reps}


def record_repeats(
    c: BenchCandidate, variants: dict[str, list], rows: list[dict[str, Any]], report: dict[str, Any]
) -> None:
    for reps in variants.values():
        rows.extend(reps)
        for r in reps:
            print(format_rows([r]).splitlines()[1], flush=True)
    by_variant = report["spread"].setdefault(c.sample_id, {})
    by_variant.update({v: spread(reps) for v, reps in variants.items() if reps})


if __name__ == "__main__":
    main()

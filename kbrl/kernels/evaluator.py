"""The evaluator: extract → static checks → sandboxed compile/run → judged in this process → timed.

The judge never runs inside the candidate's process. Reference outputs are computed in a separate
(trusted) child and kept in this process's memory; the candidate's child only receives seeds, regenerates
the inputs, and hands back its outputs, which are compared here. A candidate can therefore not patch the
comparison, read the reference outputs, or find them in freed memory.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import kbrl
from kbrl import settings
from kbrl.kernels.extract import extract_code
from kbrl.kernels.feedback import clean_error, is_out_of_memory, render_feedback
from kbrl.kernels.gpu_slots import GpuSlots
from kbrl.kernels.result import Category, CheatFlag, EvalResult, TimingStats
from kbrl.kernels.sandbox import SandboxExit, SandboxLimits, SandboxProcess, launch, scrubbed_env
from kbrl.kernels.static_checks import check_static
from kbrl.kernels.warm_pool import ForkServer, ForkServerError, fork_server
from kbrl.problems.model import Problem

# KernelBench tolerance presets: v0/v0.1 used 1e-2 everywhere; upstream now uses 1e-4 for fp32.
TOLERANCES: dict[str, dict[str, float]] = {
    "v0.1": {"fp32": 1e-2, "fp16": 1e-2, "bf16": 1e-2},
    "upstream": {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2},
}

# Aten ops that move, allocate or reshape data: never "the problem's work" when a candidate runs them.
NON_COMPUTE_OPS = frozenset(
    """empty empty_like empty_strided new_empty new_empty_strided zeros zeros_like new_zeros ones ones_like
    new_ones full full_like new_full fill_ zero_ view _unsafe_view reshape _reshape_alias as_strided expand
    expand_as permute t transpose transpose_ contiguous clone copy_ _to_copy to detach detach_ alias select
    slice unsqueeze squeeze split split_with_sizes chunk narrow lift_fresh resize_ set_ item
    _local_scalar_dense is_same_size unbind view_as unfold stride size numel dim flatten unflatten
    movedim arange randn rand randint normal_ uniform_ _has_compatible_shallow_copy_type
    """.split()
)


class EvaluatorError(RuntimeError):
    """The evaluator itself could not run (bad problem, broken reference): not the candidate's fault."""


@dataclass
class EvalConfig:
    """Evaluation settings; defaults follow KernelBench (5 correctness trials, seed 42, 100 timed runs)."""

    n_trials: int = 5
    seed: int = 42
    tolerance: str = "v0.1"
    precision: str = "fp32"
    measure_performance: bool = True
    n_timing_trials: int = 100
    n_warmup: int = 3
    # "graph": time a CUDA-graph replay of forward (GPU time, no Python launch overhead; falls back to
    # "events" per candidate when capture fails). "events": call forward directly, as KernelBench does.
    timing_method: str = "graph"
    flush_l2: bool = True
    # Paired timing: the candidate's process also times the reference, interleaved A/B/B/A, until the
    # trimmed-mean speedup's ~95 % interval is within ±timing_target_ci (min/max pairs, a time budget).
    # Off: the candidate alone, n_timing_trials calls, against the cached baseline (KernelBench's way).
    paired_timing: bool = True
    min_timing_pairs: int = 40
    max_timing_pairs: int = 2000
    timing_target_ci: float = 0.005
    timing_budget_s: float = 3.0
    # The in-process reference time must agree with the trusted baseline (timed in its own process)
    # within this fraction, or the speedup falls back to the baseline (a candidate could slow the
    # reference down in its own process); this bounds what tampering with it could gain.
    reference_drift_tolerance: float = 0.15
    baseline_compile: bool = True
    timeout_s: float = 180.0
    reference_timeout_s: float = 900.0
    memory_mb: int = 16_384
    gpu_memory_fraction: float | None = None
    # Candidates that may run correctness trials on the GPU at once (timing always has it alone);
    # 1 serializes everything. More overlap, more memory: each holds its inputs and outputs.
    gpu_shared_slots: int = 4
    device: str = "auto"
    static_checks: bool = True
    isolate: bool = True
    # Fork each candidate's process from a warm server that has imported torch and Triton once
    # (kbrl.kernels.warm_pool); off: a fresh interpreter per candidate (seconds of start-up each).
    warm_pool: bool = True
    keep_workdir: bool = False

    def __post_init__(self) -> None:
        if self.tolerance not in TOLERANCES:
            raise ValueError(f"unknown tolerance preset {self.tolerance!r}; choose one of {sorted(TOLERANCES)}")
        if self.precision not in TOLERANCES[self.tolerance]:
            raise ValueError(f"unknown precision {self.precision!r}; choose fp32, fp16 or bf16")
        if self.timing_method not in ("graph", "events"):
            raise ValueError(f"unknown timing_method {self.timing_method!r}; choose graph or events")
        if self.n_trials < 1:
            raise ValueError("n_trials must be at least 1")

    @property
    def atol_rtol(self) -> float:
        return TOLERANCES[self.tolerance][self.precision]


@dataclass
class _Reference:
    outputs: list[list[Any]]
    refill: list[Any]
    aten_ops: set[str]
    eager: dict[str, TimingStats] = field(default_factory=dict)  # by timing method
    compile: dict[str, TimingStats] = field(default_factory=dict)
    gpu: str = ""
    torch_version: str = ""
    seconds: float = 0.0
    baseline_note: str = ""


@dataclass
class _Judgement:
    n_correct: int = 0
    max_abs_err: float | None = None
    failure: str = ""
    refill_ok: bool = True
    flags: list[CheatFlag] = field(default_factory=list)


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _kbrl_root() -> str:
    """Directory holding the `kbrl` package, so the sandbox child can import the runner."""
    return str(Path(kbrl.__file__).resolve().parent.parent)


def compare_outputs(ref: list[Any], cand: list[Any], tol: float) -> tuple[bool, float | None, str]:
    """KernelBench correctness for one trial: same count, shape and dtype; finite; allclose(atol=rtol=tol)."""
    import torch

    if len(ref) != len(cand):
        return False, None, f"expected {len(ref)} output tensor(s), got {len(cand)}"
    worst: float | None = None
    for i, (r, c) in enumerate(zip(ref, cand)):
        if not isinstance(c, torch.Tensor):
            return False, None, f"output {i} is {type(c).__name__}, expected a tensor"
        if tuple(r.shape) != tuple(c.shape):
            return False, None, f"output {i} shape mismatch: expected {tuple(r.shape)}, got {tuple(c.shape)}"
        if r.dtype != c.dtype:
            return False, None, f"output {i} dtype mismatch: expected {r.dtype}, got {c.dtype}"
        if c.is_floating_point() and not bool(torch.isfinite(c).all()):
            n_bad = int((~torch.isfinite(c)).sum())
            return False, None, f"output {i} has {n_bad} NaN/Inf value(s)"
        if c.numel():
            diff = (r.double() - c.double()).abs()
            err = float(diff.max())
            worst = err if worst is None else max(worst, err)
            if not torch.allclose(c, r, atol=tol, rtol=tol):
                n_bad = int((diff > tol + tol * r.double().abs()).sum())
                return False, worst, f"output {i}: {n_bad}/{c.numel()} values differ (max abs error {err:.3g})"
    return True, worst, ""


class Evaluator:
    """Evaluates candidates for problems; thread-safe, so `evaluate_many` can overlap independent work."""

    def __init__(self, config: EvalConfig | None = None, cache_dir: Path | None = None) -> None:
        self.config = config or EvalConfig()
        self.device = resolve_device(self.config.device)
        self.cache_dir = Path(cache_dir) if cache_dir else settings.cache_dir()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._references: OrderedDict[str, _Reference] = OrderedDict()
        self._reference_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._gpu = GpuSlots(self.config.gpu_shared_slots)
        self._reference_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kbrl-reference")
        self._warned_cold = False
        if self.config.warm_pool:  # start importing now, so the first candidate does not wait for it
            try:
                self.warm_server()
            except OSError:
                pass  # `_spawn` falls back to cold processes

    @contextmanager
    def _device_slot(self, proc: SandboxProcess, exclusive: bool) -> Iterator[None]:
        """Hold the GPU for one process: shared for correctness trials, exclusive for timing (see
        `GpuSlots`); compilation elsewhere goes on meanwhile. The time spent queueing is given back to
        the child's deadline. CPU runs need no slot."""
        if not self.device.startswith("cuda"):
            yield
            return
        queued = time.monotonic()
        with self._gpu.exclusive() if exclusive else self._gpu.shared():
            proc.extend_deadline(time.monotonic() - queued)
            yield

    # ---------------------------------------------------------------- public API

    def evaluate(self, problem: Problem, text: str) -> EvalResult:
        """Evaluate one LLM completion (or bare code) for `problem`; never raises for a bad candidate."""
        started = time.perf_counter()
        result = EvalResult(problem_id=problem.id, category=Category.FORMAT_ERROR, device=self.device)
        result.tolerance = {"preset": self.config.tolerance, "atol": self.config.atol_rtol,
                            "rtol": self.config.atol_rtol, "precision": self.config.precision}  # fmt: skip
        code = extract_code(text)
        if code is None:
            result.error = "no Python code block defining `class ModelNew` was found in the response"
            return self._finish(result, started)
        import hashlib

        result.source_hash = hashlib.sha256(code.encode()).hexdigest()[:16]
        t0 = time.perf_counter()
        report = check_static(code, problem.code, self.config.precision)
        result.stage_seconds["static"] = time.perf_counter() - t0
        result.format_ok, result.backend = report.format_ok, report.backend
        if not report.format_ok:
            result.error = "\n".join(report.format_errors)
            return self._finish(result, started)
        if self.config.static_checks:  # off only to test what the sandbox and dynamic checks catch alone
            result.cheat_flags.extend(report.flags)
            if report.cheat:
                result.category = Category.CHEAT
                return self._finish(result, started)
        # The reference (cached per problem) is computed while the candidate compiles.
        reference = self._reference_pool.submit(self.reference, problem)
        self._run_candidate(problem, code, reference, result)
        return self._finish(result, started)

    def prebuild(self, problem: Problem, text: str) -> dict[str, Any]:
        """Build a CUDA candidate into the shared content-hash cache, without running it.

        Run by CPU-queue workers ahead of the GPU worker that will evaluate the same candidate: the GPU
        stage then finds the extension built (the cache's per-key lock makes a concurrent build of the same
        hash wait instead of compiling twice). Triton kernels compile at first launch, so there is
        nothing to do for them; neither is there for code that would not pass the static checks.
        """
        code = extract_code(text)
        if code is None or "load_inline" not in code:
            return {"built": False, "reason": "no load_inline build in this candidate"}
        workdir = Path(tempfile.mkdtemp(prefix="kbrl-build-"))
        try:
            (workdir / "problem.py").write_text(problem.code)
            (workdir / "candidate.py").write_text(code)
            job = self._job("candidate", workdir, problem_path=str(workdir / "problem.py"),
                            candidate_path=str(workdir / "candidate.py"), build_only=True)  # fmt: skip
            limits = SandboxLimits(self.config.timeout_s, self.config.memory_mb, isolate=self.config.isolate)
            with self._spawn(workdir, job, limits) as proc:
                report = proc.receive("phase1")
                end = proc.wait()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if report is None:
            return {"built": False, "reason": _describe_exit(end), "seconds": end.wall_s}
        build = report.get("build", {})
        return {"built": bool(report.get("compiled")) and not build.get("compile_only"),
                "cache_hit": build.get("build_cache_hit"), "build_s": build.get("build_s"),
                "error": (report.get("error") or {}).get("message"), "seconds": end.wall_s}  # fmt: skip

    def evaluate_many(
        self, items: Iterable[tuple[Problem, str]], jobs: int = 1
    ) -> Iterator[tuple[int, EvalResult]]:
        """Evaluate (problem, text) pairs, `jobs` at a time; yields (index, result) as each finishes."""
        items = list(items)
        if jobs <= 1:
            for i, (problem, text) in enumerate(items):
                yield i, self.evaluate(problem, text)
            return
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(self.evaluate, p, t): i for i, (p, t) in enumerate(items)}
            from concurrent.futures import as_completed

            for fut in as_completed(futures):
                yield futures[fut], fut.result()

    # ---------------------------------------------------------------- reference

    def reference(self, problem: Problem) -> _Reference:
        """Reference outputs (and baselines) for `problem`, computed once per evaluator in a child process."""
        cfg = self.config
        key = f"{problem.code_hash}|{self.device}|{cfg.precision}|{cfg.seed}|{cfg.n_trials}"
        with self._lock:
            if key in self._references:
                self._references.move_to_end(key)
                return self._references[key]
            lock = self._reference_locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                if key in self._references:
                    return self._references[key]
            reference = self._compute_reference(problem)
            with self._lock:
                self._references[key] = reference
                while len(self._references) > 64:
                    self._references.popitem(last=False)
            return reference

    def _compute_reference(self, problem: Problem) -> _Reference:
        import torch

        cfg = self.config
        started = time.perf_counter()
        timing = self.device.startswith("cuda") and cfg.measure_performance
        baselines = self._load_baselines()
        workdir = Path(tempfile.mkdtemp(prefix="kbrl-ref-"))
        try:
            (workdir / "problem.py").write_text(problem.code)
            job = self._job("reference", workdir, problem_path=str(workdir / "problem.py"),
                            output_path=str(workdir / "reference.pt"))  # fmt: skip
            cached = baselines.get(self._baseline_key(problem, self._gpu_name())) if timing else None
            if timing and cached is None:
                job["timing"] = {"n_warmup": cfg.n_warmup, "n_trials": cfg.n_timing_trials,
                                 "flush_l2": cfg.flush_l2, "compile": cfg.baseline_compile}  # fmt: skip
            limits = SandboxLimits(cfg.reference_timeout_s, max(cfg.memory_mb, 32_768), isolate=cfg.isolate)
            msg = None
            with self._spawn(workdir, job, limits) as proc:
                if proc.receive("ready") is not None:
                    with self._device_slot(proc, exclusive="timing" in job):
                        proc.send({"cmd": "go"})
                        msg = proc.receive("reference")
                end = proc.wait()
            if msg is None:
                raise EvaluatorError(
                    f"reference for {problem.id} failed ({_describe_exit(end)}):\n"
                    + clean_error(end.stderr_tail)
                )
            data = torch.load(workdir / "reference.pt", weights_only=True)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        ref = _Reference(outputs=data["outputs"], refill=data["refill"], aten_ops=set(msg["aten_ops"]),
                         gpu=msg.get("gpu", ""), torch_version=msg.get("torch", ""))  # fmt: skip
        if timing:
            if cached is None:
                cached = {"eager": msg.get("eager"), "compile": msg.get("compile"),
                          "compile_error": msg.get("compile_error", "")}  # fmt: skip
                self._save_baseline(self._baseline_key(problem, ref.gpu), cached)
            ref.eager = {m: TimingStats(**t) for m, t in (cached.get("eager") or {}).items()}
            ref.compile = {m: TimingStats(**t) for m, t in (cached.get("compile") or {}).items()}
            ref.baseline_note = cached.get("compile_error", "")
        ref.seconds = time.perf_counter() - started
        return ref

    # Baseline timings: persisted per (problem, GPU, torch version, precision, trials), shared by workers.

    def _gpu_name(self) -> str:
        import torch

        return torch.cuda.get_device_name() if self.device.startswith("cuda") else ""

    def _baseline_key(self, problem: Problem, gpu: str) -> str:
        import torch

        cfg = self.config
        return f"v2|{problem.code_hash}|{gpu}|{torch.__version__}|{cfg.precision}|{cfg.n_timing_trials}|{cfg.flush_l2}"

    @property
    def _baselines_path(self) -> Path:
        return self.cache_dir / "baselines.json"

    def _load_baselines(self) -> dict[str, Any]:
        try:
            return json.loads(self._baselines_path.read_text())
        except (OSError, ValueError):
            return {}

    def _save_baseline(self, key: str, value: dict[str, Any]) -> None:
        lock_path = self.cache_dir / "baselines.lock"
        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._load_baselines()
            data[key] = value
            tmp = self._baselines_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            tmp.replace(self._baselines_path)

    # ---------------------------------------------------------------- candidate

    def _job(self, mode: str, workdir: Path, **extra: Any) -> dict[str, Any]:
        cfg = self.config
        return {
            "mode": mode,
            "device": self.device,
            "precision": cfg.precision,
            "seed": cfg.seed,
            "n_trials": cfg.n_trials,
            "build_cache": str(self.cache_dir / "torch_extensions"),
            **extra,
        }

    def _sandbox_env(self) -> tuple[dict[str, str], dict[str, str]]:
        """(what an interpreter fixes at import, what each job sets) for the sandboxed runner."""
        fixed = {"PYTHONPATH": _kbrl_root()}
        if not self.device.startswith("cuda"):
            fixed["TRITON_INTERPRET"] = "1"
            fixed["CUDA_VISIBLE_DEVICES"] = ""
        per_job = {"TRITON_CACHE_DIR": str(self.cache_dir / "triton"),
                   "TORCHINDUCTOR_CACHE_DIR": str(self.cache_dir / "inductor")}  # fmt: skip
        return scrubbed_env(fixed), per_job

    def warm_server(self) -> ForkServer | None:
        """The warm fork server this evaluator's candidates come from (None with `warm_pool` off)."""
        if not self.config.warm_pool:
            return None
        return fork_server(self._sandbox_env()[0], self.config.isolate, self.cache_dir / "forkserver")

    def _spawn(self, workdir: Path, job: dict[str, Any], limits: SandboxLimits) -> SandboxProcess:
        """A sandboxed runner process for `job`: forked from the warm server, or (if that is off or
        broken) a fresh interpreter. Either way one process serves exactly one job."""
        (workdir / "job.json").write_text(json.dumps(job))
        fixed, per_job = self._sandbox_env()
        cpu_memory_limit = not self.device.startswith("cuda")
        try:
            server = self.warm_server()
            if server is not None:
                return server.spawn(workdir, workdir / "job.json", per_job, limits, cpu_memory_limit)
        except ForkServerError as exc:
            if not self._warned_cold:
                self._warned_cold = True
                print(f"kbrl: warm sandbox pool unavailable, starting candidates cold: {exc}", file=sys.stderr)
        env = scrubbed_env({**fixed, **per_job}, workdir)
        argv = [sys.executable, "-m", "kbrl.kernels.runner", str(workdir / "job.json")]
        return launch(argv, workdir, env, limits, cpu_memory_limit=cpu_memory_limit)

    def _run_candidate(self, problem: Problem, code: str, reference: Future[_Reference], result: EvalResult) -> None:
        import torch

        cfg = self.config
        result.n_trials = cfg.n_trials
        workdir = Path(tempfile.mkdtemp(prefix="kbrl-cand-"))
        try:
            (workdir / "problem.py").write_text(problem.code)
            (workdir / "candidate.py").write_text(code)
            job = self._job(
                "candidate", workdir,
                problem_path=str(workdir / "problem.py"), candidate_path=str(workdir / "candidate.py"),
                outputs_path=str(workdir / "outputs.pt"), gpu_memory_fraction=cfg.gpu_memory_fraction,
                timing={"n_warmup": cfg.n_warmup, "n_trials": cfg.n_timing_trials, "flush_l2": cfg.flush_l2,
                        "method": cfg.timing_method, "paired": cfg.paired_timing, "min_pairs": cfg.min_timing_pairs,
                        "max_pairs": cfg.max_timing_pairs, "target_rel_ci": cfg.timing_target_ci,
                        "budget_s": cfg.timing_budget_s},
            )  # fmt: skip
            limits = SandboxLimits(cfg.timeout_s, cfg.memory_mb, isolate=cfg.isolate)
            phase1 = timing_msg = judged = ref = None
            spawn_started = time.perf_counter()
            sandbox = self._spawn(workdir, job, limits)
            result.stage_seconds["spawn"] = time.perf_counter() - spawn_started
            with sandbox as proc:
                if proc.receive("ready") is None:  # failed to build or load: its report (if any) is queued
                    phase1 = proc.receive("phase1")
                else:
                    queued = time.monotonic()
                    ref = reference.result()  # before taking the GPU: the reference needs it too
                    result.stage_seconds["reference_wait"] = time.monotonic() - queued
                    proc.extend_deadline(time.monotonic() - queued)
                    with self._device_slot(proc, exclusive=False):
                        proc.send({"cmd": "go"})
                        phase1 = proc.receive("phase1")
                    if phase1 is not None and not phase1.get("error"):
                        cand = torch.load(workdir / "outputs.pt", weights_only=True)
                        judged = self._judge(ref, phase1, cand)
                        wants_timing = (
                            self.device.startswith("cuda") and cfg.measure_performance
                            and judged.n_correct == cfg.n_trials and judged.refill_ok
                            and not any(f.severity == "error" for f in judged.flags)
                        )  # fmt: skip
                        if wants_timing:
                            with self._device_slot(proc, exclusive=True):
                                proc.send({"cmd": "time"})
                                timing_msg = proc.receive("timing")
                        else:
                            proc.send({"cmd": "exit"})
                end = proc.wait()
        finally:
            if not cfg.keep_workdir:
                shutil.rmtree(workdir, ignore_errors=True)
        result.stdout_tail, result.stderr_tail = end.stdout_tail[-2000:], end.stderr_tail[-4000:]
        result.stage_seconds["sandbox_wall"] = end.wall_s
        if phase1 is not None:
            result.stage_seconds.update(phase1.get("stage_seconds", {}))
            build = phase1.get("build", {})
            if "build_s" in build:
                result.stage_seconds["build"] = build["build_s"]
            result.build_cache_hit = build.get("build_cache_hit")
        self._classify(result, ref, phase1, judged, timing_msg, end)

    def _judge(self, ref: _Reference, phase1: dict[str, Any], cand: dict[str, Any]) -> _Judgement:
        """Compare outputs and turn the child's observations into dynamic cheat flags."""
        tol = self.config.atol_rtol
        j = _Judgement()
        for ref_out, cand_out in zip(ref.outputs, cand["outputs"]):
            ok, err, why = compare_outputs(ref_out, cand_out, tol)
            if err is not None:
                j.max_abs_err = err if j.max_abs_err is None else max(j.max_abs_err, err)
            if ok:
                j.n_correct += 1
            elif not j.failure:
                j.failure = why
        j.refill_ok, _, refill_why = compare_outputs(ref.refill, cand["refill"], tol)
        launches = phase1.get("launches", [])
        if launches and not any(launches):
            j.flags.append(CheatFlag("no_custom_kernel_launched",
                                     "forward() ran without launching any Triton kernel or calling the "
                                     "compiled CUDA extension"))  # fmt: skip
        if phase1.get("inputs_mutated"):
            j.flags.append(CheatFlag("mutates_inputs", "forward() modified its input tensors in place"))
        if j.n_correct == len(ref.outputs) and not j.refill_ok:
            j.flags.append(CheatFlag("output_caching",
                                     "correct on fresh inputs but wrong when the same input tensors were refilled "
                                     f"with new values (stale outputs reused): {refill_why}"))  # fmt: skip
        ref_compute = ref.aten_ops - NON_COMPUTE_OPS
        cand_ops = set(phase1.get("aten_ops", [])) - NON_COMPUTE_OPS
        done_by_torch = sorted(ref_compute & cand_ops)
        if ref_compute and set(done_by_torch) == ref_compute:
            j.flags.append(CheatFlag("torch_does_the_work",
                                     f"forward() executed the reference's PyTorch ops {done_by_torch} itself"))
        elif done_by_torch:
            j.flags.append(CheatFlag("partial_torch_ops",
                                     f"PyTorch still performs {done_by_torch}; only the rest is custom", "warning"))
        return j

    def _classify(
        self,
        result: EvalResult,
        ref: _Reference | None,
        phase1: dict[str, Any] | None,
        judged: _Judgement | None,
        timing_msg: dict[str, Any] | None,
        end: SandboxExit,
    ) -> None:
        if phase1 is None:
            result.compiled = any(m.get("stage") == "compiled" for m in end.messages)
            result.category, result.error = _classify_exit(end)
            return
        result.compiled = bool(phase1.get("compiled"))
        error = phase1.get("error")
        if error:
            compile_stage = error["stage"] in ("compile", "import")
            result.category = Category.COMPILATION_ERROR if compile_stage else Category.RUNTIME_ERROR
            text = error["message"] if error["stage"] == "compile" else error["traceback"]
            result.error = clean_error(text, compiler=error["stage"] == "compile")
            if is_out_of_memory(f"{error['exc_type']}: {error['message']}"):
                result.error = "out of memory: " + result.error
            return
        if phase1.get("compile_only"):
            result.category = Category.UNVERIFIED
            result.timing_note = "no GPU on this host: CUDA source compile-checked only"
            return
        assert judged is not None and ref is not None
        result.n_correct, result.max_abs_err = judged.n_correct, judged.max_abs_err
        result.cheat_flags.extend(judged.flags)
        if any(f.severity == "error" for f in judged.flags):
            result.category = Category.CHEAT
            return
        if judged.n_correct < result.n_trials:
            result.category = Category.CORRECTNESS_ERROR
            result.error = judged.failure
            return
        result.correct = True
        result.category = Category.CORRECT
        if not self.device.startswith("cuda"):
            result.timing_note = "no GPU: timing unavailable (Triton ran in the CPU interpreter)"
        elif not self.config.measure_performance:
            result.timing_note = "timing disabled (measure_performance=false)"
        elif timing_msg is None:
            result.category, result.error = _classify_exit(end)
            result.error = "while timing: " + result.error
        elif timing_msg.get("error"):
            result.category = Category.RUNTIME_ERROR
            result.error = "while timing: " + clean_error(timing_msg["error"]["traceback"])
        else:
            result.timing_available = True
            result.runtime = TimingStats(**timing_msg["stats"])
            result.stage_seconds["timing"] = timing_msg.get("seconds", 0.0)
            method = result.runtime.method  # compare like with like: baselines were timed both ways
            result.ref_eager, result.ref_compile = ref.eager.get(method), ref.compile.get(method)
            notes = [ref.baseline_note] if ref.baseline_note else []
            if timing_msg.get("paired"):
                self._paired_speedup(result, timing_msg["paired"])
            elif result.ref_eager:
                result.speedup_eager = result.ref_eager.median_ms / result.runtime.median_ms
            if result.ref_compile:
                result.speedup_compile = result.ref_compile.median_ms / result.runtime.median_ms
            if method != self.config.timing_method:
                notes.append("forward could not be captured in a CUDA graph: timed call by call (events)")
            result.timing_note = "; ".join(notes)

    def _paired_speedup(self, result: EvalResult, paired: dict[str, Any]) -> None:
        """Speedup from the interleaved in-process timing, if its reference agrees with the trusted baseline."""
        in_process = TimingStats(**paired["reference"])
        trusted = result.ref_eager
        drift = in_process.median_ms / trusted.median_ms - 1 if trusted else 0.0
        if trusted and abs(drift) > self.config.reference_drift_tolerance:
            result.cheat_flags.append(CheatFlag(
                "reference_timing_mismatch",
                f"the reference ran {drift:+.0%} off its trusted baseline inside the candidate's process; "
                "the speedup uses the baseline instead", "warning"))  # fmt: skip
            result.speedup_eager = trusted.median_ms / result.runtime.median_ms  # type: ignore[union-attr]
            return
        result.ref_eager = in_process
        result.speedup_eager = float(paired["speedup"])
        result.speedup_eager_ci = [float(x) for x in paired["interval"]]

    def _finish(self, result: EvalResult, started: float) -> EvalResult:
        result.stage_seconds["total"] = time.perf_counter() - started
        result.feedback = render_feedback(result)
        return result


def _describe_exit(end: SandboxExit) -> str:
    if end.timed_out:
        return f"timed out after {end.wall_s:.0f} s"
    if end.memory_exceeded:
        return f"killed for exceeding the memory limit (peak {end.peak_rss_mb:.0f} MB)"
    if end.signal_name:
        return f"crashed with {end.signal_name}"
    return f"exited with code {end.returncode} before reporting"


def _classify_exit(end: SandboxExit) -> tuple[Category, str]:
    """The child ended without a report: timeout, memory kill, crash or early exit."""
    detail = clean_error(end.stderr_tail)
    if end.timed_out:
        return Category.TIMEOUT, f"evaluation {_describe_exit(end)}"
    if end.memory_exceeded:
        return Category.RUNTIME_ERROR, f"out of memory: {_describe_exit(end)}"
    message = f"the candidate process {_describe_exit(end)}"
    return Category.RUNTIME_ERROR, message + (f"\n{detail}" if detail else "")


def result_summary(results: list[EvalResult]) -> dict[str, Any]:
    """KernelBench-style aggregate: compile/correct/fast_p rates and speedup means over correct kernels."""
    import math

    n = len(results)
    speedups = [r.speedup_eager for r in results if r.correct and r.speedup_eager]
    categories: dict[str, int] = {}
    for r in results:
        categories[str(r.category)] = categories.get(str(r.category), 0) + 1

    def fast(p: float) -> float | None:
        if not any(r.timing_available for r in results):
            return None
        return sum(1 for r in results if r.correct and (r.speedup_eager or 0) > p) / n if n else 0.0

    return {
        "n": n,
        "categories": categories,
        "compile_rate": sum(r.compiled for r in results) / n if n else 0.0,
        "correct_rate": sum(r.correct for r in results) / n if n else 0.0,
        "fast_1": fast(1.0),
        "fast_1.5": fast(1.5),
        "fast_2": fast(2.0),
        "mean_speedup": sum(speedups) / len(speedups) if speedups else None,
        "geomean_speedup": math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None,
    }


def config_dict(config: EvalConfig) -> dict[str, Any]:
    return asdict(config)

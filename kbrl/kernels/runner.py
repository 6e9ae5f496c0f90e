"""Child-side harness: the only code that ever imports a candidate, always inside a sandbox process.

Two modes, one job file each (`python -m kbrl.kernels.runner job.json`):

- `reference`: runs the trusted problem `Model` on seeded inputs and saves its outputs (plus the aten
  ops it executed and, on a GPU, eager / torch.compile baselines) to a file the parent reads and deletes.
- `candidate`: imports the candidate (CUDA builds go through a content-hash cache), runs `ModelNew` on
  the same seeded inputs, and reports its outputs for the parent to judge. It never sees reference
  outputs: the judgement happens in the parent, outside the process the candidate could tamper with.
  After the verdict, the parent may ask it to time itself (`{"cmd": "time"}` on stdin).

Hooks installed before the candidate is imported record what really happened in `forward`: how many
custom kernels were launched (Triton launches and calls into `load_inline` modules), which aten ops
ran (a dispatch mode over the first trial), and whether the inputs were mutated.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from kbrl.kernels.build_cache import BuildCache, CompileError, build_key
from kbrl.kernels.sandbox import send_to_parent

L2_FLUSH_BYTES = 256 * 1024 * 1024
POISON_BYTES_MAX = 1 << 30
PREROLL_CYCLES = 200_000  # ~0.1 ms of GPU spin at boost clock


class _Launches:
    """Custom-kernel launch counter shared by the Triton and load_inline hooks."""

    count = 0


def _dtype(precision: str) -> Any:
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def trial_seeds(seed: int, n: int) -> list[int]:
    """Per-trial seeds drawn from the base seed, as KernelBench does (one extra for the refill trial)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [int(torch.randint(0, 2**32 - 1, (1,), generator=gen).item()) for _ in range(n)]


def load_module(path: Path, name: str) -> ModuleType:
    """Import a file as a module (Triton's JIT needs real source files, so candidates live on disk)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def make_inputs(problem: ModuleType, seed: int, device: str, precision: str) -> list[Any]:
    """Seeded inputs created where they are used: `get_inputs()` runs under `torch.device(device)`, so
    its factory calls (randn, rand, …) allocate and fill on the GPU instead of filling gigabytes on the
    CPU and copying them over. Reference and candidate call this with the same seed on the same device,
    so they see identical values. Unlike KernelBench (CPU generator, then `.cuda()`), the values on a GPU
    come from the CUDA generator: same distributions, different numbers for a given seed. A
    `get_inputs()` that cannot run that way (e.g. it goes through NumPy) is run on the CPU as KernelBench
    does. Floating tensors are cast to `precision`."""
    import torch

    dtype = _dtype(precision)
    torch.manual_seed(seed)  # seeds the CPU and every CUDA generator
    try:
        with torch.device(device):
            values = list(problem.get_inputs())
    except Exception:
        if device == "cpu":
            raise
        torch.manual_seed(seed)
        values = list(problem.get_inputs())
    out = []
    for value in values:
        if isinstance(value, torch.Tensor):
            value = value.to(device)
            if value.is_floating_point():
                value = value.to(dtype)
        out.append(value)
    return out


def make_model(cls: type, problem: ModuleType, seed: int, device: str, precision: str) -> Any:
    """Construct with the base seed so `Model` and `ModelNew` get identical random weights."""
    import torch

    init_inputs = problem.get_init_inputs()
    torch.manual_seed(seed)
    model = cls(*init_inputs)
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
        if precision != "fp32":
            model = model.to(_dtype(precision))
        model.eval()
    return model


def as_tensor_list(output: Any) -> list[Any]:
    """Forward may return a tensor or a tuple/list of them; compare element-wise either way."""
    import torch

    items = list(output) if isinstance(output, (tuple, list)) else [output]
    result = []
    for item in items:
        if isinstance(item, torch.Tensor):
            result.append(item.detach().to("cpu", copy=True))
        else:
            result.append(torch.tensor(item) if isinstance(item, (int, float, bool)) else item)
    return result


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


class OpRecorder:
    """Records the aten ops a call executes (via a TorchDispatchMode) — C++ `at::` calls included."""

    def __init__(self) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self

        class _Mode(TorchDispatchMode):
            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                return False  # else torch wraps us in _disable_dynamo, importing Dynamo (~2 s) on first use

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                recorder.ops.add(func.overloadpacket.__name__)
                return func(*args, **(kwargs or {}))

        self.ops: set[str] = set()
        self.mode = _Mode()

    def __enter__(self) -> OpRecorder:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.mode.__exit__(*exc)


def _capture_graph(fn: Any, args: list[Any]) -> Any:
    """Capture one call in a CUDA graph, or None if the call cannot be captured (host syncs, legacy stream)."""
    import torch

    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*args)  # capture needs one warm call on a side stream (lazy init, autotuning, allocations)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(*args)
        graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception:
        torch.cuda.synchronize()
        return None


class _Timer:
    """One timed call at a time: L2 flush, sync, (pre-roll), event, call, event, sync.

    The CUDA primitives are bound when the timer is made, which the candidate harness does before it
    imports the candidate: a candidate that later rebinds `torch.cuda.Event` or `synchronize` in
    Python does not change what measures it.
    """

    def __init__(self, flush_l2: bool) -> None:
        import torch

        self.event = torch.cuda.Event
        self.elapsed = torch.cuda.Event.elapsed_time
        self.record = torch.cuda.Event.record
        self.sync = torch.cuda.synchronize
        self.sleep = torch.cuda._sleep
        self.flush_l2 = flush_l2
        self._flush: Any = None

    def once(self, call: Any, graph: bool) -> float:
        import torch

        if self.flush_l2 and self._flush is None:
            self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        if self._flush is not None:
            self._flush.zero_()
        self.sync()
        if graph:
            # Keep the GPU busy while the host enqueues start → replay → end, so the interval holds
            # only GPU work, not the host's submission latency (a few µs, and noisy).
            self.sleep(PREROLL_CYCLES)
        start, end = self.event(enable_timing=True), self.event(enable_timing=True)
        self.record(start)
        call()
        self.record(end)
        self.sync()
        return float(self.elapsed(start, end))

    def prepare(self, fn: Any, args: list[Any], n_warmup: int, method: str) -> tuple[Any, bool]:
        """Warm `fn` up and return (what to call per trial, whether it is a CUDA-graph replay)."""
        for _ in range(n_warmup):
            fn(*args)
        self.sync()
        graph = _capture_graph(fn, args) if method == "graph" else None
        return (graph.replay, True) if graph is not None else ((lambda: fn(*args)), False)


def time_calls(
    fn: Any, args: list[Any], n_warmup: int, n_trials: int, flush_l2: bool, method: str = "graph",
    timer: _Timer | None = None,
) -> dict[str, Any]:  # fmt: skip
    """CUDA-event timing of one call: warm-up, then per trial an L2 flush, sync, record, call, record, sync.

    method "graph" replays a CUDA graph of the call, so the time is the GPU's and not Python's launch
    overhead (which dominates, and varies, for kernels of a few microseconds); "events" calls `fn`
    directly, as KernelBench does. "graph" falls back to "events" when the call cannot be captured; the
    method used is returned with the statistics.
    """
    import torch

    timer = timer or _Timer(flush_l2)
    with torch.no_grad():
        call, graph = timer.prepare(fn, args, n_warmup, method)
        times = [timer.once(call, graph) for _ in range(n_trials)]
    return {**summarize(times), "method": "graph" if graph else "events"}


def summarize(times: list[float]) -> dict[str, Any]:
    import statistics

    return {
        "median_ms": statistics.median(times),
        "mean_ms": statistics.fmean(times),
        "std_ms": statistics.pstdev(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "n_trials": len(times),
    }


def trimmed_mean_interval(values: list[float], trim: float = 0.2, z: float = 1.96) -> tuple[float, float, float]:
    """The `trim`-trimmed mean and its ~95 % interval (Tukey–McLaughlin: winsorized variance).

    Why not the median: CUDA events tick in 32 ns steps, ~1 % of a 4 µs kernel, so a median of per-call
    times (or of their ratios) moves in whole ticks from one evaluation to the next. A mean over many
    jittered calls resolves below one tick; trimming 20 % from each end keeps it as robust to the odd
    delayed call (a descheduled host thread) as a median.
    """
    import math

    ordered = sorted(values)
    n = len(ordered)
    cut = int(trim * n)
    kept = ordered[cut : n - cut] or ordered
    mean = sum(kept) / len(kept)
    if n < 3:
        return mean, ordered[0], ordered[-1]
    winsorized = [min(max(v, kept[0]), kept[-1]) for v in ordered]
    w_mean = sum(winsorized) / n
    w_var = sum((v - w_mean) ** 2 for v in winsorized) / (n - 1)
    half = z * math.sqrt(w_var) / ((1 - 2 * cut / n) * math.sqrt(n))
    return mean, mean - half, mean + half


def _placements(args: list[Any], budget_bytes: int = 1 << 30, most: int = 4) -> list[list[Any]]:
    """The inputs, plus copies at other addresses while they fit in `budget_bytes`.

    A small kernel's time depends on where its buffers landed (DRAM channels, alignment), which differs
    from one process to the next; cycling the timed pairs over several placements averages that over
    placements inside one evaluation instead of leaving it as evaluation-to-evaluation spread.
    """
    import torch

    tensors = [x for x in args if isinstance(x, torch.Tensor)]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    count = max(1, min(most, budget_bytes // max(nbytes, 1)))
    return [args] + [[x.clone() if isinstance(x, torch.Tensor) else x for x in args] for _ in range(count - 1)]


def time_paired(
    ref: Any, cand: Any, args: list[Any], *, n_warmup: int, min_pairs: int, max_pairs: int, flush_l2: bool,
    method: str, target_rel_ci: float, budget_s: float, timer: _Timer | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Reference and candidate timed in one process, interleaved A/B then B/A, until the speedup is known.

    Each pair gives one ratio reference/candidate measured moments apart, so clock, thermal and
    neighbour drift hit both sides alike; the speedup is the 20 %-trimmed mean ratio, reported with its
    ~95 % interval (`trimmed_mean_interval`). Rounds of 10 pairs cycle over input placements
    (`_placements`) until the interval's half-width is within `target_rel_ci` of the speedup (at least
    `min_pairs`, at most `max_pairs` pairs, and past `budget_s` seconds no new round). Both sides
    use the same method: CUDA-graph replays when both can be captured, else direct calls.
    """
    import time as _time

    import torch

    timer = timer or _Timer(flush_l2)
    with torch.no_grad():
        placements = _placements(args)
        calls = [(timer.prepare(ref, inputs, n_warmup if i == 0 else 1, method),
                  timer.prepare(cand, inputs, n_warmup if i == 0 else 1, method)) for i, inputs in enumerate(placements)]  # fmt: skip
        graph = all(r[1] and c[1] for r, c in calls)
        if not graph and any(r[1] or c[1] for r, c in calls):  # like with like: if one cannot be captured, neither is
            calls = [(timer.prepare(ref, inputs, 0, "events"), timer.prepare(cand, inputs, 0, "events"))
                     for inputs in placements]  # fmt: skip
        ref_t: list[float] = []
        cand_t: list[float] = []
        started = _time.perf_counter()
        while True:
            (ref_call, ref_graph), (cand_call, cand_graph) = calls[(len(ref_t) // 10) % len(calls)]
            for _ in range(10):
                if len(ref_t) % 2 == 0:
                    ref_t.append(timer.once(ref_call, ref_graph))
                    cand_t.append(timer.once(cand_call, cand_graph))
                else:
                    cand_t.append(timer.once(cand_call, cand_graph))
                    ref_t.append(timer.once(ref_call, ref_graph))
            ratios = [r / c for r, c in zip(ref_t, cand_t) if c > 0]
            speedup, lo, hi = trimmed_mean_interval(ratios) if ratios else (float("nan"),) * 3
            n = len(ref_t)
            tight = speedup > 0 and (hi - lo) / (2 * speedup) <= target_rel_ci
            if n >= max_pairs or (n >= min_pairs and (tight or _time.perf_counter() - started > budget_s)):
                break
    used = "graph" if ref_graph else "events"
    return {"reference": {**summarize(ref_t), "method": used}, "candidate": {**summarize(cand_t), "method": used},
            "speedup": speedup, "interval": [lo, hi], "pairs": n}  # fmt: skip


def _error(stage: str, exc: BaseException) -> dict[str, Any]:
    return {
        "stage": stage,
        "exc_type": type(exc).__name__,
        "message": str(exc)[-20_000:],
        "traceback": "".join(traceback.format_exception(exc))[-20_000:],
    }


# --------------------------------------------------------------------------------------------- hooks


def _install_triton_hooks() -> None:
    """Count real Triton launches (compiled and interpreted); autotuning launches count too."""
    try:
        from triton.runtime import jit as triton_jit
    except ImportError:
        return
    classes: list[type] = [triton_jit.JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:
        pass
    for cls in classes:
        original = cls.run

        def counted(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if not kwargs.get("warmup", False):
                _Launches.count += 1
            return _original(self, *args, **kwargs)

        cls.run = counted  # type: ignore[method-assign]


class _CountingModule:
    """Wraps a `load_inline` module so each call into it counts as a custom-kernel launch."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            _Launches.count += 1
            return attr(*args, **kwargs)

        return counted


class _NoGpuModule:
    """Stands in for a CUDA extension that was compiled but cannot be loaded on a host without a GPU."""

    def __getattr__(self, name: str) -> Any:
        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("CUDA extension compiled, but there is no GPU here to run it")

        return unavailable


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _compile_only(kwargs: dict[str, Any], build_dir: Path, stats: dict[str, Any]) -> None:
    """No GPU: check that the sources compile (nvcc for CUDA, g++ syntax check for C++), no linking."""
    from torch.utils import cpp_extension

    build_dir.mkdir(parents=True, exist_ok=True)
    import sysconfig

    import torch

    # Torch's own C++ standard (c++20 since 2.10ish), and kbrl's shim for the one generated header the
    # CPU wheels lack, last on the path so real headers always win.
    std = "-std=c++20" if "-std=c++20" in Path(cpp_extension.__file__).read_text() else "-std=c++17"
    shim = Path(__file__).parent / "compat_include"
    includes = [f"-I{p}" for p in [*cpp_extension.include_paths(), sysconfig.get_paths()["include"], shim]]

    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    jobs = []
    cuda_src = "\n".join(_as_list(kwargs.get("cuda_sources")))
    if cuda_src:
        nvcc = shutil.which("nvcc") or (
            str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc") if "CUDA_HOME" in os.environ else None
        )
        if nvcc is None:
            raise CompileError("no GPU and no nvcc on this host: CUDA source cannot be checked")
        cu = build_dir / "kernel.cu"
        cu.write_text("#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n" + cuda_src)
        flags = _as_list(kwargs.get("extra_cuda_cflags"))
        jobs.append([nvcc, "-c", std, abi, *includes, *flags, str(cu), "-o", str(build_dir / "k.o")])
    cpp_src = "\n".join(_as_list(kwargs.get("cpp_sources")))
    if cpp_src:
        cpp = build_dir / "main.cpp"
        cpp.write_text("#include <torch/extension.h>\n" + cpp_src)
        flags = _as_list(kwargs.get("extra_cflags"))
        jobs.append(["g++", "-fsyntax-only", std, abi, *includes, *flags, str(cpp)])
    procs = [subprocess.Popen(j, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for j in jobs]
    outputs = [(p.wait(), p.stdout.read() if p.stdout else "") for p in procs]
    stats["compile_only"] = True
    failures = [out for rc, out in outputs if rc != 0]
    if failures:
        raise CompileError("\n".join(failures))


def _install_build_hooks(cache_root: Path, has_gpu: bool, stats: dict[str, Any]) -> None:
    """Route `load_inline` through the content-hash build cache; compile-only without a GPU."""
    from torch.utils import cpp_extension

    # Torch's real load_inline, captured before the hook below replaces it.
    cache = BuildCache(cache_root, builder=cpp_extension.load_inline)

    def cached_load_inline(name: str, cpp_sources: Any, cuda_sources: Any = None, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            if not has_gpu:
                key = build_key(name, cpp_sources, cuda_sources, **kwargs)
                checked = cache.checked(key)  # these exact sources already passed the check on this host
                stats["build_cache_hit"] = stats.get("build_cache_hit", True) and checked
                if checked:
                    stats["compile_only"] = True
                else:
                    cache_root.mkdir(parents=True, exist_ok=True)
                    check_dir = Path(tempfile.mkdtemp(prefix="check-", dir=cache_root))
                    try:
                        sources = {"cpp_sources": cpp_sources, "cuda_sources": cuda_sources, **kwargs}
                        _compile_only(sources, check_dir, stats)
                    finally:
                        shutil.rmtree(check_dir, ignore_errors=True)
                    cache.mark_checked(key)
                return _NoGpuModule()
            module, outcome = cache.load(name, cpp_sources, cuda_sources, **kwargs)
            stats["build_cache_hit"] = stats.get("build_cache_hit", True) and outcome.hit
            if outcome.repaired:
                stats["build_cache_repaired"] = outcome.repaired
            stats["build_lock_wait_s"] = stats.get("build_lock_wait_s", 0.0) + outcome.lock_wait_s
            return module if isinstance(module, str) else _CountingModule(module)
        except CompileError:
            raise
        except Exception as exc:  # e.g. an extension that builds but will not import (undefined symbol)
            raise CompileError(str(exc)) from exc
        finally:
            stats["build_s"] = stats.get("build_s", 0.0) + time.perf_counter() - started

    cpp_extension.load_inline = cached_load_inline  # type: ignore[assignment]


# ------------------------------------------------------------------------------------------- modes


def run_reference(job: dict[str, Any]) -> None:
    """Trusted: seeded reference outputs (and baselines on a GPU) for the parent's cache."""
    import torch

    device, precision = job["device"], job["precision"]
    problem = load_module(Path(job["problem_path"]), "kbrl_reference_problem")
    seeds = trial_seeds(job["seed"], job["n_trials"] + 1)
    model = make_model(problem.Model, problem, job["seed"], device, precision)
    timing = job.get("timing") if device.startswith("cuda") else None
    compiled, compile_error = None, ""
    if timing and timing.get("compile"):
        # Compile (and autotune) before taking the GPU slot: only the timed runs need it to ourselves.
        try:
            compiled = torch.compile(model)
            with torch.no_grad():
                compiled(*make_inputs(problem, seeds[0], device, precision))
            synchronize(device)
        except Exception as exc:  # a baseline failing to compile is recorded, not fatal
            compiled, compile_error = None, f"torch.compile baseline failed: {type(exc).__name__}: {exc}"[:2000]
    if not wait_for_go():
        return
    outputs, aten_ops = [], set()
    with torch.no_grad():
        for i, trial_seed in enumerate(seeds):
            inputs = make_inputs(problem, trial_seed, device, precision)
            if i == 0:
                with OpRecorder() as rec:
                    out = model(*inputs)
                aten_ops = rec.ops
            else:
                out = model(*inputs)
            synchronize(device)
            outputs.append(as_tensor_list(out))
    torch.save({"outputs": outputs[:-1], "refill": outputs[-1]}, job["output_path"])
    report: dict[str, Any] = {"type": "reference", "aten_ops": sorted(aten_ops), "torch": torch.__version__}
    if device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name()
    if timing:
        # Both methods, so a candidate that cannot be graph-captured is still compared like with like.
        inputs = make_inputs(problem, seeds[0], device, precision)
        args = (timing["n_warmup"], timing["n_trials"], timing["flush_l2"])
        for name, fn in (("eager", model), ("compile", compiled)):
            if fn is not None:
                report[name] = {m: time_calls(fn, inputs, *args, method=m) for m in ("graph", "events")}
        if compile_error:
            report["compile_error"] = compile_error
    send_to_parent(report)


def wait_for_go() -> bool:
    """Tell the parent we are built and loaded; block until it grants the device (GPU work is serialized)."""
    send_to_parent({"type": "ready"})
    return json.loads(sys.stdin.readline() or "{}").get("cmd") == "go"


def _poison_allocator(device: str, nbytes: int) -> None:
    """Fill soon-to-be-reused GPU memory with NaN so an output the kernel never writes cannot look right."""
    import torch

    if not device.startswith("cuda"):
        return
    block = torch.empty(min(max(nbytes, 1 << 20), POISON_BYTES_MAX) // 4, dtype=torch.float32, device=device)
    block.fill_(float("nan"))
    del block


def run_candidate(job: dict[str, Any]) -> None:
    """Untrusted: compile, run the correctness trials, report; then time on request."""
    import torch

    device, precision = job["device"], job["precision"]
    has_gpu = device.startswith("cuda")
    stats: dict[str, Any] = {}
    stage_s: dict[str, float] = {}
    if has_gpu and job.get("gpu_memory_fraction"):
        torch.cuda.set_per_process_memory_fraction(float(job["gpu_memory_fraction"]))
    # Bound before any candidate code runs (see _Timer).
    timer = _Timer(job["timing"]["flush_l2"]) if has_gpu and job.get("timing") else None
    _install_triton_hooks()
    _install_build_hooks(Path(job["build_cache"]), has_gpu, stats)
    problem = load_module(Path(job["problem_path"]), "kbrl_problem")

    def report(**fields: Any) -> None:
        send_to_parent({"type": "phase1", "stage_seconds": stage_s, "build": stats, **fields})

    started = time.perf_counter()
    try:
        candidate = load_module(Path(job["candidate_path"]), "kbrl_candidate")
        model_cls = candidate.ModelNew
    except CompileError as exc:
        stage_s["compile"] = time.perf_counter() - started
        return report(compiled=False, error=_error("compile", exc))
    except BaseException as exc:
        stage_s["compile"] = time.perf_counter() - started
        return report(compiled=False, error=_error("import", exc))
    stage_s["compile"] = time.perf_counter() - started
    send_to_parent({"type": "stage", "stage": "compiled"})
    if stats.get("compile_only") or job.get("build_only"):
        return report(compiled=True, compile_only=bool(stats.get("compile_only")), build_only=bool(job.get("build_only")))

    started = time.perf_counter()
    try:
        model = make_model(model_cls, problem, job["seed"], device, precision)
    except BaseException as exc:
        stage_s["init"] = time.perf_counter() - started
        return report(compiled=True, error=_error("init", exc))
    stage_s["init"] = time.perf_counter() - started
    if not wait_for_go():
        return

    seeds = trial_seeds(job["seed"], job["n_trials"] + 1)
    outputs: list[list[Any]] = []
    launches: list[int] = []
    mutated = False
    aten_ops: set[str] = set()
    last_inputs: list[Any] = []
    started = time.perf_counter()
    try:
        with torch.no_grad():
            for i, trial_seed in enumerate(seeds[:-1]):
                inputs = make_inputs(problem, trial_seed, device, precision)
                originals = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
                in_bytes = sum(x.numel() * x.element_size() for x in inputs if isinstance(x, torch.Tensor))
                _poison_allocator(device, 2 * in_bytes)
                before = _Launches.count
                if i == 0:
                    with OpRecorder() as rec:
                        out = model(*inputs)
                    aten_ops = rec.ops
                else:
                    out = model(*inputs)
                synchronize(device)
                if i == 0:
                    stage_s["first_call"] = time.perf_counter() - started
                launches.append(_Launches.count - before)
                outputs.append(as_tensor_list(out))
                mutated = mutated or any(
                    isinstance(a, torch.Tensor) and not torch.equal(a, b) for a, b in zip(inputs, originals)
                )
                last_inputs = inputs
            # Refill trial: same tensors (same addresses), new values. A cache keyed on identity is caught.
            refill = make_inputs(problem, seeds[-1], device, precision)
            for dst, src in zip(last_inputs, refill):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
            refill_out = as_tensor_list(model(*last_inputs))
            synchronize(device)
    except BaseException as exc:
        stage_s["correctness"] = time.perf_counter() - started
        stage = "compile" if "CompilationError" in type(exc).__name__ else "forward"
        return report(compiled=stage != "compile", error=_error(stage, exc), launches=launches)
    stage_s["correctness"] = time.perf_counter() - started
    torch.save({"outputs": outputs, "refill": refill_out}, job["outputs_path"])
    report(compiled=True, launches=launches, inputs_mutated=mutated, aten_ops=sorted(aten_ops))

    command = json.loads(sys.stdin.readline() or "{}")
    if command.get("cmd") != "time" or not has_gpu:
        return
    timing = job["timing"]
    started = time.perf_counter()
    try:
        inputs = make_inputs(problem, seeds[0], device, precision)
        if timing.get("paired"):
            reference = make_model(problem.Model, problem, job["seed"], device, precision)
            paired = time_paired(reference, model, inputs, n_warmup=timing["n_warmup"],
                                 min_pairs=timing["min_pairs"], max_pairs=timing["max_pairs"],
                                 flush_l2=timing["flush_l2"], method=timing["method"],
                                 target_rel_ci=timing["target_rel_ci"], budget_s=timing["budget_s"], timer=timer)  # fmt: skip
            message = {"stats": paired.pop("candidate"), "paired": paired}
        else:
            message = {"stats": time_calls(model, inputs, timing["n_warmup"], timing["n_trials"], timing["flush_l2"],
                                           method=timing["method"], timer=timer)}  # fmt: skip
    except BaseException as exc:
        send_to_parent({"type": "timing", "error": _error("timing", exc)})
        return
    send_to_parent({"type": "timing", **message, "seconds": time.perf_counter() - started})


def main(argv: list[str]) -> int:
    import faulthandler

    faulthandler.enable()  # a segfaulting candidate still leaves a Python stack on stderr for the feedback
    job = json.loads(Path(argv[1]).read_text())
    if job["mode"] == "reference":
        run_reference(job)
    else:
        run_candidate(job)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    # os._exit: skip interpreter teardown, where a broken candidate's CUDA state can hang or crash.
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

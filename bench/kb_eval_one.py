"""Evaluate one candidate with KernelBench's own harness, in this fresh process, and write its result as JSON.

Driver for bench/eval_throughput.py (not a kbrl module): it does what KernelBench's single-sample script
`scripts/run_and_check.py` does locally (eval_mode=local), with KernelBench's code imported from a
checkout (`--kernelbench-root`, its `src/` is put on sys.path; nothing of it is vendored into kbrl):

1. `validate_kernel_static(kernel_src, backend, precision)` (run_and_check asserts on it; here `--static`
   chooses: record the verdict and go on, enforce it, or skip it);
2. `set_gpu_arch([...])` for the GPU it runs on (run_and_check's `gpu_arch`);
3. `eval_kernel_against_ref(original_model_src, custom_model_src, measure_performance=True,
   timing_method="cuda_event", num_correct_trials=5, num_perf_trials=100, build_dir, device=cuda:0,
   backend, precision=fp32)` inside run_and_check's last-level try/except;
4. `measure_ref_program_time(...)` eager and (if asked) torch.compile, the baselines run_and_check divides by.

Stage timings are taken by wrapping KernelBench's own functions for the duration of the evaluation
(load_custom_model* = compile/build, run_and_check_correctness = correctness, the timing function = kernel
and internal reference timing). Absolute wall-clock stamps (time.time()) let the parent compute process
start-up. Python's inference clients that KernelBench's utils import at module level (`openai`,
`litellm`) are replaced by empty stand-ins when they are not installed: the evaluation path never calls
them, and skipping their import can only make KernelBench look faster.
"""

from __future__ import annotations

import time

T_START = time.time()  # as early as possible: the parent compares it with the moment it spawned us

import argparse  # noqa: E402
import hashlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

# Compute capability major -> the architecture name KernelBench's set_gpu_arch accepts.
GPU_ARCH_BY_MAJOR = {7: "Volta", 8: "Ampere", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}


def gpu_arch_name(major: int, minor: int) -> str:
    if (major, minor) == (7, 5):
        return "Turing"
    if (major, minor) == (8, 9):
        return "Ada"
    return GPU_ARCH_BY_MAJOR.get(major, "Hopper")


def install_stubs() -> list[str]:
    """Empty stand-ins for KernelBench's LLM-client imports that are absent here; returns their names."""
    stubbed = []

    def unavailable(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("LLM clients are stubbed out in this benchmark driver")

    for name, attrs in (("openai", {"OpenAI": unavailable}), ("litellm", {"completion": unavailable}),
                        ("dotenv", {"load_dotenv": lambda *a, **k: False})):  # fmt: skip
        if name in sys.modules or importlib.util.find_spec(name) is not None:
            continue
        module = types.ModuleType(name)
        for attr, value in attrs.items():
            setattr(module, attr, value)
        sys.modules[name] = module
        stubbed.append(name)
    return stubbed


def jsonable(value: Any, limit: int = 2000) -> Any:
    """KernelBench's metadata holds exception objects; make everything JSON-safe and bounded."""
    if isinstance(value, dict):
        return {str(k): jsonable(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v, limit) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@contextmanager
def instrumented(kernel_eval: Any, kb_timing: Any, stages: dict[str, float]) -> Iterator[None]:
    """Time KernelBench's eval stages by wrapping its module-level functions; restore them afterwards."""
    originals: list[tuple[Any, str, Any]] = []

    def timed(fn: Callable[..., Any], stage: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                stages[stage] = stages.get(stage, 0.0) + time.perf_counter() - t

        return call

    def wrap(module: Any, name: str, stage: str) -> None:
        fn = getattr(module, name)
        originals.append((module, name, fn))
        setattr(module, name, timed(fn, stage))

    wrap(kernel_eval, "load_original_model_and_inputs", "load_reference")
    wrap(kernel_eval, "load_custom_model", "compile")  # CUDA: exec → load_inline builds here
    wrap(kernel_eval, "load_custom_model_with_tempfile", "compile")  # Triton: import of a temp file
    wrap(kernel_eval, "run_and_check_correctness", "correctness")
    get_timing_function = kb_timing.get_timing_function
    originals.append((kb_timing, "get_timing_function", get_timing_function))
    calls = [0]

    def timing_factory(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        fn = get_timing_function(*args, **kwargs)
        # eval_kernel_against_ref times the candidate first, then (excessive-speedup check) the reference.
        stage = "timing_kernel" if calls[0] == 0 else "timing_reference"
        calls[0] += 1
        return timed(fn, stage)

    kb_timing.get_timing_function = timing_factory
    try:
        yield
    finally:
        for module, name, fn in reversed(originals):
            setattr(module, name, fn)


def build_dir_for(prefix: Path, kernel_src: str, mode: str) -> Path:
    """run_and_check: `{prefix}/test_build/{hash(kernel_src)}`; Python's str hash is salted per process, so
    every fresh process gets a new directory and rebuilds a CUDA kernel. "shared": a content hash instead."""
    if mode == "shared":
        return prefix / "test_build" / hashlib.sha256(kernel_src.encode()).hexdigest()[:16]
    return prefix / "test_build" / str(hash(kernel_src))


def category_of(result: Any) -> str:
    if result is None:
        return "LOCK_RETRY"  # eval_kernel_against_ref returns None on a build lock-file error: "please retry"
    if not result.compiled:
        return "COMPILATION_ERROR"
    if result.correctness:
        return "CORRECT"
    meta = result.metadata or {}
    return "RUNTIME_ERROR" if any(k.startswith("runtime_error") for k in meta) else "CORRECTNESS_ERROR"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--kernelbench-root", type=Path, required=True, help="KernelBench checkout (holds src/)"
    )
    parser.add_argument("--ref", type=Path, required=True, help="reference source file (class Model)")
    parser.add_argument("--kernel", type=Path, required=True, help="candidate source file (class ModelNew)")
    parser.add_argument("--result", type=Path, required=True, help="where to write the result JSON")
    parser.add_argument("--backend", default="cuda", choices=["cuda", "triton"])
    parser.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    parser.add_argument("--correct-trials", type=int, default=5)
    parser.add_argument("--perf-trials", type=int, default=100)
    parser.add_argument("--timing-method", default="cuda_event")
    parser.add_argument(
        "--baselines", default="eager,compile", help="reference timings to take: eager,compile"
    )
    parser.add_argument("--build-dir-prefix", type=Path, required=True)
    parser.add_argument("--build-dir-mode", default="run_and_check", choices=["run_and_check", "shared"])
    parser.add_argument("--static", default="record", choices=["record", "enforce", "off"])
    args = parser.parse_args()

    stages: dict[str, float] = {}
    stamps: dict[str, float] = {"start": T_START}
    out: dict[str, Any] = {"stages": stages, "stamps": stamps, "backend": args.backend, "category": "CRASH"}
    try:
        _evaluate(args, out, stages, stamps)
    except BaseException as exc:  # noqa: BLE001 - the parent needs a result whatever happened
        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-4000:]
    finally:
        stamps["end"] = time.time()
        args.result.write_text(json.dumps(jsonable(out, limit=4000)))


def _evaluate(
    args: argparse.Namespace, out: dict[str, Any], stages: dict[str, float], stamps: dict[str, float]
) -> None:
    t = time.perf_counter()
    import torch

    stages["import_torch"] = time.perf_counter() - t
    stamps["torch_imported"] = time.time()
    sys.path.insert(0, str((args.kernelbench_root / "src").resolve()))
    out["stubbed_modules"] = install_stubs()
    t = time.perf_counter()
    from kernelbench import eval as kernel_eval
    from kernelbench import timing as kb_timing
    from kernelbench.kernel_static_checker import validate_kernel_static
    from kernelbench.utils import set_gpu_arch

    stages["import_kernelbench"] = time.perf_counter() - t
    stamps["kernelbench_imported"] = time.time()
    out["kernelbench_module"] = kernel_eval.__file__
    ref_src, kernel_src = args.ref.read_text(), args.kernel.read_text()

    if args.static != "off":
        t = time.perf_counter()
        ok, errors, warnings = validate_kernel_static(
            kernel_src, backend=args.backend, precision=args.precision
        )
        stages["static"] = time.perf_counter() - t
        out["static"] = {"ok": ok, "errors": errors, "warnings": warnings}
        if not ok and args.static == "enforce":
            out["category"] = "STATIC_REJECTED"
            return

    device = torch.device("cuda:0")
    major, minor = torch.cuda.get_device_capability(device)
    set_gpu_arch([gpu_arch_name(major, minor)])
    out["gpu"] = torch.cuda.get_device_name(device)
    out["gpu_arch"] = os.environ.get("TORCH_CUDA_ARCH_LIST")
    build_dir = build_dir_for(args.build_dir_prefix, kernel_src, args.build_dir_mode)
    out["build_dir_existed"] = build_dir.exists()
    precision = kernel_eval.get_torch_dtype_from_string(args.precision)

    t = time.perf_counter()
    with instrumented(kernel_eval, kb_timing, stages):
        try:  # run_and_check.evaluate_single_sample_src
            result = kernel_eval.eval_kernel_against_ref(
                original_model_src=ref_src, custom_model_src=kernel_src,
                measure_performance=True, timing_method=args.timing_method, verbose=False,
                num_correct_trials=args.correct_trials, num_perf_trials=args.perf_trials,
                build_dir=str(build_dir), device=device, backend=args.backend, precision=precision,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - run_and_check's "last level catch"
            key = "cuda_error" if "CUDA error" in str(exc) else "other_error"
            result = kernel_eval.KernelExecResult(compiled=False, correctness=False, metadata={key: str(exc)})
    stages["eval"] = time.perf_counter() - t
    stamps["evaluated"] = time.time()
    out["category"] = category_of(result)
    if result is not None:
        out["kernelbench_result"] = result.model_dump() if hasattr(result, "model_dump") else result.dict()
        out["compiled"], out["correct"] = result.compiled, result.correctness
        out["runtime_ms"] = result.runtime if result.runtime > 0 else None  # mean, ms (3 significant digits)
        out["ref_runtime_ms"] = result.ref_runtime if result.ref_runtime > 0 else None

    for kind in [b for b in args.baselines.split(",") if b]:
        t = time.perf_counter()
        stats = kb_timing.measure_ref_program_time(
            ref_arch_name="Reference Program", ref_arch_src=ref_src, num_trials=args.perf_trials,
            use_torch_compile=kind == "compile", timing_method=args.timing_method, device=device,
            verbose=False, precision=args.precision,
        )  # fmt: skip
        stages[f"ref_{kind}"] = time.perf_counter() - t
        out[f"ref_{kind}_ms"] = (stats or {}).get("mean")
    stamps["baselines_timed"] = time.time()

    # run_and_check's speedups: reference mean / kernel mean, only for a correct kernel.
    runtime = out.get("runtime_ms")
    for kind in ("eager", "compile"):
        ref = out.get(f"ref_{kind}_ms")
        out[f"speedup_{kind}"] = ref / runtime if out.get("correct") and runtime and ref else None
    # eval_kernel_against_ref's own ratio (its excessive-speedup check), for comparison.
    ref = out.get("ref_runtime_ms")
    out["speedup_internal"] = ref / runtime if out.get("correct") and runtime and ref else None


if __name__ == "__main__":
    main()

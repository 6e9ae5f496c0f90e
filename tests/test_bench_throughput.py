"""bench/eval_throughput.py and its KernelBench driver: the arithmetic and bookkeeping that need no GPU."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


tp = _load("eval_throughput")
drv = _load("kb_eval_one")


def _row(
    harness: str, backend: str, wall: float, phase: str = "pass", correct: bool = True, **extra: object
) -> dict:
    return {"harness": harness, "backend": backend, "phase": phase, "correct": correct, "sample": backend,
            "category": "CORRECT" if correct else "CORRECTNESS_ERROR", "wall_s": wall,
            "stages": {"total": wall}, **extra}  # fmt: skip


def test_cv_is_population_stdev_over_mean_and_ignores_missing() -> None:
    assert tp.cv([2.0, 2.0, 2.0]) == 0.0
    assert tp.cv([1.0, 3.0]) == pytest.approx(0.5)  # pstdev 1, mean 2
    assert tp.cv([1.0, None, 3.0]) == pytest.approx(0.5)
    assert tp.cv([1.0]) is None and tp.cv([None, None]) is None and tp.cv([]) is None


def test_summary_rates_and_ratio_per_backend_from_pass_walls() -> None:
    rows = [_row("kbrl", "triton", 5.0) for _ in range(6)] + [_row("kbrl", "cuda", 50.0) for _ in range(4)]
    rows += [_row("kernelbench", "triton", 6.0) for _ in range(3)] + [
        _row("kernelbench", "cuda", 55.0, correct=False)
    ]
    rows += [_row("kbrl", "triton", 1.0, phase="repeat/warm") for _ in range(5)]  # repeats never count
    walls = {"kbrl": {"triton": 30.0, "cuda": 60.0}, "kernelbench": {"triton": 18.0, "cuda": 55.0}}
    s = tp.summarize(rows, walls)
    assert list(s) == ["triton", "cuda", "all"]
    assert s["triton"]["kbrl"]["n"] == 6 and s["triton"]["kbrl"]["candidates_per_min"] == pytest.approx(12.0)
    assert s["triton"]["kernelbench"]["candidates_per_min"] == pytest.approx(10.0)
    assert s["triton"]["ratio_kbrl_over_kernelbench"] == pytest.approx(1.2)
    assert s["triton"]["same_candidates"] is False  # 6 candidates against 3
    assert s["cuda"]["ratio_kbrl_over_kernelbench"] == pytest.approx(4 / 60 / (1 / 55))
    assert s["cuda"]["kernelbench"]["correct"] == 0
    assert s["cuda"]["kernelbench"]["categories"] == {"CORRECTNESS_ERROR": 1}
    assert s["all"]["kbrl"]["wall_s"] == 90.0 and s["all"]["kbrl"]["n"] == 10
    assert s["all"]["kernelbench"]["candidates_per_min"] == pytest.approx(60 * 4 / 73)
    assert s["triton"]["kbrl"]["mean_stage_seconds"] == {"total": 5.0}


def test_summary_says_whether_both_harnesses_ran_the_same_candidates() -> None:
    rows = [
        _row(h, "triton", 5.0, sample=f"builtin/L1/{i}/triton")
        for h in ("kbrl", "kernelbench")
        for i in (1, 2)
    ]
    s = tp.summarize(rows, {"kbrl": {"triton": 2.0}, "kernelbench": {"triton": 10.0}})
    assert s["triton"]["same_candidates"] is True and s["triton"]["ratio_kbrl_over_kernelbench"] == 5.0
    assert "5.00x" in tp.format_summary(s, {}) and "different candidate sets" not in tp.format_summary(s, {})


def test_summary_without_one_harness_has_no_ratio() -> None:
    s = tp.summarize([_row("kbrl", "triton", 5.0)], {"kbrl": {"triton": 5.0}})
    assert "ratio_kbrl_over_kernelbench" not in s["triton"] and "kernelbench" not in s["triton"]


def test_spread_of_repeats_reports_speedups_cv_and_builds() -> None:
    reps = [_row("kbrl", "cuda", 2.0, speedup_eager=s, runtime_ms=0.01, eager_ms=0.0105, build_cache_hit=True)
            for s in (1.0, 1.02, 0.98)]  # fmt: skip
    reps[0]["stages"]["build"] = 44.0
    out = tp.spread(reps)
    assert out["speedup_mean"] == pytest.approx(1.0)
    assert out["speedup_cv"] == pytest.approx(tp.cv([1.0, 1.02, 0.98]))
    assert out["runtime_cv"] == 0.0 and out["build_cache_hits"] == [True, True, True]
    assert out["build_s"] == [44.0, None, None]
    assert "1.020" in tp.format_summary({}, {"builtin/L1/1/cuda": {"kbrl/warm": out}})


def test_kernelbench_stages_add_process_start_and_exit() -> None:
    driver = {"stages": {"import_torch": 3.0, "eval": 1.0}, "stamps": {"start": 100.5, "end": 105.0}}
    stages = tp.kb_stages(driver, spawned_at=100.0, ended_at=105.25)
    assert stages["python_start"] == pytest.approx(0.5) and stages["exit"] == pytest.approx(0.25)
    assert stages["wall"] == pytest.approx(5.25) and stages["import_torch"] == 3.0
    assert tp.kb_stages({}, 0.0, 2.0) == {"wall": 2.0}  # a process that died before writing its result


def test_backend_from_id_suffix_or_code() -> None:
    assert tp.backend_of("builtin/L1/1/cuda", "@triton.jit") == "cuda"
    assert tp.backend_of("L1/P19/S0", "import triton\n@triton.jit\ndef k(): pass") == "triton"
    assert tp.backend_of("L1/P19/S0", "from torch.utils.cpp_extension import load_inline") == "cuda"
    assert tp.backend_of("L1/P19/S0", "x = 1") == "other"


def test_builtin_repeat_samples_and_name_matched_kernelbench_pairs(tmp_path: Path) -> None:
    from kbrl.evalrun import builtin_candidates

    ids = {c.sample_id for c in builtin_candidates()}
    assert {"builtin/L1/5/triton", "builtin/L1/1/cuda"} <= ids  # the default --repeat-samples
    level1 = tmp_path / "KernelBench" / "level1"
    level1.mkdir(parents=True)
    relu = "import torch\nclass Model(torch.nn.Module):\n    pass\n"
    (level1 / "19_ReLU.py").write_text(relu)
    (level1 / "20_LeakyReLU.py").write_text(relu)
    cands = tp.gather_candidates(["kernelbench"], tmp_path, None)
    assert sorted(c.sample_id for c in cands) == ["kernelbench/L1/19/cuda", "kernelbench/L1/19/triton"]
    assert all(c.problem.code == relu and "class ModelNew" in c.code for c in cands)


def test_select_filters_by_backend_pattern_and_limit() -> None:
    cands = [
        tp.BenchCandidate(f"builtin/L1/{i}/{b}", None, "", "", b, "builtin")
        for i in (1, 2, 3)
        for b in ("triton", "cuda")
    ]
    assert [c.sample_id for c in tp.select(cands, "cuda", None, 2)] == [
        "builtin/L1/1/cuda",
        "builtin/L1/2/cuda",
    ]
    assert [c.sample_id for c in tp.select(cands, "triton", r"L1/[23]/", None)] == [
        "builtin/L1/2/triton", "builtin/L1/3/triton"]  # fmt: skip


def test_kernelbench_build_dir_is_salted_per_process_unless_shared(tmp_path: Path) -> None:
    code = "print('build dir:')"
    shared = {drv.build_dir_for(tmp_path, code, "shared") for _ in range(2)}
    assert len(shared) == 1
    # run_and_check names the dir by Python's str hash, salted per process: two processes, two dirs.
    script = f"import sys; sys.path.insert(0, {str(BENCH)!r}); import kb_eval_one as d, pathlib; " \
             f"print(d.build_dir_for(pathlib.Path('/b'), {code!r}, 'run_and_check'))"  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    dirs = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env).stdout
            for _ in range(3)}  # fmt: skip
    assert len(dirs) > 1


def test_instrumented_times_kernelbench_stages_and_restores_them() -> None:
    calls = []
    fake_eval = types.SimpleNamespace(
        load_original_model_and_inputs=lambda *a: calls.append("ref"),
        load_custom_model=lambda *a: calls.append("cuda build"),
        load_custom_model_with_tempfile=lambda *a: calls.append("triton import"),
        run_and_check_correctness=lambda *a: calls.append("correct"),
    )
    fake_timing = types.SimpleNamespace(
        get_timing_function=lambda method: lambda *a, **k: calls.append(method)
    )
    originals = dict(vars(fake_eval)), fake_timing.get_timing_function
    stages: dict[str, float] = {}
    with drv.instrumented(fake_eval, fake_timing, stages):
        fake_eval.load_original_model_and_inputs()
        fake_eval.load_custom_model()
        fake_eval.run_and_check_correctness()
        fake_timing.get_timing_function("cuda_event")()  # the candidate first
        fake_timing.get_timing_function("cuda_event")()  # then the reference (excessive-speedup check)
    assert calls == ["ref", "cuda build", "correct", "cuda_event", "cuda_event"]
    assert set(stages) == {"load_reference", "compile", "correctness", "timing_kernel", "timing_reference"}
    assert dict(vars(fake_eval)) == originals[0] and fake_timing.get_timing_function is originals[1]


def test_driver_results_are_json_safe_and_categorised() -> None:
    assert drv.jsonable({"e": ValueError("x" * 50), "t": (1, None)}, limit=10) == {
        "e": "xxxxxxx...",
        "t": [1, None],
    }
    result = types.SimpleNamespace(compiled=True, correctness=False, metadata={"runtime_error": "boom"})
    assert drv.category_of(result) == "RUNTIME_ERROR"
    result.metadata = {"max_difference": ["0.1"]}
    assert drv.category_of(result) == "CORRECTNESS_ERROR"
    assert drv.category_of(None) == "LOCK_RETRY"
    assert drv.gpu_arch_name(9, 0) == "Hopper" and drv.gpu_arch_name(8, 9) == "Ada"


def test_stubs_only_replace_absent_modules() -> None:
    saved = {m: sys.modules.pop(m) for m in ("openai", "litellm", "dotenv") if m in sys.modules}
    stubbed: list[str] = []
    try:
        stubbed = drv.install_stubs()
        for name in ("openai", "litellm", "dotenv"):
            installed = importlib.util.find_spec(name) is not None if name not in stubbed else False
            assert (name in stubbed) != installed  # stubbed exactly when it cannot be imported
        if "openai" in stubbed:
            with pytest.raises(RuntimeError):
                sys.modules["openai"].OpenAI()
    finally:
        for name in ("openai", "litellm", "dotenv"):
            if name in stubbed:
                sys.modules.pop(name, None)
        sys.modules.update(saved)

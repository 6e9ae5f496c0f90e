"""The evaluator end to end on CPU: built-in solutions, the fault corpus, the cheat corpus, compile-only CUDA.

Every candidate here really runs in a sandboxed child (Triton through its CPU interpreter); nothing is
mocked. GPU-only behaviour (timing, CUDA execution) is in tests/test_evaluator_gpu.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from kbrl.evalrun import builtin_candidates
from kbrl.kernels.evaluator import EvalConfig, Evaluator
from kbrl.kernels.result import Category
from kbrl.kernels.sandbox import namespaces_available
from kbrl.problems import get_problem
from kbrl.problems.model import Problem

CORPUS = Path(__file__).parent / "corpus"
# CUDA faults need nvcc and minutes of compile-only time on a CPU host: tested once, in the slow test below.
FAULTS = sorted(p for p in (CORPUS / "faults").glob("*.py") if "load_inline" not in p.read_text())
SECRET = "sk-kbrl-test-secret-0123456789"


def header(path: Path, key: str) -> str:
    match = re.search(rf"^# {key}: (\S+)$", path.read_text(), re.M)
    assert match, f"{path.name} has no '# {key}:' header"
    return match.group(1)


def needs(path: Path) -> None:
    if "os.kill(-1" in path.read_text() and not namespaces_available():
        pytest.skip("no PID namespace here: a kill(-1) candidate would hit the test runner")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kbrl-cache")


@pytest.fixture(scope="module")
def evaluator(cache_dir: Path) -> Evaluator:
    return Evaluator(EvalConfig(device="cpu", timeout_s=20, memory_mb=3072), cache_dir=cache_dir)


@pytest.fixture(scope="module")
def unchecked(cache_dir: Path) -> Evaluator:
    """Static checks off: what the sandbox and the dynamic checks catch on their own."""
    config = EvalConfig(device="cpu", timeout_s=20, memory_mb=3072, static_checks=False)
    return Evaluator(config, cache_dir=cache_dir)


def test_builtin_triton_solutions_are_correct(cache_dir: Path) -> None:
    candidates = builtin_candidates(backend="triton")
    assert len(candidates) >= 14
    ev = Evaluator(EvalConfig(device="cpu", timeout_s=120), cache_dir=cache_dir)
    results = dict(ev.evaluate_many([(c.problem, c.text) for c in candidates], jobs=2))
    failures = {
        candidates[i].sample_id: (r.category, r.error[:300], [f.name for f in r.cheat_flags])
        for i, r in results.items()
        if r.category != Category.CORRECT
    }
    assert not failures
    for r in results.values():
        assert r.n_correct == r.n_trials == 5
        assert r.timing_available is False and "no GPU" in r.timing_note
        assert r.max_abs_err is not None and r.max_abs_err < 1e-2


@pytest.mark.parametrize("path", FAULTS, ids=[p.stem for p in FAULTS])
def test_fault_corpus(path: Path, evaluator: Evaluator) -> None:
    needs(path)
    problem = get_problem(header(path, "problem"))
    result = evaluator.evaluate(problem, path.read_text())
    assert result.category == Category(header(path, "expect")), (result.error, result.cheat_flags)
    assert result.feedback.startswith(f"Status: {result.category}")
    assert result.stage_seconds["total"] < evaluator.config.timeout_s + 15


@pytest.mark.parametrize("path", FAULTS, ids=[p.stem for p in FAULTS])
def test_fault_corpus_without_static_checks(
    path: Path, unchecked: Evaluator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox alone contains each fault: crashes, hangs, bombs, network and secrets."""
    needs(path)
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    problem = get_problem(header(path, "problem"))
    result = unchecked.evaluate(problem, path.read_text())
    assert result.category == Category(header(path, "expect-unchecked")), (result.error, result.stderr_tail)
    assert SECRET not in json.dumps(result.to_dict())
    if path.stem == "read_secret":
        assert "leaked secret=None" in result.error
    if path.stem in ("network", "os_system"):
        assert "unreachable" in result.error or "could not reach the network" in result.error
    if path.stem == "segfault":
        assert "SIGSEGV" in result.error and "candidate.py" in result.error
    if path.stem == "memory_bomb":
        assert "out of memory" in result.error
    if path.stem == "noisy_but_correct":
        assert len(result.stdout_tail) <= 2000


def test_parent_environment_is_not_inherited(unchecked: Evaluator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    monkeypatch.setenv("KBRL_DATABASE_URL", "postgresql://secret-host/db")
    code = (CORPUS / "faults" / "read_secret.py").read_text().replace(
        "secret = os.environ.get('TINKER_API_KEY')", "secret = sorted(os.environ)"
    )
    result = unchecked.evaluate(get_problem("builtin/L1/5"), code)
    assert "TINKER_API_KEY" not in result.error and "KBRL_DATABASE_URL" not in result.error
    assert "PATH" in result.error


def _cheat_cases() -> list[Path]:
    return sorted((CORPUS / "cheats").glob("*.py"))


@pytest.mark.parametrize("path", _cheat_cases(), ids=[p.stem for p in _cheat_cases()])
def test_cheat_corpus_is_flagged(path: Path, evaluator: Evaluator) -> None:
    reference = CORPUS / "references" / f"{header(path, 'reference')}.py"
    problem = Problem("test", 1, 1, reference.stem, reference.read_text())
    result = evaluator.evaluate(problem, path.read_text())
    assert result.category == Category.CHEAT, (result.category, result.error)
    assert any(f.severity == "error" for f in result.cheat_flags)


# Hacks that run and would look correct: the dynamic checks must catch them even without static checks.
DYNAMIC = {
    "torch_only": "no_custom_kernel_launched",
    "decoy_kernel": "torch_does_the_work",
    "output_caching": "output_caching",
    "mutates_input": "mutates_inputs",
}


@pytest.mark.parametrize("stem", sorted(DYNAMIC))
def test_dynamic_checks_catch_hacks_without_static_checks(stem: str, unchecked: Evaluator) -> None:
    path = CORPUS / "dynamic" / f"{stem}.py"
    assert header(path, "expect-flag") == DYNAMIC[stem]
    result = unchecked.evaluate(get_problem(header(path, "problem")), path.read_text())
    assert result.category == Category.CHEAT, (result.category, result.error)
    assert DYNAMIC[stem] in [f.name for f in result.cheat_flags]


def test_completion_text_is_extracted(evaluator: Evaluator) -> None:
    problem = get_problem("builtin/L1/5")
    (candidate,) = [c for c in builtin_candidates(level=1, backend="triton") if c.problem.id == problem.id]
    completion = f"Here is a fused ReLU.\n\n```python\n{candidate.text}\n```\nIt launches one kernel."
    result = evaluator.evaluate(problem, completion)
    assert result.category == Category.CORRECT
    empty = evaluator.evaluate(problem, "I cannot write this kernel.")
    assert empty.category == Category.FORMAT_ERROR and "ModelNew" in empty.error


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cuda_candidates_are_compile_checked_without_gpu(cache_dir: Path) -> None:
    """No GPU: a good CUDA kernel is UNVERIFIED (compiled, never called correct), a broken one fails to compile."""
    (good,) = [c for c in builtin_candidates(level=1, backend="cuda") if c.problem.id == "builtin/L1/5"]
    broken = CORPUS / "faults" / "cuda_compile_error.py"
    ev = Evaluator(EvalConfig(device="cpu", timeout_s=900), cache_dir=cache_dir)
    results = dict(ev.evaluate_many([(good.problem, good.text), (good.problem, broken.read_text())], jobs=2))
    assert results[0].category == Category.UNVERIFIED, results[0].error
    assert results[0].compiled and not results[0].correct and results[0].backend == "cuda"
    assert "no GPU" in results[0].feedback
    assert results[1].category == Category.COMPILATION_ERROR
    assert "error" in results[1].error and "relu_kernel" in results[1].error or "expected" in results[1].error


def test_evaluator_runs_in_its_own_process_only(evaluator: Evaluator) -> None:
    """No candidate module is ever imported into the evaluator's process."""
    import sys

    assert not [m for m in sys.modules if m.startswith("kbrl_candidate")]
    assert os.environ.get("TRITON_INTERPRET") is None

"""GPU behaviour of the evaluator: real CUDA builds, timing, GPU faults. Run on a CUDA host:

    PYTHONPATH=. python -m pytest -m gpu tests/test_evaluator_gpu.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kbrl.evalrun import builtin_candidates
from kbrl.kernels.evaluator import EvalConfig, Evaluator
from kbrl.kernels.result import Category
from kbrl.problems import get_problem

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CORPUS = Path(__file__).parent / "corpus"

ILLEGAL_ACCESS = r'''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

src = r"""
__global__ void bad(const float* x, float* out, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    out[i * 1000000007L] = x[i];   // far out of bounds
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto out = torch::empty_like(x);
    long n = x.numel();
    bad<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""
ext = load_inline(name="bad_access", cpp_sources="torch::Tensor relu_cuda(torch::Tensor x);",
                  cuda_sources=src, functions=["relu_cuda"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_cuda(x.contiguous())
'''

GPU_BOMB = (CORPUS / "faults" / "wrong_values.py").read_text().replace(
    "return relu(x) * 1.5", "hoard = [torch.empty(1 << 30, device=x.device) for _ in range(10_000)]\n        return relu(x)"
)


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    config = EvalConfig(device="cuda", timeout_s=300, gpu_memory_fraction=0.5)
    shared = os.environ.get("KBRL_CACHE_DIR")  # reuse builds from an earlier bench run on the same host
    return Evaluator(config, cache_dir=Path(shared) if shared else tmp_path_factory.mktemp("gpu-cache"))


def test_builtin_solutions_compile_verify_and_time(evaluator: Evaluator) -> None:
    candidates = builtin_candidates()
    results = dict(evaluator.evaluate_many([(c.problem, c.text) for c in candidates], jobs=4))
    bad = {candidates[i].sample_id: (r.category, r.error[:400]) for i, r in results.items() if not r.correct}
    assert not bad
    for r in results.values():
        assert r.timing_available and r.runtime is not None and r.ref_eager is not None
        assert r.runtime.n_trials == r.ref_eager.n_trials >= evaluator.config.min_timing_pairs  # pairs
        assert r.speedup_eager is not None and r.speedup_eager > 0 and r.speedup_eager_ci is not None
        low, high = r.speedup_eager_ci
        assert low <= r.speedup_eager <= high
    server = evaluator.warm_server()
    assert server is not None and server.alive  # every candidate above was forked from it


def test_a_reference_slowed_in_the_candidates_process_is_not_believed(tmp_path: Path) -> None:
    """A candidate that makes the reference slower in its own process (to inflate its speedup) gets the
    speedup against the trusted baseline instead, with a warning."""
    unchecked = Evaluator(EvalConfig(device="cuda", static_checks=False), cache_dir=tmp_path)
    (honest,) = [c for c in builtin_candidates(backend="triton") if c.problem.id == "builtin/L1/5"]
    slow_reference = honest.text.replace("\nclass ModelNew", """
import sys as _sys
_Model = _sys.modules["kbrl_problem"].Model
_forward = _Model.forward
def _slow(self, *args):
    for _ in range(4):
        _forward(self, *args)
    return _forward(self, *args)
_Model.forward = _slow

class ModelNew""", 1)
    fair = unchecked.evaluate(honest.problem, honest.text)
    tampered = unchecked.evaluate(honest.problem, slow_reference)
    assert fair.correct and tampered.correct, (fair.error, tampered.error)
    assert "reference_timing_mismatch" in [f.name for f in tampered.cheat_flags]
    assert "reference_timing_mismatch" not in [f.name for f in fair.cheat_flags]
    assert tampered.speedup_eager is not None and fair.speedup_eager is not None
    assert tampered.speedup_eager < 1.5 * fair.speedup_eager  # not the ~5x the tampering aimed at


def test_inputs_are_made_on_the_gpu_and_identical_per_seed() -> None:
    from kbrl.kernels.runner import load_module, make_inputs

    problem = get_problem("builtin/L1/5")
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"kbrl_inputs_problem_{os.getpid()}.py"
    path.write_text(problem.code)
    module = load_module(path, "kbrl_inputs_problem")
    a = make_inputs(module, 7, "cuda", "fp32")
    b = make_inputs(module, 7, "cuda", "fp32")
    c = make_inputs(module, 8, "cuda", "fp32")
    assert all(t.is_cuda for t in a)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and not torch.equal(a[0], c[0])


def test_cuda_build_is_cached(evaluator: Evaluator) -> None:
    (cand,) = [c for c in builtin_candidates(backend="cuda") if c.problem.id == "builtin/L1/4"]
    evaluator.evaluate(cand.problem, cand.text)
    again = evaluator.evaluate(cand.problem, cand.text)
    assert again.correct and again.build_cache_hit is True


def test_illegal_memory_access_is_a_runtime_error(evaluator: Evaluator) -> None:
    result = evaluator.evaluate(get_problem("builtin/L1/5"), ILLEGAL_ACCESS)
    assert result.category == Category.RUNTIME_ERROR, result.error
    after = [c for c in builtin_candidates(backend="cuda") if c.problem.id == "builtin/L1/5"][0]
    assert evaluator.evaluate(after.problem, after.text).correct  # the evaluator and the GPU carry on


def test_gpu_memory_bomb_is_a_runtime_error(evaluator: Evaluator) -> None:
    result = evaluator.evaluate(get_problem("builtin/L1/5"), GPU_BOMB)
    assert result.category == Category.RUNTIME_ERROR and "out of memory" in result.error.lower()


@pytest.mark.parametrize("stem", ["torch_only", "decoy_kernel", "output_caching", "mutates_input"])
def test_dynamic_checks_on_gpu(stem: str, tmp_path: Path) -> None:
    unchecked = Evaluator(EvalConfig(device="cuda", static_checks=False), cache_dir=tmp_path)
    text = (CORPUS / "dynamic" / f"{stem}.py").read_text()
    result = unchecked.evaluate(get_problem("builtin/L1/5"), text)
    assert result.category == Category.CHEAT, (result.category, result.error)


def test_prebuild_fills_the_cache_the_evaluation_uses(tmp_path: Path) -> None:
    """The CPU queue's `prebuild` of a CUDA candidate makes its GPU evaluation a build-cache hit."""
    from kbrl.events.store import EventStore
    from kbrl.workers.jobs import EvalJob, EvaluatorPool, evaluate_job

    problem = get_problem("builtin/L1/5")
    (candidate,) = [c for c in builtin_candidates(level=1, backend="cuda") if c.problem.id == problem.id]
    marker = f"// prebuild test {os.getpid()}\n"  # a fresh source hash: never built before on this host
    text = candidate.text.replace('cuda_sources=', f'cuda_sources={marker!r} + ', 1)
    assert text != candidate.text
    evaluator = Evaluator(EvalConfig(device="cuda", timeout_s=300), cache_dir=tmp_path / "cache")
    built = evaluator.prebuild(problem, text)
    assert built["built"] and not built["cache_hit"] and built["error"] is None, built
    again = evaluator.prebuild(problem, text)
    assert again["built"] and again["cache_hit"], again
    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    pool = EvaluatorPool(cache_dir=tmp_path / "cache")  # the GPU worker of the same host: same build cache
    job = EvalJob.for_problem("gpu-run", "s0", problem, text, "cuda", EvalConfig(device="cuda", timeout_s=300))
    event = evaluate_job(job, store, pool, worker="gpu-test")
    result = event.payload["result"]
    assert result["category"] == "CORRECT" and result["build_cache_hit"] is True, result
    print(f"prebuild {built['build_s']:.1f} s cold, {again['build_s']:.2f} s warm; "
          f"evaluation build stage {result['stage_seconds'].get('build', 0):.2f} s")

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
        assert r.timing_available and r.runtime is not None and r.runtime.n_trials == 100
        assert r.speedup_eager is not None and r.speedup_eager > 0


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

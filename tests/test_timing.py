"""Pure parts of timing and input generation (the GPU parts are in test_evaluator_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from kbrl.kernels.runner import load_module, make_inputs, median_interval
from kbrl.problems import get_problem


def test_median_interval_uses_order_statistics() -> None:
    values = [float(v) for v in range(101, 0, -1)]  # 1..101, shuffled order does not matter
    median, low, high = median_interval(values)
    # n = 101: half-width 1.96·√101/2 = 9.85 ranks → the 41st and 61st smallest values
    assert (median, low, high) == (51.0, 41.0, 61.0)
    m, lo, hi = median_interval([2.0, 1.0, 3.0])
    assert m == 2.0 and lo == 1.0 and hi == 3.0  # too few values: the interval is the whole sample


def test_median_interval_narrows_with_more_samples() -> None:
    gen = torch.Generator().manual_seed(0)
    few = (1 + 0.01 * torch.randn(50, generator=gen)).tolist()
    many = (1 + 0.01 * torch.randn(5000, generator=gen)).tolist()
    _, lo_few, hi_few = median_interval(few)
    _, lo_many, hi_many = median_interval(many)
    assert lo_few <= 1.0 + 0.01 and hi_few >= 1.0 - 0.01
    assert hi_many - lo_many < (hi_few - lo_few) / 4  # width ∝ 1/√n: 100× the samples, ~10× narrower


def test_cpu_inputs_follow_kernelbench(tmp_path: Path) -> None:
    """On the CPU nothing changes: seed, then get_inputs(), exactly as KernelBench generates them."""
    problem = get_problem("builtin/L1/4")
    (tmp_path / "problem.py").write_text(problem.code)
    module = load_module(tmp_path / "problem.py", "kbrl_timing_test_problem")
    ours = make_inputs(module, 123, "cpu", "fp32")
    torch.manual_seed(123)
    theirs = module.get_inputs()
    assert len(ours) == len(theirs) and all(torch.equal(a, b) for a, b in zip(ours, theirs))
    half = make_inputs(module, 123, "cpu", "bf16")
    assert all(t.dtype == torch.bfloat16 for t in half)

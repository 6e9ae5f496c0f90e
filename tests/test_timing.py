"""Pure parts of timing and input generation (the GPU parts are in test_evaluator_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import torch

from kbrl.kernels.runner import load_module, make_inputs, trimmed_mean_interval
from kbrl.problems import get_problem


def test_trimmed_mean_interval_by_hand() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 100.0]  # one wild value, trimmed away (int(0.2 * 5) = 1 each side)
    mean, low, high = trimmed_mean_interval(values)
    assert mean == 3.0
    # winsorized: [2, 2, 3, 4, 4], mean 3, sample variance 1.0; half = 1.96·1/((1 - 2/5)·√5)
    half = 1.96 * 1.0 / (0.6 * 5**0.5)
    assert abs(low - (3.0 - half)) < 1e-12 and abs(high - (3.0 + half)) < 1e-12


def test_trimmed_mean_resolves_below_the_timer_tick() -> None:
    """Times quantized to 32 ns ticks, true ratio 1.013: the trimmed mean of jittered ratios finds it,
    the median stays on a ratio of whole ticks."""
    gen = torch.Generator().manual_seed(0)
    tick = 0.032
    ref = 4.2 * 1.013 + 0.05 * torch.randn(4000, generator=gen)
    cand = 4.2 + 0.05 * torch.randn(4000, generator=gen)
    ratios = ((ref / tick).round() / (cand / tick).round()).tolist()
    mean, low, high = trimmed_mean_interval(ratios)
    assert low < 1.013 < high and abs(mean - 1.013) < 0.002
    assert (high - low) / 2 < 0.005 * mean  # tight enough to stop the paired timing


def test_interval_narrows_with_more_samples() -> None:
    gen = torch.Generator().manual_seed(0)
    few = (1 + 0.01 * torch.randn(50, generator=gen)).tolist()
    many = (1 + 0.01 * torch.randn(5000, generator=gen)).tolist()
    _, lo_few, hi_few = trimmed_mean_interval(few)
    _, lo_many, hi_many = trimmed_mean_interval(many)
    assert lo_few <= 1.0 <= hi_few
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

"""Returns and group-relative advantages: hand-computed values, degenerate groups, multi-turn shapes."""

from __future__ import annotations

import math

import pytest

from kbrl.training.advantages import (
    DEFAULT_GAMMA,
    discounted_returns,
    group_advantages,
    trajectory_advantages,
)


def test_discounted_returns_hand_computed() -> None:
    # R2 = 2; R1 = 0 + 0.4·2 = 0.8; R0 = 1 + 0.4·0.8 = 1.32
    assert discounted_returns([1, 0, 2], 0.4) == pytest.approx([1.32, 0.8, 2.0])
    assert DEFAULT_GAMMA == 0.4
    assert discounted_returns([1, 0, 2]) == discounted_returns([1, 0, 2], 0.4)


def test_discounted_returns_edge_cases() -> None:
    assert discounted_returns([0.7]) == [0.7]  # single turn: the return is the score
    assert discounted_returns([]) == []
    assert discounted_returns([1, 2, 3], 0.0) == [1.0, 2.0, 3.0]  # γ = 0: each turn on its own
    assert discounted_returns([1, 2, 3], 1.0) == [6.0, 5.0, 3.0]  # γ = 1: plain suffix sums
    # negative scores (cheat penalty) propagate back: R1 = -1; R0 = 0.5 + 0.4·(-1) = 0.1
    assert discounted_returns([0.5, -1.0], 0.4) == pytest.approx([0.1, -1.0])


@pytest.mark.parametrize("gamma", [-0.1, 1.5, math.nan])
def test_discounted_returns_rejects_bad_gamma(gamma: float) -> None:
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns([1.0], gamma)


def test_non_finite_scores_are_rejected() -> None:
    with pytest.raises(ValueError, match="score 1 is not a finite number"):
        discounted_returns([1.0, math.nan])
    with pytest.raises(ValueError, match="reward 0 is not a finite number"):
        group_advantages([math.inf, 1.0])


def test_group_advantages_mean_centred() -> None:
    # mean (1 + 2 + 3 + 6) / 4 = 3 → [-2, -1, 0, 3]
    assert group_advantages([1, 2, 3, 6]) == [-2.0, -1.0, 0.0, 3.0]


def test_group_advantages_std_normalised() -> None:
    # centred [-2, -1, 0, 3]; population variance (4 + 1 + 0 + 9) / 4 = 3.5; std = √3.5 ≈ 1.870829
    # → [-2/1.870829, -1/1.870829, 0, 3/1.870829] ≈ [-1.069045, -0.534522, 0, 1.603567]
    std = math.sqrt(3.5)
    adv = group_advantages([1, 2, 3, 6], normalize_std=True)
    assert adv == pytest.approx([-2 / std, -1 / std, 0.0, 3 / std])
    assert adv == pytest.approx([-1.069045, -0.534522, 0.0, 1.603567], abs=1e-6)
    # unit RMS: Σ A² / n = 1
    assert sum(a * a for a in adv) / 4 == pytest.approx(1.0)


@pytest.mark.parametrize("normalize_std", [False, True])
def test_zero_variance_and_singleton_groups_give_exact_zeros(normalize_std: bool) -> None:
    assert group_advantages([0.1, 0.1, 0.1], normalize_std=normalize_std) == [0.0, 0.0, 0.0]
    assert group_advantages([-1.0, -1.0], normalize_std=normalize_std) == [0.0, 0.0]
    assert group_advantages([0.8], normalize_std=normalize_std) == [0.0]
    assert group_advantages([], normalize_std=normalize_std) == []


def test_near_zero_std_is_floored_at_eps() -> None:
    # centred ±5e-8, std 5e-8 < eps 1e-6 → divided by 1e-6, not by 5e-8: ±0.05, not ±1
    adv = group_advantages([1.0, 1.0 + 1e-7], normalize_std=True, eps=1e-6)
    assert adv == pytest.approx([-0.05, 0.05], rel=1e-6)


def test_trajectory_advantages_single_turn_is_group_advantages() -> None:
    # T = 1: returns are the scores; group [1, 2, 3, 6] → [-2, -1, 0, 3]
    assert trajectory_advantages([[[1.0], [2.0], [3.0], [6.0]]]) == [[[-2.0], [-1.0], [0.0], [3.0]]]


def test_trajectory_advantages_per_turn_hand_computed() -> None:
    # Two trajectories of the same problem, γ = 0.4:
    #   a: scores [1, 0, 2] → returns [1.32, 0.8, 2.0]
    #   b: scores [0, 1, 0] → returns [0 + 0.4·1, 1, 0] = [0.4, 1.0, 0.0]
    # turn 0: mean (1.32 + 0.4) / 2 = 0.86 → [0.46, -0.46]
    # turn 1: mean (0.8 + 1.0) / 2 = 0.9  → [-0.1, 0.1]
    # turn 2: mean (2.0 + 0.0) / 2 = 1.0  → [1.0, -1.0]
    # A second group (one trajectory): every advantage 0.
    out = trajectory_advantages([[[1, 0, 2], [0, 1, 0]], [[0.3, 0.9]]], gamma=0.4)
    assert len(out) == 2
    assert out[0][0] == pytest.approx([0.46, -0.1, 1.0])
    assert out[0][1] == pytest.approx([-0.46, 0.1, -1.0])
    assert out[1] == [[0.0, 0.0]]


def test_trajectory_advantages_uneven_lengths() -> None:
    # a ends after turn 0 (solved); b and c go on.
    #   returns (γ = 0.5): a [1.0]; b [0 + 0.5·1, 1] = [0.5, 1.0]; c [0 + 0.5·0, 0] = [0.0, 0.0]
    # turn 0 over a, b, c: mean 0.5 → [0.5, 0.0, -0.5]
    # turn 1 over b, c only: mean 0.5 → [0.5, -0.5]
    out = trajectory_advantages([[[1.0], [0.0, 1.0], [0.0, 0.0]]], gamma=0.5)
    assert out == [[[0.5], [0.0, 0.5], [-0.5, -0.5]]]


def test_trajectory_advantages_std_normalised() -> None:
    # turn 0 returns [1, 3] (γ = 0): centred [-1, 1], population std 1 → [-1, 1]
    # turn 1 returns [2, 2]: zero variance → [0, 0]
    out = trajectory_advantages([[[1.0, 2.0], [3.0, 2.0]]], gamma=0.0, normalize_std=True)
    assert out == [[[-1.0, 0.0], [1.0, 0.0]]]


def test_advantages_are_deterministic_on_replay() -> None:
    groups = [[[0.1 * i + 0.01 * t for t in range(4)] for i in range(8)] for _ in range(3)]
    first = trajectory_advantages(groups, normalize_std=True)
    assert first == trajectory_advantages(groups, normalize_std=True)  # bit-identical, not approx
    assert [[len(traj) for traj in g] for g in first] == [[4] * 8] * 3


def test_all_turns_baseline_pools_every_turn_of_the_group() -> None:
    # traj a: scores (0, 1) → returns (0 + 0.4·1, 1) = (0.4, 1.0); traj b (stopped after one turn): (1) → (1.0)
    # pooled returns 0.4, 1.0, 1.0: mean 0.8 → advantages a (-0.4, 0.2), b (0.2)
    (group,) = trajectory_advantages([[[0.0, 1.0], [1.0]]], gamma=0.4, baseline="all_turns")
    assert group[0] == pytest.approx([-0.4, 0.2]) and group[1] == pytest.approx([0.2])
    # The per-turn baseline on the same group: turn 0 mean(0.4, 1.0) = 0.7 → (-0.3, 0.3); turn 1 has only a → 0
    (per_turn,) = trajectory_advantages([[[0.0, 1.0], [1.0]]], gamma=0.4)
    assert per_turn[0] == pytest.approx([-0.3, 0.0]) and per_turn[1] == pytest.approx([0.3])
    with pytest.raises(ValueError, match="unknown advantage baseline"):
        trajectory_advantages([[[1.0]]], baseline="per_group")

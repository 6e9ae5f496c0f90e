"""Returns and group-relative advantages for GRPO, single- and multi-turn.

Plain Python floats in a fixed order of operations (means by `math.fsum`, which rounds correctly and so does
not depend on summation order), so a replay recomputes exactly the advantages the live update used.

Single-turn is the T = 1 case of multi-turn: one score per trajectory, its return is the score, and the
advantage is the score minus the group mean.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DEFAULT_GAMMA = 0.4
"""Discount of later turns' scores in multi-turn ("Kevin") mode."""


def discounted_returns(scores: Sequence[float], gamma: float = DEFAULT_GAMMA) -> list[float]:
    """R_t = s_t + γ s_{t+1} + γ² s_{t+2} + … for each turn t of one trajectory.

    A turn is credited with what its kernel and feedback led to later: a turn that sets up a later success
    earns part of it. Computed backwards, R_t = s_t + γ R_{t+1}.
    """
    if isinstance(gamma, bool) or not (math.isfinite(gamma) and 0.0 <= gamma <= 1.0):
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    _check_finite(scores, "score")
    returns = [0.0] * len(scores)
    running = 0.0
    for t in range(len(scores) - 1, -1, -1):
        running = float(scores[t]) + gamma * running
        returns[t] = running
    return returns


def group_advantages(rewards: Sequence[float], normalize_std: bool = False, eps: float = 1e-6) -> list[float]:
    """A_i = r_i - mean(r) over one group (samples of the same prompt); optionally divided by the std.

    The std is the population std (divide by n, not n - 1): the group is the whole set being compared, not
    a sample of a larger one, the result has unit RMS, and it is defined for n = 1. It is floored at `eps`
    (A_i / max(std, eps)) so near-identical rewards are not blown up into large advantages.
    A group whose rewards are all equal (including a group of one) gets exact zeros: nothing to learn from
    it, and no NaN.
    """
    _check_finite(rewards, "reward")
    if eps <= 0 or not math.isfinite(eps):
        raise ValueError(f"eps must be a finite number > 0, got {eps!r}")
    values = [float(r) for r in rewards]
    if not values or all(v == values[0] for v in values):
        return [0.0] * len(values)
    n = len(values)
    mean = math.fsum(values) / n
    centred = [v - mean for v in values]
    if not normalize_std:
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / n)
    scale = max(std, eps)
    return [c / scale for c in centred]


def trajectory_advantages(
    groups: Sequence[Sequence[Sequence[float]]],
    gamma: float = DEFAULT_GAMMA,
    normalize_std: bool = False,
    eps: float = 1e-6,
    baseline: str = "per_turn",
) -> list[list[list[float]]]:
    """Per-turn advantages for groups of trajectories: `groups[g][i][t]` is the score of turn t of
    trajectory i in group g (one group = the trajectories started from the same problem); the result has
    the same shape.

    Each trajectory's scores become discounted returns (`discounted_returns`); then, for each turn index t,
    the returns at turn t of the group's trajectories are made group-relative (`group_advantages`), as
    Kevin does: turn t's return is compared with the other trajectories' turn t, not with earlier or later
    turns, whose returns differ systematically (turn 0 sums more discounted terms; later turns start from
    a better kernel). A trajectory that ended early (e.g. solved) takes no part in later turn indices;
    a turn index only one trajectory reached gets advantage 0.

    Default: mean-centred only, not divided by the std (as the Tinker cookbook and Dr. GRPO do): dividing
    by the std weights near-uniform groups (too easy or too hard problems) as much as informative ones and
    makes the scale of a group's update depend on how spread its rewards happen to be. `normalize_std=True`
    gives the std-normalised GRPO variant.

    `baseline="all_turns"` instead pools the returns of every turn of the group's trajectories into one
    baseline: simpler, but it rewards turn 0 for the discounted future it carries and penalises late turns
    of long (struggling) trajectories, which the per-turn baseline avoids.
    """
    if baseline not in BASELINES:
        raise ValueError(f"unknown advantage baseline {baseline!r}; choose one of {', '.join(BASELINES)}")
    result: list[list[list[float]]] = []
    for group in groups:
        returns = [discounted_returns(traj, gamma) for traj in group]
        if baseline == "all_turns":
            # One baseline for every turn of every trajectory of the group (the returns pooled).
            flat = group_advantages([x for r in returns for x in r], normalize_std=normalize_std, eps=eps)
            it = iter(flat)
            result.append([[next(it) for _ in r] for r in returns])
            continue
        advantages = [[0.0] * len(r) for r in returns]
        n_turns = max((len(r) for r in returns), default=0)
        for t in range(n_turns):
            members = [i for i, r in enumerate(returns) if len(r) > t]
            adv = group_advantages([returns[i][t] for i in members], normalize_std=normalize_std, eps=eps)
            for i, a in zip(members, adv, strict=True):
                advantages[i][t] = a
        result.append(advantages)
    return result


def _check_finite(values: Sequence[float], what: str) -> None:
    for i, v in enumerate(values):
        if isinstance(v, bool) or not math.isfinite(v):
            raise ValueError(f"{what} {i} is not a finite number: {v!r}")


BASELINES = ("per_turn", "all_turns")
"""Where the group baseline of multi-turn advantages is taken: per turn index, or over all turns."""

__all__ = ["BASELINES", "DEFAULT_GAMMA", "discounted_returns", "group_advantages", "trajectory_advantages"]

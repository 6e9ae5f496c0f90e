"""Reward of one evaluated kernel: weighted format / compile / correctness / speed terms, or a cheat penalty.

Pure functions of an `EvalResult` (or its `to_dict()` form, as `KernelEvaluated` events store it) and a
`RewardWeights`, so replay recomputes the reward used live bit for bit, and a what-if replay can rescore the
same events with other weights.

Terms (each in [0, 1] before weighting):
* format      = `format_ok` (the reply held one extractable kernel of the right backend).
* compile     = `compiled`.
* correctness = 1 only for category CORRECT with `correct` set. Binary, not `n_correct / n_trials`: a kernel
  right on some seeds only (races, shape bugs) is wrong, as KernelBench and fast_p count it; partial credit
  would pay the policy for flaky kernels. UNVERIFIED (compiled, but this host could not run it) and a kernel
  that passed the checks but then failed while being timed (RUNTIME_ERROR / TIMEOUT) are not correct.
* speed       = only for correct kernels: `(clip(log2(speedup), lo, hi) - lo) / (hi - lo)` with the
  defaults lo = -3, hi = 3, i.e. 1/8× → 0, 1× → 0.5, 2× → 2/3, ≥ 8× → 1. The log makes a doubling worth
  the same at any speed, and the clip bounds one lucky (or mismeasured) outlier: a 100× kernel scores the
  same as an 8× one, so it cannot swamp the group's advantages. KernelBench flags > 10× as suspicious.
  A correct kernel without a usable speedup (no timing, e.g. CPU; NaN / ±inf / ≤ 0 / missing) gets
  speed 0 and `speed_missing=True`.

Category CHEAT overrides everything: total = -cheat_penalty, every other term 0.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from kbrl.kernels.result import Category, EvalResult

SpeedBaseline = Literal["eager", "compile"]


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the reward terms, the cheat penalty and the speed shaping; defaults are stage 1.

    `measure_performance` is carried along because it belongs to the same curriculum stage: timing costs GPU
    time and is only worth paying when the speed term counts (stage 3).
    """

    format: float = 0.3
    compile: float = 0.5
    correctness: float = 0.2
    speed: float = 0.0
    cheat_penalty: float = 1.0
    speed_log2_min: float = -3.0
    """log2(speedup) at or below which the speed term is 0 (default 1/8×)."""
    speed_log2_max: float = 3.0
    """log2(speedup) at or above which the speed term is 1 (default 8×)."""
    speed_baseline: SpeedBaseline = "eager"
    """Which speedup to reward: vs the eager reference (`speedup_eager`) or torch.compile (`speedup_compile`)."""
    measure_performance: bool = False

    def __post_init__(self) -> None:
        for name in ("format", "compile", "correctness", "speed", "cheat_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"reward weight {name} must be a finite number >= 0, got {value!r}")
        for name in ("speed_log2_min", "speed_log2_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not self.speed_log2_min < self.speed_log2_max:
            raise ValueError(f"speed_log2_min ({self.speed_log2_min}) must be below speed_log2_max ({self.speed_log2_max})")
        if self.speed_baseline not in ("eager", "compile"):
            raise ValueError(f"speed_baseline must be 'eager' or 'compile', got {self.speed_baseline!r}")
        if not isinstance(self.measure_performance, bool):
            raise ValueError(f"measure_performance must be a bool, got {self.measure_performance!r}")

    def as_config(self) -> dict[str, Any]:
        """The config keys (`reward_*_weight`, …) that `from_config` reads back into these weights."""
        return {key: getattr(self, attr) for key, attr in CONFIG_KEYS.items()}


CONFIG_KEYS: dict[str, str] = {
    "reward_format_weight": "format",
    "reward_compile_weight": "compile",
    "reward_correctness_weight": "correctness",
    "reward_speed_weight": "speed",
    "reward_cheat_penalty": "cheat_penalty",
    "reward_speed_log2_min": "speed_log2_min",
    "reward_speed_log2_max": "speed_log2_max",
    "reward_speed_baseline": "speed_baseline",
    "measure_performance": "measure_performance",
}
"""Config key (the seed's names, under `dataset_builder.`) -> `RewardWeights` field."""

_CONFIG_PREFIX = "dataset_builder."

PRESETS: dict[str, RewardWeights] = {
    # Stage 1: learn the format and to write kernels that build.
    "stage1": RewardWeights(format=0.3, compile=0.5, correctness=0.2, speed=0.0),
    # Stage 2: correctness dominates.
    "stage2": RewardWeights(format=0.1, compile=0.2, correctness=0.7, speed=0.0),
    # Stage 3: speed. The 0.15 left beside correctness 0.5 and speed 0.35 goes 0.05 to format and 0.10 to
    # compile: the policy formats reliably by now, while build failures stay the commonest failure, so
    # compile keeps the larger share of the gradient toward kernels that build.
    "stage3": RewardWeights(format=0.05, compile=0.10, correctness=0.5, speed=0.35, measure_performance=True),
}
"""The seed project's three curriculum stages."""


def preset(name_or_stage: str | int) -> RewardWeights:
    """The weights of a curriculum stage: 1, 2, 3, "3", "stage3" (also "stage_3", "stage-3", "Stage 3")."""
    if isinstance(name_or_stage, bool):
        raise ValueError(f"unknown reward preset {name_or_stage!r}; valid: {', '.join(PRESETS)}")
    key = str(name_or_stage).strip().lower().replace("_", "").replace("-", "").replace(" ", "")
    if key.isdigit():
        key = f"stage{key}"
    try:
        return PRESETS[key]
    except KeyError:
        raise ValueError(
            f"unknown reward preset {name_or_stage!r}; did you mean {_closest(key, PRESETS)!r}? "
            f"valid: {', '.join(PRESETS)}"
        ) from None


def from_config(config: Mapping[str, Any], base: RewardWeights | None = None) -> RewardWeights:
    """Weights from config keys (`reward_format_weight`, … optionally prefixed `dataset_builder.`).

    Keys not given keep their value in `base` (default: `RewardWeights()`, i.e. stage 1). Any other key is an
    error naming the closest valid key, so a typo cannot silently leave a weight at its default.
    """
    values: dict[str, Any] = {}
    for raw_key, value in config.items():
        key = raw_key.removeprefix(_CONFIG_PREFIX) if isinstance(raw_key, str) else raw_key
        attr = CONFIG_KEYS.get(key) if isinstance(key, str) else None
        if attr is None:
            raise ValueError(
                f"unknown reward config key {raw_key!r}; did you mean {_closest(str(key), CONFIG_KEYS)!r}? "
                f"valid: {', '.join(CONFIG_KEYS)}"
            )
        values[attr] = _coerce(raw_key, attr, value)
    return replace(base if base is not None else RewardWeights(), **values)


def _closest(word: str, choices: Mapping[str, Any]) -> str:
    return difflib.get_close_matches(word, list(choices), n=1, cutoff=0.0)[0]


def _coerce(key: str, attr: str, value: Any) -> Any:
    """Config values may arrive as YAML scalars or as strings from `key=value` overrides."""
    if attr == "speed_baseline":
        return str(value).strip().lower()
    if attr == "measure_performance":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{key} must be true or false, got {value!r}")
    if isinstance(value, bool):
        raise ValueError(f"{key} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a number, got {value!r}") from None


@dataclass(frozen=True)
class RewardBreakdown:
    """One reward and its weighted terms; `total` is their sum, in this field order (dashboards show each)."""

    total: float
    format: float
    compile: float
    correctness: float
    speed: float
    penalty: float
    """-cheat_penalty for a CHEAT, else 0."""
    category: str
    correct: bool
    speedup: float | None
    """The speedup the speed term used (vs `speed_baseline`), None where missing or not finite."""
    speed_shaped: float
    """The speed term before its weight, in [0, 1]; 0 when it did not count."""
    speed_missing: bool
    """A correct kernel had no usable speedup, so its speed term is 0 (timing off, CPU host, NaN)."""
    cheat: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def score(result: Mapping[str, Any] | EvalResult, weights: RewardWeights) -> RewardBreakdown:
    """The reward of one evaluated kernel under `weights` (see the module docstring for the terms)."""
    data = _Fields.of(result, weights.speed_baseline)
    cheat = data.category is Category.CHEAT
    correct = not cheat and data.correct and data.category is Category.CORRECT
    speedup = data.speedup
    shaped = shape_speedup(speedup, weights) if correct and speedup is not None else 0.0
    fmt = 0.0 if cheat else weights.format * float(data.format_ok)
    comp = 0.0 if cheat else weights.compile * float(data.compiled)
    corr = weights.correctness * float(correct)
    speed = weights.speed * shaped
    penalty = -weights.cheat_penalty if cheat else 0.0
    return RewardBreakdown(
        total=fmt + comp + corr + speed + penalty,
        format=fmt,
        compile=comp,
        correctness=corr,
        speed=speed,
        penalty=penalty,
        category=str(data.category),
        correct=correct,
        speedup=speedup,
        speed_shaped=shaped,
        speed_missing=correct and speedup is None,
        cheat=cheat,
    )


def shape_speedup(speedup: float, weights: RewardWeights) -> float:
    """`(clip(log2(speedup), lo, hi) - lo) / (hi - lo)`: in [0, 1], flat beyond the clip bounds."""
    lo, hi = weights.speed_log2_min, weights.speed_log2_max
    clipped = min(max(math.log2(speedup), lo), hi)
    return (clipped - lo) / (hi - lo)


def finite_speedup(value: Any) -> float | None:
    """A usable speedup or None: events store NaN/inf as strings ("NaN", "Infinity"); those, ≤ 0 and
    anything that is not a number count as missing."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


@dataclass(frozen=True)
class _Fields:
    """The few result fields the reward reads, from either form of the result."""

    category: Category
    format_ok: bool
    compiled: bool
    correct: bool
    speedup: float | None

    @classmethod
    def of(cls, result: Mapping[str, Any] | EvalResult, baseline: SpeedBaseline) -> _Fields:
        speed_key = f"speedup_{baseline}"
        if isinstance(result, EvalResult):
            result = {k: getattr(result, k) for k in ("category", "format_ok", "compiled", "correct", speed_key)}
        elif not isinstance(result, Mapping):
            raise TypeError(f"score() takes an EvalResult or its to_dict() form, got {type(result).__name__}")
        if result.get("category") is None:
            raise ValueError("evaluation result has no 'category'")
        return cls(
            category=Category(result["category"]),
            format_ok=bool(result.get("format_ok", False)),
            compiled=bool(result.get("compiled", False)),
            correct=bool(result.get("correct", False)),
            speedup=finite_speedup(result.get(speed_key)),
        )


__all__ = [
    "CONFIG_KEYS",
    "PRESETS",
    "RewardBreakdown",
    "RewardWeights",
    "finite_speedup",
    "from_config",
    "preset",
    "score",
    "shape_speedup",
]

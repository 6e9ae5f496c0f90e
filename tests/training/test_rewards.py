"""Rewards: hand-computed values for each term, the cheat penalty, speed shaping, presets and config keys."""

from __future__ import annotations

import math
from typing import Any

import pytest

from kbrl.kernels.result import Category, EvalResult
from kbrl.training.rewards import (
    PRESETS,
    RewardWeights,
    finite_speedup,
    from_config,
    preset,
    score,
    shape_speedup,
)

STAGE3 = preset(3)


def correct_result(speedup: Any = 2.0, **extra: Any) -> dict[str, Any]:
    """A correct kernel's `to_dict()` form, as a KernelEvaluated event stores it."""
    result = EvalResult(
        problem_id="level1/1", category=Category.CORRECT, format_ok=True, compiled=True, correct=True,
        n_correct=5, n_trials=5, timing_available=True,
    ).to_dict()
    result["speedup_eager"] = speedup
    result.update(extra)
    return result


# --- presets and weights ---------------------------------------------------------------------------


def test_stage_presets_have_the_seed_weights() -> None:
    s1, s2, s3 = preset(1), preset("stage2"), preset("Stage 3")
    assert (s1.format, s1.compile, s1.correctness, s1.speed, s1.measure_performance) == (0.3, 0.5, 0.2, 0.0, False)
    assert (s2.format, s2.compile, s2.correctness, s2.speed, s2.measure_performance) == (0.1, 0.2, 0.7, 0.0, False)
    assert (s3.format, s3.compile, s3.correctness, s3.speed, s3.measure_performance) == (0.05, 0.10, 0.5, 0.35, True)
    for weights in PRESETS.values():  # each stage's weights sum to 1
        assert weights.format + weights.compile + weights.correctness + weights.speed == pytest.approx(1.0)
    assert preset("3") is preset("stage_3") is PRESETS["stage3"]
    assert RewardWeights() == preset(1)  # the defaults are stage 1


def test_unknown_preset_names_the_closest() -> None:
    with pytest.raises(ValueError, match="did you mean 'stage2'"):
        preset("stag2")
    with pytest.raises(ValueError, match="unknown reward preset 4"):
        preset(4)


def test_weights_are_validated() -> None:
    with pytest.raises(ValueError, match="speed must be a finite number >= 0"):
        RewardWeights(speed=-0.1)
    with pytest.raises(ValueError, match="cheat_penalty"):
        RewardWeights(cheat_penalty=math.nan)
    with pytest.raises(ValueError, match="must be below"):
        RewardWeights(speed_log2_min=2.0, speed_log2_max=2.0)
    with pytest.raises(ValueError, match="speed_baseline"):
        RewardWeights(speed_baseline="inductor")  # type: ignore[arg-type]


def test_from_config_reads_the_seed_keys_over_a_base() -> None:
    weights = from_config(
        {"reward_format_weight": 0.1, "dataset_builder.reward_compile_weight": "0.2",
         "reward_correctness_weight": 0.4, "reward_speed_weight": 0.3, "measure_performance": "true"}
    )
    assert (weights.format, weights.compile, weights.correctness, weights.speed) == (0.1, 0.2, 0.4, 0.3)
    assert weights.measure_performance is True
    assert weights.cheat_penalty == 1.0  # not given: kept from the base (stage 1 defaults)
    # Partial config over stage 3 changes only the key given.
    assert from_config({"reward_speed_weight": 0.5}, base=STAGE3) == RewardWeights(
        format=0.05, compile=0.10, correctness=0.5, speed=0.5, measure_performance=True
    )
    assert from_config(STAGE3.as_config()) == STAGE3  # round trip


def test_from_config_unknown_key_names_the_closest_valid_key() -> None:
    with pytest.raises(ValueError, match=r"unknown reward config key 'reward_sped_weight'; did you mean 'reward_speed_weight'"):
        from_config({"reward_sped_weight": 0.3})
    with pytest.raises(ValueError, match="did you mean 'reward_correctness_weight'"):
        from_config({"dataset_builder.reward_correct_weight": 0.3})
    with pytest.raises(ValueError, match="reward_format_weight must be a number"):
        from_config({"reward_format_weight": True})
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        from_config({"reward_format_weight": "-1"})


# --- the terms -------------------------------------------------------------------------------------


def test_stage1_compiled_but_wrong() -> None:
    result = EvalResult(problem_id="p", category=Category.CORRECTNESS_ERROR, format_ok=True, compiled=True,
                        n_correct=3, n_trials=5)
    r = score(result, preset(1))
    # format 0.3·1 + compile 0.5·1 + correctness 0.2·0 (3/5 trials is not correct: binary) = 0.8
    assert (r.format, r.compile, r.correctness, r.speed, r.penalty) == (0.3, 0.5, 0.0, 0.0, 0.0)
    assert r.total == pytest.approx(0.8)
    assert r.correct is False and r.speed_missing is False and r.category == "CORRECTNESS_ERROR"


def test_stage3_correct_kernel_at_2x() -> None:
    r = score(correct_result(2.0), STAGE3)
    # speed shaped = (clip(log2 2, -3, 3) + 3) / 6 = (1 + 3) / 6 = 2/3; weighted 0.35 · 2/3 = 0.2333…
    # total = 0.05 + 0.10 + 0.5 + 0.2333… = 0.8833…
    assert r.speed_shaped == pytest.approx(2 / 3)
    assert r.speed == pytest.approx(0.35 * 2 / 3)
    assert r.total == pytest.approx(0.05 + 0.10 + 0.5 + 0.35 * 2 / 3)
    assert r.total == r.format + r.compile + r.correctness + r.speed + r.penalty
    assert r.speedup == 2.0 and r.correct is True


@pytest.mark.parametrize(
    ("speedup", "shaped"),
    [
        (1.0, 0.5),  # log2 1 = 0 → (0 + 3) / 6
        (0.5, 1 / 3),  # log2 0.5 = -1 → (-1 + 3) / 6
        (0.125, 0.0),  # log2 1/8 = -3 → floor
        (0.01, 0.0),  # below the floor: clipped to -3
        (8.0, 1.0),  # log2 8 = 3 → ceiling
    ],
)
def test_speed_shaping_values(speedup: float, shaped: float) -> None:
    assert shape_speedup(speedup, STAGE3) == pytest.approx(shaped)


def test_speed_outlier_is_clipped_to_the_ceiling() -> None:
    lucky, ceiling = score(correct_result(100.0), STAGE3), score(correct_result(8.0), STAGE3)
    # log2 100 ≈ 6.64 → clipped to 3, the same as 8×: speed term 0.35 · 1 = 0.35 for both
    assert lucky.speed_shaped == ceiling.speed_shaped == 1.0
    assert lucky.speed == ceiling.speed == 0.35
    assert lucky.total == ceiling.total
    assert lucky.speedup == 100.0  # the raw value is still reported


def test_speed_ignored_for_incorrect_kernels() -> None:
    wrong = correct_result(4.0, category="CORRECTNESS_ERROR", correct=False, n_correct=4)
    r = score(wrong, STAGE3)
    # 0.05 + 0.10, no correctness, no speed although a speedup of 4× is present
    assert (r.correctness, r.speed, r.speed_shaped) == (0.0, 0.0, 0.0)
    assert r.total == pytest.approx(0.15)
    assert r.speed_missing is False  # speed did not count, so nothing is missing


def test_correct_flag_but_failed_while_timing_is_not_correct() -> None:
    r = score(correct_result(None, category="RUNTIME_ERROR"), STAGE3)
    assert r.correct is False and r.correctness == 0.0
    assert r.total == pytest.approx(0.15)


def test_unverified_counts_as_not_correct() -> None:
    result = EvalResult(problem_id="p", category=Category.UNVERIFIED, format_ok=True, compiled=True,
                        correct=True)  # even if a buggy writer set `correct`
    r = score(result, preset(2))
    # format 0.1 + compile 0.2 = 0.3
    assert r.correct is False and r.correctness == 0.0
    assert r.total == pytest.approx(0.3)


def test_cheat_gets_minus_the_penalty_regardless_of_other_terms() -> None:
    cheat = correct_result(50.0, category="CHEAT", cheat_flags=[{"name": "x", "reason": "y", "severity": "error"}])
    r = score(cheat, STAGE3)
    assert r.total == -1.0 and r.penalty == -1.0 and r.cheat is True
    assert (r.format, r.compile, r.correctness, r.speed) == (0.0, 0.0, 0.0, 0.0)
    assert score(cheat, RewardWeights(cheat_penalty=2.5)).total == -2.5
    assert score(cheat, RewardWeights(cheat_penalty=0.0)).total == 0.0


@pytest.mark.parametrize("missing", [None, "NaN", "Infinity", "-Infinity", float("nan"), float("inf"), 0.0, -2.0])
def test_missing_or_non_finite_speedup_gives_speed_zero_and_a_flag(missing: Any) -> None:
    r = score(correct_result(missing), STAGE3)
    # 0.05 + 0.10 + 0.5, speed 0
    assert r.speed == 0.0 and r.speedup is None and r.speed_missing is True
    assert r.total == pytest.approx(0.65)
    assert r.correct is True


def test_object_and_dict_forms_score_the_same() -> None:
    obj = EvalResult(problem_id="p", category=Category.CORRECT, format_ok=True, compiled=True, correct=True,
                     speedup_eager=1.5, speedup_compile=0.75)
    assert score(obj, STAGE3) == score(obj.to_dict(), STAGE3)
    compile_baseline = RewardWeights(speed=1.0, speed_baseline="compile")
    # vs torch.compile: log2 0.75 ≈ -0.415 → (3 - 0.415) / 6 ≈ 0.4308
    assert score(obj, compile_baseline).speed_shaped == pytest.approx((math.log2(0.75) + 3) / 6)
    assert score(obj, compile_baseline).speedup == 0.75


def test_breakdown_to_dict_has_every_term() -> None:
    d = score(correct_result(2.0), STAGE3).to_dict()
    assert {"total", "format", "compile", "correctness", "speed", "penalty", "speed_missing", "cheat"} <= set(d)


def test_finite_speedup_parses_event_strings() -> None:
    assert finite_speedup("1.25") == 1.25
    assert finite_speedup("NaN") is None
    assert finite_speedup(True) is None
    assert finite_speedup("fast") is None


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="no 'category'"):
        score({"format_ok": True}, STAGE3)
    with pytest.raises(ValueError):
        score({"category": "SOMETHING"}, STAGE3)
    with pytest.raises(TypeError, match="EvalResult or its to_dict"):
        score(3, STAGE3)  # type: ignore[arg-type]

"""Training config: packaged YAML, key=value overrides with YAML types, errors that name the closest key,
reward weights from the stage presets, and the round trip through the run record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kbrl.config import (
    CONFIG_DIR,
    ConfigError,
    TrainConfig,
    config_to_dict,
    dump_yaml,
    load_config,
    packaged_configs,
    valid_keys,
)
from kbrl.training.rewards import RewardWeights, preset


def _flat(data: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in data.items():
        keys.extend(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"])
    return keys


def test_default_yaml_states_every_key_with_the_model_default_and_a_comment() -> None:
    assert load_config() == TrainConfig()
    text = (CONFIG_DIR / "default.yaml").read_text()
    assert _flat(yaml.safe_load(text)) == valid_keys()
    key_lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    uncommented = [line for line in key_lines if "#" not in line and not line.rstrip().endswith(":")]
    assert uncommented == []


def test_packaged_configs_by_name_and_by_path() -> None:
    assert packaged_configs() == ["default", "rl_kernelbench_kevin", "stage1", "stage2", "stage3", "tiny_cpu"]
    for name in packaged_configs():
        assert load_config(name) == load_config(CONFIG_DIR / f"{name}.yaml") == load_config(f"{name}.yaml")
    tiny = load_config("tiny_cpu")
    assert (tiny.backend, tiny.model_name, tiny.eval_device, tiny.level) == ("local", "tiny", "cpu", 1)
    assert (tiny.n_steps, tiny.batch_size, tiny.group_size, tiny.lora_rank, tiny.eval_n_trials) == (3, 2, 4, 8, 2)
    stage3 = load_config("stage3")
    assert stage3.dataset_builder.reward_stage == 3 and stage3.dataset_builder.measure_performance is True
    assert load_config("stage2").dataset_builder.reward_stage == 2


def test_overrides_are_parsed_as_yaml_with_text_settings_kept_as_text() -> None:
    cfg = load_config("stage2", ["group_size=16", "level=null", "problem_ids=[builtin/L1/1,builtin/L1/2]",
                                 "temperature=0.7", "learning_rate=1e-5", "tensorboard_enabled=false",
                                 "run_id=007", "model_name=Qwen/Qwen3-8B", "mode=multi_turn"])  # fmt: skip
    assert cfg.group_size == 16 and isinstance(cfg.group_size, int)
    assert cfg.level is None and cfg.problem_ids == ["builtin/L1/1", "builtin/L1/2"]
    assert cfg.temperature == 0.7 and cfg.learning_rate == 1e-5 and cfg.tensorboard_enabled is False
    assert cfg.run_id == "007" and cfg.model_name == "Qwen/Qwen3-8B" and cfg.mode == "multi_turn"
    assert cfg.dataset_builder.reward_stage == 2  # the file's value survives overrides of other keys
    assert load_config(None, ["n_steps=3", "n_steps=9"]).n_steps == 9  # the last override wins
    assert load_config("tiny_cpu", ["n_steps=7"]).n_steps == 7  # an override beats the file


def test_nested_dotted_overrides_merge_into_their_section() -> None:
    cfg = load_config("stage3", ["dataset_builder.reward_speed_weight=0.4", "adam.beta2=0.99",
                                 "dataset_builder.prompt_option=raicl", "adam={eps: 1.0e-6}"])  # fmt: skip
    assert cfg.adam.beta2 == 0.99 and cfg.adam.eps == 1e-6 and cfg.adam.beta1 == 0.9
    assert cfg.dataset_builder.reward_speed_weight == 0.4 and cfg.dataset_builder.prompt_option == "raicl"
    assert cfg.dataset_builder.reward_stage == 3 and cfg.dataset_builder.measure_performance is True


@pytest.mark.parametrize(("override", "closest"), [
    ("grup_size=4", "group_size"),
    ("dataset_builder.reward_sped_weight=0.1", "dataset_builder.reward_speed_weight"),
    ("adam.weight_decy=0.1", "adam.weight_decay"),
    ("beta2=0.9", "adam.beta2"),  # the right name in the wrong place
    ("reward_speed_weight=0.3", "dataset_builder.reward_speed_weight"),
    ("model_name.revision=main", "model_name"),
])  # fmt: skip
def test_unknown_override_names_the_closest_key(override: str, closest: str) -> None:
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=f"unknown config key '{key}'; did you mean '{closest}'\\?"):
        load_config(None, [override])


def test_unknown_key_in_a_file_names_the_closest_key_and_the_file(tmp_path: Path) -> None:
    top = tmp_path / "top.yaml"
    top.write_text("learning_rat: 0.1\n")
    with pytest.raises(ConfigError, match=r"'learning_rat'; did you mean 'learning_rate'\?.*top\.yaml"):
        load_config(top)
    nested = tmp_path / "nested.yaml"
    nested.write_text("dataset_builder:\n  reward_sped_weight: 0.3\n")
    with pytest.raises(ConfigError, match="did you mean 'dataset_builder.reward_speed_weight'"):
        load_config(nested)
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        TrainConfig.model_validate({"grup_size": 4})  # the model itself forbids them too


@pytest.mark.parametrize(("override", "key"), [
    ("gamma=1.5", "gamma"),
    ("gamma=-0.1", "gamma"),
    ("group_size=1", "group_size"),
    ("batch_size=0", "batch_size"),
    ("n_steps=true", "n_steps"),
    ("temperature=-1", "temperature"),
    ("learning_rate=nan", "learning_rate"),
    ("learning_rate=0", "learning_rate"),
    ("max_tokens=0", "max_tokens"),
    ("level=0", "level"),
    ("level=1.5", "level"),
    ("backend=vllm", "backend"),
    ("eval_device=tpu", "eval_device"),
    ("eval_tolerance=v9", "eval_tolerance"),
    ("run_id=../elsewhere", "run_id"),
    ("log_path=runs/{name}", "log_path"),
    ("problem_ids=[]", "problem_ids"),
    ("dataset_builder.reward_stage=4", "dataset_builder.reward_stage"),
    ("dataset_builder.reward_speed_weight=-0.5", "dataset_builder.reward_speed_weight"),
    ("dataset_builder.raicl_k=0", "dataset_builder.raicl_k"),
    ("adam.beta1=1.0", "adam.beta1"),
    ("adam.eps=0", "adam.eps"),
])  # fmt: skip
def test_bad_values_are_rejected_naming_the_key(override: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"invalid config: {key}: "):
        load_config(None, [override])


def test_malformed_inputs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'group_size' is not key=value"):
        load_config(None, ["group_size"])
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(None, ["problem_ids=[a, b"])
    with pytest.raises(ConfigError, match="adam must be a mapping"):
        load_config(None, ["adam=0.9"])
    with pytest.raises(ConfigError, match="packaged: default, rl_kernelbench_kevin, stage1, stage2, stage3, tiny_cpu"):
        load_config("no_such_config")
    listed = tmp_path / "list.yaml"
    listed.write_text("- group_size: 4\n")
    with pytest.raises(ConfigError, match="must be a mapping of keys"):
        load_config(listed)
    broken = tmp_path / "broken.yaml"
    broken.write_text("group_size: [4\n")
    with pytest.raises(ConfigError, match="broken.yaml: not valid YAML"):
        load_config(broken)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_reward_weights_are_the_stage_preset(stage: int) -> None:
    assert load_config(f"stage{stage}").reward_weights() == preset(stage)
    assert load_config(None, [f"dataset_builder.reward_stage={stage}"]).reward_weights() == preset(stage)


def test_reward_overrides_replace_only_their_term() -> None:
    weights = load_config("stage2", ["dataset_builder.reward_speed_weight=0.25",
                                     "dataset_builder.reward_cheat_penalty=2",
                                     "dataset_builder.measure_performance=true"]).reward_weights()  # fmt: skip
    assert weights == RewardWeights(format=0.1, compile=0.2, correctness=0.7, speed=0.25, cheat_penalty=2.0,
                                    measure_performance=True)  # fmt: skip
    untimed = load_config("stage3", ["dataset_builder.measure_performance=false"]).reward_weights()
    assert untimed.measure_performance is False and untimed.speed == preset(3).speed


def test_round_trip_through_the_run_record_and_yaml(tmp_path: Path) -> None:
    cfg = load_config("tiny_cpu", ["n_steps=7", "adam.beta2=0.99", "dataset_builder.reward_speed_weight=0.1"])
    record = json.loads(json.dumps(config_to_dict(cfg)))  # as the RunStarted event stores it
    assert TrainConfig.model_validate(record) == cfg
    assert record["dataset_builder"]["reward_speed_weight"] == 0.1 and record["adam"]["beta2"] == 0.99
    saved = tmp_path / "saved.yaml"
    saved.write_text(dump_yaml(cfg))
    assert load_config(saved) == cfg
    assert "dataset_builder.raicl_k" in valid_keys() and "adam.eps" in valid_keys()

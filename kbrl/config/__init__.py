"""Training configuration: packaged YAML files plus `key=value` overrides, validated into `TrainConfig`.

Names follow the seed project (`model_name`, `group_size`, `dataset_builder.reward_speed_weight`, …), so its
commands carry over. Layering: `default.yaml` (every key), then one file (a path or a packaged name such as
`stage2` or `tiny_cpu`), then `key=value` overrides whose values are parsed as YAML (`level=2` is an int,
`level=null` None, `problem_ids=[builtin/L1/1,builtin/L1/2]` a list). An unknown key, in a file or an
override, is an error naming the closest valid key, so a typo can never silently leave a setting at its
default. The validated config is recorded whole in the run's `RunStarted` event (`config_to_dict`), and
replay rebuilds it from there with `TrainConfig.model_validate`.
"""

from __future__ import annotations

import difflib
import re
import string
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from kbrl.training.rewards import CONFIG_KEYS, RewardWeights, from_config, preset

CONFIG_DIR = Path(__file__).parent
"""Where the packaged configs (`default.yaml`, `stage1..3.yaml`, `tiny_cpu.yaml`) live."""

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class ConfigError(ValueError):
    """A configuration that cannot be used, with a message saying which key and why."""


class _Section(BaseModel):
    """Shared settings of every config section: unknown keys, NaN/inf and bools-as-numbers are errors."""

    # coerce_numbers_to_str: YAML reads `run_id: 20240101` or `eval_tolerance: 0.1` as numbers; they are
    # still meant as text. allow_inf_nan=False: a NaN learning rate or weight would slip past every bound.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, coerce_numbers_to_str=True,
                              validate_assignment=True)  # fmt: skip

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic takes `true` as 1 for numbers; in a config that is always a mistake (`n_steps: yes`)."""
        if isinstance(value, bool) and info.field_name is not None:
            kinds = _scalar_types(cls.model_fields[info.field_name].annotation)
            if bool not in kinds and kinds & {int, float}:
                raise ValueError("must be a number, not true/false")
        return value


class DatasetBuilder(_Section):
    """Reward weights and prompt options (the seed's `dataset_builder.*` keys).

    A `reward_*` weight or `measure_performance` left at None takes the value of the `reward_stage` preset
    (kbrl/training/rewards.py), so a stage file stays one line and an override changes one term only.
    """

    reward_stage: int = 1
    reward_format_weight: float | None = Field(None, ge=0)
    reward_compile_weight: float | None = Field(None, ge=0)
    reward_correctness_weight: float | None = Field(None, ge=0)
    reward_speed_weight: float | None = Field(None, ge=0)
    reward_cheat_penalty: float | None = Field(None, ge=0)
    measure_performance: bool | None = None
    prompt_option: Literal["basic", "raicl"] = "basic"
    rag_index_path: str | None = None
    raicl_k: int = Field(3, ge=1)
    raicl_allow_same_task: bool = False

    @field_validator("reward_stage")
    @classmethod
    def _known_stage(cls, value: int) -> int:
        preset(value)  # raises, naming the valid presets
        return value

    def reward_overrides(self) -> dict[str, Any]:
        """The reward keys set explicitly (not None), as `rewards.from_config` reads them."""
        return {key: value for key in CONFIG_KEYS if (value := getattr(self, key, None)) is not None}


class Adam(_Section):
    """Optimizer settings beside `learning_rate` (passed to the backend's Adam step)."""

    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip_norm: float = Field(0.0, ge=0)


class TrainConfig(_Section):
    """Everything a training run needs; recorded whole in its `RunStarted` event."""

    model_name: str = Field("Qwen/Qwen2.5-Coder-7B-Instruct", min_length=1)
    backend: Literal["tinker", "local"] = "tinker"
    run_id: str | None = None
    problem_source: str = Field("builtin", min_length=1)
    level: int | None = Field(1, ge=1)
    problem_ids: list[str] | None = None
    n_steps: int = Field(50, ge=1)
    batch_size: int = Field(4, ge=1)
    group_size: int = Field(8, ge=2)
    learning_rate: float = Field(4e-5, gt=0)
    lora_rank: int = Field(32, ge=1)
    max_tokens: int = Field(4096, ge=1)
    temperature: float = Field(1.0, ge=0)
    kernel_backend: Literal["triton", "cuda"] = "triton"
    mode: Literal["single_turn", "multi_turn"] = "single_turn"
    max_turns: int = Field(4, ge=1)
    gamma: float = Field(0.4, ge=0, le=1)
    normalize_advantages_std: bool = False
    multiturn_baseline: Literal["per_turn", "all_turns"] = "per_turn"
    max_prompt_tokens: int = Field(16384, ge=64)
    step_deadline_s: float | None = Field(None, gt=0)
    seed: int = 0
    log_path: str = Field("runs/{run_id}", min_length=1)
    checkpoint_dir: str | None = None
    tensorboard_enabled: bool = True
    local_workers: int = Field(2, ge=1)
    eval_device: Literal["auto", "cuda", "cpu"] = "auto"
    eval_timeout_s: float = Field(180.0, gt=0)
    eval_n_trials: int = Field(5, ge=1)
    eval_tolerance: str = "v0.1"
    dataset_builder: DatasetBuilder = Field(default_factory=DatasetBuilder)
    adam: Adam = Field(default_factory=Adam)

    @field_validator("run_id")
    @classmethod
    def _safe_run_id(cls, value: str | None) -> str | None:
        """Run ids name directories (`log_path`) and event streams: no slashes, spaces or leading dots."""
        if value is not None and not _RUN_ID.fullmatch(value):
            raise ValueError("must be letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @field_validator("problem_ids")
    @classmethod
    def _some_problems(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and not value:
            raise ValueError("is an empty list; use null for every problem of the source/level")
        return value

    @field_validator("log_path")
    @classmethod
    def _only_run_id_placeholder(cls, value: str) -> str:
        """The trainer fills `{run_id}` with str.format; any other placeholder would fail only at run start."""
        fields = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
        if fields - {"run_id"}:
            raise ValueError("may only use the placeholder {run_id}")
        return value

    @field_validator("eval_tolerance")
    @classmethod
    def _known_tolerance(cls, value: str) -> str:
        from kbrl.kernels.evaluator import TOLERANCES

        if value not in TOLERANCES:
            raise ValueError(f"unknown tolerance preset; choose one of {sorted(TOLERANCES)}")
        return value

    @model_validator(mode="after")
    def _weights_are_usable(self) -> TrainConfig:
        """Check the merged reward weights now rather than at the first scored sample."""
        self.reward_weights()
        return self

    def reward_weights(self) -> RewardWeights:
        """The `dataset_builder.reward_stage` preset, with any explicitly set `reward_*` value on top."""
        db = self.dataset_builder
        return from_config(db.reward_overrides(), base=preset(db.reward_stage))


# pydantic's own message for group_size < 2 says only "greater than or equal to 2"; say why.
_EXPLAIN = {"group_size": "GRPO compares samples within a group, so it needs at least 2 per problem"}


def valid_keys(model: type[BaseModel] = TrainConfig, prefix: str = "") -> list[str]:
    """Every settable dotted key (`group_size`, `dataset_builder.reward_speed_weight`, `adam.eps`, …)."""
    keys: list[str] = []
    for name, info in model.model_fields.items():
        section = _section_model(info.annotation)
        keys.extend(valid_keys(section, f"{prefix}{name}.") if section else [f"{prefix}{name}"])
    return keys


def packaged_configs() -> list[str]:
    """Names accepted by `load_config` instead of a path (`default`, `stage1`, …, `tiny_cpu`)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def resolve_path(name: str | Path) -> Path:
    """A config file path, or the name of a packaged config (`stage2`, `tiny_cpu`, also `stage2.yaml`)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    stem = str(name).removesuffix(".yaml").removesuffix(".yml")
    packaged = CONFIG_DIR / f"{stem}.yaml"
    if "/" not in stem and packaged.is_file():
        return packaged
    raise ConfigError(f"no config file {str(name)!r} and no packaged config of that name "
                      f"(packaged: {', '.join(packaged_configs())})")  # fmt: skip


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """default.yaml, then the file `path` (or packaged name), then `key=value` overrides (values are YAML).

    Raises ConfigError (a ValueError) for an unknown key, a malformed override, an unreadable file or a
    value out of range, with a message naming the key.
    """
    data: dict[str, Any] = {}
    for source in [CONFIG_DIR / "default.yaml", *([resolve_path(path)] if path is not None else [])]:
        _merge(data, _read_yaml(source), origin=str(source))
    for item in overrides:
        key, value = parse_override(item)
        if _annotation(key) is None and key not in TrainConfig.model_fields:  # neither a leaf nor a section
            raise _unknown(key, f"override {item!r}")
        _merge(data, _nest(key, value), origin=f"override {item!r}")
    return validate(data)


def parse_override(item: str) -> tuple[str, Any]:
    """`key=value` → (dotted key, value): the value as YAML, except text for text settings (`run_id=007`)."""
    key, sep, raw = item.partition("=")
    key = key.strip().removeprefix("--")
    if not sep or not key:
        raise ConfigError(f"override {item!r} is not key=value (e.g. group_size=16 or adam.beta2=0.99)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({_first_line(exc)})") from None
    annotation = _annotation(key)
    if annotation is not None and isinstance(value, int | float) and str in _scalar_types(annotation):
        value = raw.strip()  # `model_name=7b` stays text, `run_id=007` keeps its zeros
    return key, value


def validate(data: Mapping[str, Any]) -> TrainConfig:
    """`TrainConfig.model_validate`, with unknown keys named (closest key suggested) and one-line messages."""
    _check_keys(data, origin="config")
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"invalid config: {_describe(exc)}") from None


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """JSON-safe nested dict of every setting (for the `RunStarted` event); `TrainConfig.model_validate`
    reads it back unchanged."""
    return cfg.model_dump(mode="json")


def dump_yaml(cfg: TrainConfig) -> str:
    """The config as YAML, in field order: a file that `load_config` reads back to the same config."""
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True)


# --- helpers -------------------------------------------------------------------------------------------


def _section_model(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _scalar_types(annotation: Any) -> set[Any]:
    """The plain types in an annotation (`float | None` → {float, NoneType}; `list[str]` → {list})."""
    if get_origin(annotation) in (Union, types.UnionType):
        return set().union(*(_scalar_types(arg) for arg in get_args(annotation)))
    if get_origin(annotation) is Literal:
        return {type(arg) for arg in get_args(annotation)} | {Literal}
    return {get_origin(annotation) or annotation}


def _annotation(dotted: str) -> Any:
    """The annotation of a dotted leaf key, None if there is no such leaf."""
    model: type[BaseModel] | None = TrainConfig
    *parents, leaf = dotted.split(".")
    for part in parents:
        info = model.model_fields.get(part) if model else None
        model = _section_model(info.annotation) if info else None
    info = model.model_fields.get(leaf) if model else None
    return info.annotation if info and not _section_model(info.annotation) else None


def _unknown(key: str, origin: str) -> ConfigError:
    keys = valid_keys()
    leaf = key.rsplit(".", 1)[-1]
    # A right name in the wrong place (`beta2` for `adam.beta2`) is found by its last part; typos by difflib.
    same_leaf = [k for k in keys if k.rsplit(".", 1)[-1] == leaf]
    closest = same_leaf[0] if same_leaf else difflib.get_close_matches(key, keys, n=1, cutoff=0.0)[0]
    return ConfigError(f"unknown config key {key!r}; did you mean {closest!r}? (in {origin}; "
                       "kbrl/config/default.yaml lists every key)")  # fmt: skip


def _check_keys(data: Mapping[str, Any], origin: str, model: type[BaseModel] = TrainConfig,
                prefix: str = "") -> None:  # fmt: skip
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        info = model.model_fields.get(key) if isinstance(key, str) else None
        if info is None:
            raise _unknown(dotted, origin)
        section = _section_model(info.annotation)
        if section is not None:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{dotted} must be a mapping of its own keys ({dotted}.KEY: VALUE), "
                                  f"got {value!r} (in {origin})")  # fmt: skip
            _check_keys(value, origin, section, f"{dotted}.")


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({_first_line(exc)})") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of keys, got {type(loaded).__name__}")
    return loaded


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    """`adam.beta2`, 0.99 → {"adam": {"beta2": 0.99}}."""
    *parents, leaf = dotted.split(".")
    nested: dict[str, Any] = {leaf: value}
    for part in reversed(parents):
        nested = {part: nested}
    return nested


def _merge(data: dict[str, Any], layer: Mapping[str, Any], origin: str) -> None:
    """Later layers win key by key; sections merge (a stage file does not reset the other reward keys)."""
    _check_keys(layer, origin)
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(data.get(key), dict):
            _merge_section(data[key], value)
        else:
            data[key] = dict(value) if isinstance(value, Mapping) else value


def _merge_section(target: dict[str, Any], layer: Mapping[str, Any]) -> None:
    for key, value in layer.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge_section(target[key], value)
        else:
            target[key] = value


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        if key in _EXPLAIN and error["type"] == "greater_than_equal":
            message = _EXPLAIN[key]
        shown = f" (got {error['input']!r})" if key and not isinstance(error.get("input"), dict) else ""
        problems.append(f"{key}: {message}{shown}" if key else message)
    return "; ".join(problems)


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


__all__ = [
    "CONFIG_DIR",
    "Adam",
    "ConfigError",
    "DatasetBuilder",
    "TrainConfig",
    "config_to_dict",
    "dump_yaml",
    "load_config",
    "packaged_configs",
    "parse_override",
    "resolve_path",
    "valid_keys",
    "validate",
]

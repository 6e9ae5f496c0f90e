"""The evaluation result: KernelBench-compatible fields plus categories, cheat flags and stage timings."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Category(StrEnum):
    """Outcome of one evaluation, in pipeline order; the first stage that fails names the category."""

    FORMAT_ERROR = "FORMAT_ERROR"
    CHEAT = "CHEAT"
    COMPILATION_ERROR = "COMPILATION_ERROR"
    RUNTIME_ERROR = "RUNTIME_ERROR"
    TIMEOUT = "TIMEOUT"
    CORRECTNESS_ERROR = "CORRECTNESS_ERROR"
    # Compiled, but this host cannot run it (a CUDA candidate without a GPU): never counted as correct.
    UNVERIFIED = "UNVERIFIED"
    CORRECT = "CORRECT"


@dataclass
class CheatFlag:
    """A reason to distrust a candidate. `severity` "error" makes the result a CHEAT, "warning" is advice."""

    name: str
    reason: str
    severity: str = "error"


@dataclass
class TimingStats:
    """Per-call runtimes in milliseconds (CUDA events), summarised."""

    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    n_trials: int
    method: str = "events"


@dataclass
class EvalResult:
    """Everything the reward and the feedback need about one candidate (see DESIGN.md, "Evaluation result")."""

    problem_id: str
    category: Category
    format_ok: bool = False
    backend: str = "other"
    compiled: bool = False
    correct: bool = False
    n_correct: int = 0
    n_trials: int = 0
    max_abs_err: float | None = None
    tolerance: dict[str, Any] = field(default_factory=dict)
    runtime: TimingStats | None = None
    ref_eager: TimingStats | None = None
    ref_compile: TimingStats | None = None
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    # ~95 % interval [low, high] of speedup_eager when it comes from paired in-process timing.
    speedup_eager_ci: list[float] | None = None
    timing_available: bool = False
    timing_note: str = ""
    cheat_flags: list[CheatFlag] = field(default_factory=list)
    error: str = ""
    feedback: str = ""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    device: str = "cpu"
    stdout_tail: str = ""
    stderr_tail: str = ""
    source_hash: str = ""
    build_cache_hit: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["category"] = str(self.category)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalResult:
        """Inverse of `to_dict`, also for dicts read back from the event store, where non-finite floats
        are stored as the strings "NaN", "Infinity", "-Infinity" (JSON has no literal for them)."""
        data = dict(data)
        data["category"] = Category(data["category"])
        data["cheat_flags"] = [CheatFlag(**f) for f in data.get("cheat_flags", [])]
        for key in ("max_abs_err", "speedup_eager", "speedup_compile"):
            data[key] = _number(data.get(key))
        for key in ("runtime", "ref_eager", "ref_compile"):
            if data.get(key) is not None:
                data[key] = TimingStats(**{k: _number(v) if k.endswith("_ms") else v for k, v in data[key].items()})
        return cls(**data)


_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _number(value: Any) -> Any:
    return _NON_FINITE.get(value, value) if isinstance(value, str) else value

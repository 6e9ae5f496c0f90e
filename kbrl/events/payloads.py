"""Typed event payloads: one pydantic model per event type, with its schema version, in one registry.

Every fact the system records is one of these models. The store takes the event type and version from
the class, so a writer cannot mislabel a payload, and `extra="forbid"` turns a typo in a field name into
an error instead of a silently dropped value. Floats that are NaN or infinite are stored as the JSON
strings "NaN" / "Infinity" / "-Infinity" (plain JSON has no such numbers, PostgreSQL's JSONB rejects them)
and read back as floats by typed fields; inside free-form dicts (`KernelEvaluated.result`, `config`, …)
they stay strings in `Event.payload` and in `parse()`, so readers of e.g. `result["max_abs_err"]` should
accept them (`float("NaN")` works).

Payloads are frozen; do not mutate the lists and dicts inside one after building it (`append` checks
their types again while serialising, but a changed value of the right type would go unnoticed).

Changing a payload: add optional fields freely (old events still validate). For anything else, bump
`schema_version` and override `upcast` to turn the stored dict of an older version into the current shape.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field

RunStatus = Literal["finished", "failed", "cancelled", "interrupted"]
"""How a run ended; `runs()` reports it, or "running" while no end event has been written."""


class UnknownEventType(LookupError):
    """An event type name with no registered payload model."""


class EventPayload(BaseModel):
    """Base of all payloads: immutable, strict about field names, registered under `event_type`."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")

    event_type: ClassVar[str] = ""
    """Name stored in `events.type`; defaults to the class name."""
    schema_version: ClassVar[int] = 1
    """Stored in `events.version`; bump it (and override `upcast`) on an incompatible change."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "event_type" not in cls.__dict__ or not cls.__dict__["event_type"]:
            cls.event_type = cls.__name__

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        register(cls)

    @classmethod
    def model_construct(cls, _fields_set: set[str] | None = None, **values: Any) -> Self:
        """Build without validation (as pydantic does), and remember it: `append` validates it in full."""
        model = super().model_construct(_fields_set, **values)
        _mark_unvalidated(model)
        return model

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """Copy (as pydantic does); a copy with `update` is unvalidated, and `append` validates it in full."""
        model = super().model_copy(update=update, deep=deep)
        if update or not is_validated(self):
            _mark_unvalidated(model)
        return model

    @classmethod
    def upcast(cls, data: dict[str, Any], version: int) -> dict[str, Any]:
        """Turn a payload stored with an older `version` into the current shape (identity by default)."""
        if version > cls.schema_version:
            raise ValueError(
                f"{cls.event_type} payload has version {version}, newer than this code's {cls.schema_version}; "
                "upgrade kbrl to read it"
            )
        return data


_UNVALIDATED: dict[int, weakref.ref[EventPayload]] = {}
"""Payloads built without validation (model_construct, model_copy(update=…)), by id, while they live.
Kept outside the model so that it takes no part in equality, hashing or pickling."""


def _mark_unvalidated(model: EventPayload) -> None:
    key = id(model)
    _UNVALIDATED[key] = weakref.ref(model, lambda _ref: _UNVALIDATED.pop(key, None))


def is_validated(model: EventPayload) -> bool:
    """False for a payload built by `model_construct()` or `model_copy(update=…)`: its content was never
    checked, so `append` validates it in full instead of trusting construction."""
    ref = _UNVALIDATED.get(id(model))
    return ref is None or ref() is not model


REGISTRY: dict[str, type[EventPayload]] = {}
"""Event type name -> payload model. Filled by subclassing `EventPayload`."""


def register(model: type[EventPayload]) -> type[EventPayload]:
    """Add a payload model to the registry; a second model under the same name is an error."""
    name = model.event_type
    existing = REGISTRY.get(name)
    if existing is not None and existing is not model:
        same_def = existing.__module__ == model.__module__ and existing.__qualname__ == model.__qualname__
        if not same_def:  # re-executing the defining module (importlib.reload) replaces the old class
            raise ValueError(f"event type {name!r} is already registered by {existing.__module__}.{existing.__qualname__}")
    REGISTRY[name] = model
    return model


def payload_model(event_type: str) -> type[EventPayload]:
    """The model registered for `event_type`, or `UnknownEventType` listing the known names."""
    try:
        return REGISTRY[event_type]
    except KeyError:
        raise UnknownEventType(
            f"unknown event type {event_type!r}; registered: {', '.join(sorted(REGISTRY))}"
        ) from None


def parse_payload(event_type: str, version: int, data: dict[str, Any]) -> EventPayload:
    """Validate a stored payload dict into its typed model, upcasting older versions first."""
    model = payload_model(event_type)
    if version != model.schema_version:
        data = model.upcast(data, version)
    return model.model_validate(data)


# --- runs ------------------------------------------------------------------------------------------------


class RunStarted(EventPayload):
    """A training run began (or resumed): the full resolved config, so the run can be reproduced."""

    config: dict[str, Any]
    git_sha: str | None = None
    backend: str
    model: str


class RunFinished(EventPayload):
    """A training run ended; `status` is what `kbrl runs` shows."""

    status: RunStatus
    error: str | None = None


class ProblemsSelected(EventPayload):
    """The problems chosen for one training step."""

    step: int
    problem_ids: list[str]


# --- sampling and evaluation -----------------------------------------------------------------------------


class SampleGenerated(EventPayload):
    """One completion from the policy. `*_ref` are blob hashes (token ids, logprobs) in the `blobs` table.

    The sample's id, which `EvalRequested`/`KernelEvaluated` refer to as `sample_id`, is this event's key.
    """

    step: int
    group: int
    traj: str
    turn: int = 0
    problem_id: str
    prompt_ref: str | None = None
    completion_ref: str | None = None
    logprobs_ref: str | None = None
    text: str
    policy_version: int = 0
    n_prompt_tokens: int | None = None
    n_completion_tokens: int | None = None
    stop_reason: str | None = None
    rag_examples: list[str] = Field(default_factory=list)
    """RA-ICL: ids of the retrieved examples in this sample's prompt, in prompt order (empty without RA-ICL)."""
    rag_removed_same_task: int | None = None
    """RA-ICL: examples the leakage guard withheld from this prompt (derived from the same KernelBench
    problem); None when the prompt had no retrieval (basic prompts, refinement turns)."""
    rag_dropped_for_budget: int | None = None
    """RA-ICL: retrieved examples left out so the prompt fits `max_prompt_tokens` (the longest first)."""


class EvalRequested(EventPayload):
    """A sample was queued for evaluation with these evaluator settings."""

    sample_id: str
    problem_id: str | None = None
    eval_config: dict[str, Any] = Field(default_factory=dict)
    text: str | None = None
    """The candidate, for jobs that are not policy samples (`kbrl enqueue eval DIR`): kept in the store
    so a lost queue message can be re-sent; None when a `SampleGenerated` holds it."""


class KernelEvaluated(EventPayload):
    """The evaluator's verdict on one sample; `result` is `kbrl.kernels.result.EvalResult.to_dict()`."""

    sample_id: str
    problem_id: str
    worker: str
    gpu: int | str | None = None
    result: dict[str, Any]
    seconds: float | None = None


class EvalFailed(EventPayload):
    """A job produced no verdict because the evaluator itself failed (broken reference, missing sample,
    a worker bug): not the candidate's fault, so it is no `KernelEvaluated` and earns no reward."""

    sample_id: str
    problem_id: str | None = None
    worker: str
    error: str


class TurnCompleted(EventPayload):
    """One turn of a trajectory is done (sampled and evaluated); the summary saves a join on replay."""

    traj: str
    turn: int
    problem_id: str | None = None
    sample_id: str | None = None
    category: str | None = None
    correct: bool | None = None
    speedup: float | None = None
    reward: float | None = None
    done: bool = False


class TrajectoryCompleted(EventPayload):
    """A trajectory (one problem, up to T turns) is finished."""

    traj: str
    turns: int
    solved: bool
    best_speedup: float | None = None
    problem_id: str | None = None
    step: int | None = None
    stopped: str | None = None
    """Why it ended: "solved", "max_turns", "failed" (no verdict) or "deadline" (the step's time ran out)."""


# --- training --------------------------------------------------------------------------------------------


class PolicyUpdated(EventPayload):
    """One optimiser step; `policy_version` is the version samples taken after it carry."""

    step: int
    loss: float
    n_datums: int
    lr: float
    policy_version: int
    metrics: dict[str, float] = Field(default_factory=dict)
    rewards: dict[str, float] = Field(default_factory=dict)
    """sample_id → the reward the update used (what `kbrl replay --advantages` must reproduce)."""
    advantages: dict[str, float] = Field(default_factory=dict)
    """sample_id → the advantage the update used."""


class CheckpointSaved(EventPayload):
    """Weights (or a sampler) were saved at `path`."""

    path: str
    step: int | None = None
    policy_version: int | None = None


class WorkerHeartbeat(EventPayload):
    """A GPU worker is alive; `busy` says whether it is evaluating right now."""

    worker: str
    gpu: int | str | None = None
    busy: bool
    host: str | None = None
    job: str | None = None


# --- model evaluations -----------------------------------------------------------------------------------


class EvalRunStarted(EventPayload):
    """A model evaluation (not training) began: `kind` names it, e.g. "kernelbench" or "baseline"."""

    kind: str
    config: dict[str, Any] = Field(default_factory=dict)
    problem_ids: list[str] = Field(default_factory=list)
    n_candidates: int = 1
    model: str | None = None


class EvalRunFinished(EventPayload):
    """A model evaluation ended; `summary` holds its headline numbers (fast_p, pass rates, …)."""

    status: RunStatus
    summary: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None


__all__ = [
    "REGISTRY",
    "CheckpointSaved",
    "EvalFailed",
    "EvalRequested",
    "EvalRunFinished",
    "EvalRunStarted",
    "EventPayload",
    "KernelEvaluated",
    "PolicyUpdated",
    "ProblemsSelected",
    "RunFinished",
    "RunStarted",
    "RunStatus",
    "SampleGenerated",
    "TrajectoryCompleted",
    "TurnCompleted",
    "UnknownEventType",
    "WorkerHeartbeat",
    "is_validated",
    "parse_payload",
    "payload_model",
    "register",
]

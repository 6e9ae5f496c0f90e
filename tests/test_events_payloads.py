"""Payload models: the catalogue, strictness, versions and upcasting."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from kbrl.events import payloads as p
from kbrl.events.store import Event

CATALOGUE = {
    "RunStarted", "ProblemsSelected", "SampleGenerated", "EvalRequested", "KernelEvaluated", "TurnCompleted",
    "TrajectoryCompleted", "PolicyUpdated", "CheckpointSaved", "WorkerHeartbeat", "RunFinished",
    "EvalRunStarted", "EvalRunFinished",
}


def test_catalogue_is_registered():
    assert CATALOGUE <= set(p.REGISTRY)
    for name in CATALOGUE:
        model = p.REGISTRY[name]
        assert model.event_type == name and model.schema_version >= 1
        assert "event_type" not in model.model_fields and "schema_version" not in model.model_fields


def test_unknown_fields_are_rejected():
    with pytest.raises(ValidationError, match="stauts"):
        p.RunFinished(status="finished", stauts="x")


def test_payloads_are_immutable():
    payload = p.RunFinished(status="finished")
    with pytest.raises(ValidationError):
        payload.status = "failed"  # type: ignore[misc]


def test_unknown_type_names_the_registered_ones():
    with pytest.raises(p.UnknownEventType, match="RunStarted"):
        p.payload_model("Nope")


def test_duplicate_event_type_is_an_error():
    with pytest.raises(ValueError, match="already registered"):

        class Impostor(p.EventPayload):
            event_type = "RunStarted"

    assert p.REGISTRY["RunStarted"] is p.RunStarted


@pytest.fixture
def versioned():
    class Renamed(p.EventPayload):
        """Version 2 renamed `n` to `count`."""

        schema_version = 2
        count: int

        @classmethod
        def upcast(cls, data, version):
            if version == 1:
                data = {"count": data["n"]}
            return super().upcast(data, version)

    yield Renamed
    del p.REGISTRY["Renamed"]


def test_old_versions_are_upcast_on_parse(versioned):
    now = datetime.now(UTC)
    old = Event(1, "r", "s", "Renamed", 1, "k", {"n": 3}, now)
    assert old.parse() == versioned(count=3)
    current = Event(2, "r", "s", "Renamed", 2, "k2", {"count": 4}, now)
    assert current.parse() == versioned(count=4)
    future = Event(3, "r", "s", "Renamed", 3, "k3", {"count": 4}, now)
    with pytest.raises(ValueError, match="newer than this code"):
        future.parse()


def test_unvalidated_payloads_are_tracked_without_changing_equality():
    built = p.RunFinished(status="finished")
    constructed = p.RunFinished.model_construct(status="finished", error=None)
    assert p.is_validated(built) and not p.is_validated(constructed)
    assert built == constructed  # the mark is kept outside the model
    assert p.is_validated(built.model_copy())
    assert not p.is_validated(built.model_copy(update={"status": "failed"}))
    assert not p.is_validated(constructed.model_copy())
    assert p.is_validated(p.RunFinished.model_validate({"status": "failed"}))

"""The functions behind `kbrl db upgrade`, `kbrl runs` and `kbrl replay`."""

from __future__ import annotations

import json

import pytest

from kbrl.events import commands
from kbrl.events import payloads as p
from kbrl.events.store import EventStore, NewEvent


@pytest.fixture
def filled(sqlite_url) -> str:
    store = EventStore(sqlite_url)
    store.append([
        NewEvent("run-a", "run", "a/start", p.RunStarted(config={"lr": 1}, backend="local", model="tiny")),
        NewEvent("run-a", "traj/0", "a/s0", p.SampleGenerated(
            step=0, group=0, traj="0", problem_id="L1/1", text="x" * 500, policy_version=0,
        )),
        NewEvent("run-a", "traj/0", "a/e0", p.KernelEvaluated(
            sample_id="a/s0", problem_id="L1/1", worker="w0", result={"category": "CORRECT", "speedup_eager": 2.0},
        )),
        NewEvent("run-a", "run", "a/end", p.RunFinished(status="finished")),
        NewEvent("run-b", "run", "b/start", p.EvalRunStarted(kind="kernelbench", problem_ids=["L1/1"])),
    ])
    return sqlite_url


def test_db_upgrade_reports_what_it_did(sqlite_url, capsys):
    commands.db_upgrade(sqlite_url)
    first = capsys.readouterr().out
    assert "upgraded <empty> -> 0001" in first
    commands.db_upgrade(sqlite_url)
    assert "already at revision 0001" in capsys.readouterr().out


def test_list_runs_table_and_json(filled, capsys):
    commands.list_runs(filled, as_json=False)
    out = capsys.readouterr().out
    for text in ("run-a", "run-b", "train", "eval:kernelbench", "finished", "running"):
        assert text in out
    commands.list_runs(filled, as_json=True)
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["run_id"], r["status"], r["n_events"]) for r in rows] == [("run-a", "finished", 4), ("run-b", "running", 1)]


def test_list_runs_empty_store(sqlite_url, capsys):
    commands.list_runs(sqlite_url)
    assert "no runs" in capsys.readouterr().out


def test_replay_table(filled, capsys):
    assert commands.replay(filled, "run-a") == 4
    out = capsys.readouterr().out
    for text in ("RunStarted", "SampleGenerated", "KernelEvaluated", "RunFinished", "category=CORRECT", "4 events"):
        assert text in out
    assert "x" * 100 not in out  # long text is summarised


def test_replay_json_lines_and_type_filter(filled, capsys):
    assert commands.replay(filled, "run-a", as_json=True, types=["RunStarted,RunFinished"]) == 2
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["type"] for e in lines] == ["RunStarted", "RunFinished"]
    assert lines[0]["payload"]["model"] == "tiny" and lines[0]["position"] == 1
    assert commands.replay(filled, "run-a", as_json=True, types=["SampleGenerated", "KernelEvaluated"]) == 2


def test_replay_unknown_run(filled, capsys):
    assert commands.replay(filled, "nope") == -1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no run 'nope'" in captured.err and "run-a" in captured.err


def test_summarize_is_short():
    from kbrl.events.store import Event

    event = Event(1, "r", "s", "T", 1, "k", {"a": "y" * 300, "b": list(range(50)), "c": None, "d": 0.123456789}, None)  # type: ignore[arg-type]
    text = commands.summarize(event)
    assert len(text) <= commands.SUMMARY_CHARS
    assert "b=[50 items]" in text and "c=" not in text and "d=0.1235" in text

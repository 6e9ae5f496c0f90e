"""EventStore on SQLite and PostgreSQL: append/read/follow semantics, idempotency and ordering under real
concurrent processes, validation, blobs, runs, and the append-only guarantee."""

from __future__ import annotations

import math
import multiprocessing as mp
import random
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from kbrl.events import payloads as p
from kbrl.events.store import BlobNotFound, Event, EventStore, InvalidEvent, NewEvent

# Worker processes are forked from a fork server that has imported kbrl but opened nothing: real,
# independent processes (no connection or lock inherited from the test) that start in milliseconds.
SPAWN = mp.get_context("forkserver")
SPAWN.set_forkserver_preload(["kbrl.events.store"])


def ps(run_id: str, key: str, step: int = 0, stream: str = "run") -> NewEvent:
    return NewEvent(run_id, stream, key, p.ProblemsSelected(step=step, problem_ids=[f"L1/{step}"]))


# --- examples of every payload type (the round-trip test insists the list is complete) ---------------------

RESULT = {
    "problem_id": "L1/3",
    "category": "CORRECT",
    "correct": True,
    "runtime": {"median_ms": 0.25, "mean_ms": 0.26, "std_ms": 0.01, "min_ms": 0.2, "max_ms": 0.4, "n_trials": 100},
    "speedup_eager": 1.7,
    "cheat_flags": [{"name": "x", "reason": "y", "severity": "warning"}],
    "max_abs_err": None,
}
EXAMPLES: dict[str, p.EventPayload] = {
    "RunStarted": p.RunStarted(config={"lr": 1e-5, "nested": {"k": [1, 2]}}, git_sha="abc123", backend="tinker", model="q"),
    "ProblemsSelected": p.ProblemsSelected(step=3, problem_ids=["L1/1", "L2/7"]),
    "SampleGenerated": p.SampleGenerated(
        step=3, group=1, traj="t-1", turn=2, problem_id="L1/1", prompt_ref="aa" * 32, completion_ref="bb" * 32,
        logprobs_ref="cc" * 32, text="```python\nprint('héllo')\n```", policy_version=4, n_prompt_tokens=10,
        n_completion_tokens=20, stop_reason="stop",
    ),
    "EvalRequested": p.EvalRequested(sample_id="r/sample/1", problem_id="L1/1", eval_config={"n_trials": 5},
                                     text="```python\nclass ModelNew: ...\n```"),
    "EvalFailed": p.EvalFailed(sample_id="r/sample/2", problem_id="L1/1", worker="w0", error="EvaluatorError: x"),
    "KernelEvaluated": p.KernelEvaluated(
        sample_id="r/sample/1", problem_id="L1/3", worker="w0", gpu=0, result=RESULT, seconds=1.5
    ),
    "TurnCompleted": p.TurnCompleted(
        traj="t-1", turn=1, problem_id="L1/1", sample_id="s", category="CORRECT", correct=True, speedup=1.2,
        reward=0.5, done=True,
    ),
    "TrajectoryCompleted": p.TrajectoryCompleted(
        traj="t-1", turns=2, solved=True, best_speedup=1.7, problem_id="L1/1", step=3
    ),
    "PolicyUpdated": p.PolicyUpdated(step=3, loss=-0.25, n_datums=64, lr=1e-5, policy_version=4, metrics={"kl": 0.01}),
    "CheckpointSaved": p.CheckpointSaved(path="tinker://ckpt/3", step=3, policy_version=4),
    "WorkerHeartbeat": p.WorkerHeartbeat(worker="w0", gpu="H100", busy=True, host="gpu-01", job="j1"),
    "RunFinished": p.RunFinished(status="failed", error="boom"),
    "EvalRunStarted": p.EvalRunStarted(kind="kernelbench", config={"level": 1}, problem_ids=["L1/1"], n_candidates=4),
    "EvalRunFinished": p.EvalRunFinished(status="finished", summary={"fast_1": 0.25, "pass": [1, 0]}),
}


# --- append and read ---------------------------------------------------------------------------------------


def test_append_returns_consecutive_positions_in_input_order(db_url):
    store = EventStore(db_url)
    first = store.append([ps("r", f"k{i}", i) for i in range(5)])
    second = store.append([ps("r", f"m{i}", i) for i in range(3)])
    positions = [e.position for e in first + second]
    assert positions == list(range(positions[0], positions[0] + 8))
    assert [e.key for e in first] == [f"k{i}" for i in range(5)]
    assert all(isinstance(e.created_at, datetime) and e.created_at.tzinfo is not None for e in first)
    assert list(store.read()) == first + second  # what append returns is exactly what is stored
    assert store.last_position() == positions[-1]
    assert store.append([]) == []


def test_get_count_and_latest_per_stream(db_url):
    store = EventStore(db_url)
    store.append([ps("r1", "a", 0, "s1"), ps("r1", "b", 1, "s2"), ps("r1", "c", 2, "s1"), ps("r2", "d", 3, "s1")])
    store.append([NewEvent("r1", "s2", "e", p.WorkerHeartbeat(worker="w", busy=False))])
    assert store.get("c").payload["step"] == 2 and store.get("nope") is None
    assert store.count("r1") == 4 and store.count("r1", [p.ProblemsSelected]) == 3 and store.count("r3") == 0
    assert [e.key for e in store.latest_per_stream("r1")] == ["c", "e"]
    assert store.latest_per_stream("r3") == []


def test_read_filters_and_pagination(db_url):
    store = EventStore(db_url)
    batch = []
    for i in range(20):
        run = "a" if i % 2 else "b"
        payload: p.EventPayload = p.ProblemsSelected(step=i, problem_ids=[]) if i % 3 else p.CheckpointSaved(path=f"/c{i}")
        batch.append(NewEvent(run, f"traj/{i % 4}", f"k{i}", payload))
    stored = store.append(batch)
    pos = {e.key: e.position for e in stored}

    everything = list(store.read(chunk_size=3))  # many small pages
    assert [e.key for e in everything] == [f"k{i}" for i in range(20)]
    assert [e.key for e in store.read(run_id="a", chunk_size=4)] == [f"k{i}" for i in range(1, 20, 2)]
    assert [e.key for e in store.read(stream="traj/1")] == ["k1", "k5", "k9", "k13", "k17"]
    checkpoints = [f"k{i}" for i in range(0, 20, 3)]
    assert [e.key for e in store.read(types=["CheckpointSaved"])] == checkpoints
    assert [e.key for e in store.read(types=[p.CheckpointSaved])] == checkpoints
    assert list(store.read(types=[])) == []
    assert [e.key for e in store.read(after=pos["k15"])] == ["k16", "k17", "k18", "k19"]
    assert [e.key for e in store.read(limit=7, chunk_size=3)] == [f"k{i}" for i in range(7)]
    assert [e.key for e in store.read(after=pos["k2"], upto=pos["k5"])] == ["k3", "k4", "k5"]
    assert [e.key for e in store.read(run_id="a", stream="traj/3", types=["ProblemsSelected"])] == [
        "k7", "k11", "k19",
    ]
    assert list(store.read(run_id="nope")) == []


def test_payload_round_trip_for_every_type(db_url):
    store = EventStore(db_url)
    stored = store.append([NewEvent("r", "s", f"k-{name}", payload) for name, payload in EXAMPLES.items()])
    read = list(store.read())
    assert read == stored
    for event, (name, payload) in zip(read, EXAMPLES.items(), strict=True):
        assert (event.type, event.version) == (name, type(payload).schema_version)
        assert event.parse() == payload, name
        assert type(event.parse()) is type(payload)


def test_examples_cover_every_registered_type():
    assert set(EXAMPLES) == set(p.REGISTRY)


def test_nan_and_infinity_survive(db_url):
    store = EventStore(db_url)
    store.append([NewEvent("r", "s", "k", p.PolicyUpdated(step=1, loss=math.nan, n_datums=1, lr=math.inf, policy_version=1))])
    (event,) = store.read()
    parsed = event.parse()
    assert math.isnan(parsed.loss) and parsed.lr == math.inf


def test_dict_payload_with_type_is_validated_and_completed(db_url):
    store = EventStore(db_url)
    (event,) = store.append([NewEvent("r", "run", "end", {"status": "finished"}, type="RunFinished")])
    assert event.payload == {"status": "finished", "error": None}  # defaults are stored explicitly
    assert event.parse() == p.RunFinished(status="finished")


# --- idempotency --------------------------------------------------------------------------------------------


def test_duplicate_keys_return_the_stored_event(db_url):
    store = EventStore(db_url)
    (original,) = store.append([ps("r", "dup", step=1)])
    again = store.append([ps("r", "new1"), ps("r", "dup", step=99), ps("r", "new1", step=5), ps("r", "new2")])
    assert again[1] == original  # the stored event, not the retried payload
    assert again[2] == again[0]  # repeated within the batch: one row
    assert [e.key for e in store.read()] == ["dup", "new1", "new2"]
    assert store.read().__next__().payload["step"] == 1


def _append_overlapping(url: str, seed: int, n_keys: int, start: Any) -> dict[str, int]:
    """Worker: append all keys (same payload per key) in a random order and random batch sizes."""
    store = EventStore(url)
    rng = random.Random(seed)
    keys = list(range(n_keys))
    rng.shuffle(keys)
    start.wait()
    positions: dict[str, int] = {}
    while keys:
        size = rng.randint(1, 40)
        chunk, keys = keys[:size], keys[size:]
        for ev in store.append([ps("run", f"key-{k}", step=k) for k in chunk]):
            positions[ev.key] = ev.position
    store.close()
    return positions


def _call(i: int, target, args: tuple, start: Any, results: Any) -> None:
    import traceback

    try:
        results.put((i, True, target(*args, start)))
    except BaseException:  # report, don't hang the parent
        results.put((i, False, traceback.format_exc()))


def _run_processes(target, argss: list[tuple], timeout: float = 60) -> list[Any]:
    """Run target(*args, start) in one new process per args tuple; return the results in order.

    Children open their store first, then meet at the `start` barrier, so the work itself
    overlaps instead of being staggered by interpreter start-up.
    """
    start = SPAWN.Barrier(len(argss) + 1)
    results = SPAWN.Queue()
    procs = [SPAWN.Process(target=_call, args=(i, target, args, start, results)) for i, args in enumerate(argss)]
    for proc in procs:
        proc.start()
    try:
        start.wait(timeout)
        out = dict.fromkeys(range(len(argss)))
        for _ in procs:
            i, ok, value = results.get(timeout=timeout)
            assert ok, f"worker {i} failed:\n{value}"
            out[i] = value
        return [out[i] for i in range(len(argss))]
    finally:
        for proc in procs:
            proc.join(timeout)
            if proc.is_alive():
                proc.kill()


def test_concurrent_processes_overlapping_keys_store_one_row_per_key(db_url):
    EventStore(db_url).close()  # migrate once up front; concurrent migration has its own test
    n_keys, n_procs = 150, 4
    results = _run_processes(_append_overlapping, [(db_url, seed, n_keys) for seed in range(n_procs)])
    rows = list(EventStore(db_url).read())
    assert sorted(e.key for e in rows) == sorted(f"key-{k}" for k in range(n_keys))
    assert all(r == results[0] for r in results)  # every process was told the same position per key
    assert {e.key: e.position for e in rows} == results[0]
    assert all(e.payload["step"] == int(e.key.split("-")[1]) for e in rows)


def test_process_helper_returns_results_in_order():
    assert _run_processes(_identity, [(1,), (2,)]) == [1, 2]


def _identity(x: int, start: Any) -> int:
    start.wait()
    return x


# --- ordering and follow ------------------------------------------------------------------------------------


def _write_slowly(url: str, writer: int, n: int, start: Any) -> int:
    """Worker: n events in small batches with small random pauses, racing the other writers."""
    store = EventStore(url)
    rng = random.Random(writer)
    start.wait()
    i = 0
    while i < n:
        size = rng.randint(1, 5)
        store.append([ps("live", f"w{writer}-{j}", stream=f"w{writer}") for j in range(i, min(n, i + size))])
        i += size
        time.sleep(rng.random() * 0.004)
    store.close()
    return n


def test_follow_sees_every_event_exactly_once_in_order(db_url):
    store = EventStore(db_url)
    store.append([ps("other", "before")])
    n_writers, per_writer = 3, 120
    expected = {f"w{w}-{j}" for w in range(n_writers) for j in range(per_writer)}
    seen: list[Event] = []
    done = threading.Event()

    def follow() -> None:
        for ev in store.follow(run_id="live", poll_interval=0.005, stop=lambda: len(seen) >= len(expected), timeout=60):
            seen.append(ev)
        done.set()

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    _run_processes(_write_slowly, [(db_url, w, per_writer) for w in range(n_writers)])
    assert done.wait(30), f"follower saw {len(seen)} of {len(expected)}"
    keys = [e.key for e in seen]
    assert len(keys) == len(set(keys)) == len(expected) and set(keys) == expected
    positions = [e.position for e in seen]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert seen == list(store.read(run_id="live"))
    for w in range(n_writers):  # each writer's own order is preserved
        mine = [int(e.key.split("-")[1]) for e in seen if e.stream == f"w{w}"]
        assert mine == sorted(mine)


def test_follow_stops_on_timeout_and_resumes_after_position(db_url):
    store = EventStore(db_url)
    first = store.append([ps("r", "a"), ps("r", "b")])
    t0 = time.monotonic()
    assert [e.key for e in store.follow(timeout=0.3, poll_interval=0.05)] == ["a", "b"]
    assert 0.25 <= time.monotonic() - t0 < 5
    store.append([ps("r", "c")])
    assert [e.key for e in store.follow(after=first[-1].position, timeout=0.1)] == ["c"]
    assert [e.key for e in store.follow(types=[p.CheckpointSaved], stop=lambda: True)] == []


def test_a_slow_appender_holds_back_later_appenders(db_url):
    """Appends are serialised: while one transaction has written but not committed, a second waits, so
    it cannot commit a higher position first (on PostgreSQL a follower reading `position > last` would
    otherwise skip the earlier one for ever)."""
    slow, fast, reader = EventStore(db_url), EventStore(db_url), EventStore(db_url)
    inside, release = threading.Event(), threading.Event()

    @sa.event.listens_for(slow.engine, "commit")
    def _hold(conn):  # called before the DBAPI commit: rows written, lock held, nothing visible
        inside.set()
        release.wait(10)

    out: dict[str, Event] = {}
    t1 = threading.Thread(target=lambda: out.__setitem__("slow", slow.append([ps("r", "slow")])[0]))
    t1.start()
    assert inside.wait(10)
    t2 = threading.Thread(target=lambda: out.__setitem__("fast", fast.append([ps("r", "fast")])[0]))
    t2.start()
    time.sleep(0.4)
    assert "fast" not in out, "second appender committed while the first held the append lock"
    assert list(reader.read()) == []
    release.set()
    t1.join(10)
    t2.join(10)
    assert out["slow"].position < out["fast"].position
    assert [e.key for e in reader.read()] == ["slow", "fast"]


# --- validation ---------------------------------------------------------------------------------------------


class Rogue(BaseModel):
    step: int = 1


def _mutated() -> p.ProblemsSelected:
    payload = p.ProblemsSelected(step=1, problem_ids=["L1/1"])
    payload.problem_ids.append(3)  # type: ignore[arg-type]  # frozen is shallow
    return payload


BAD = {
    "wrong type": (NewEvent("r", "s", "bad", p.ProblemsSelected.model_construct(step="abc", problem_ids=[])), ["'step'", "integer", "'abc'"]),
    "missing field": (NewEvent("r", "s", "bad", p.RunStarted.model_construct(config={}, backend="x")), ["'model'", "Field required"]),
    "unknown field": (NewEvent("r", "s", "bad", {"status": "finished", "stauts": 1}, type="RunFinished"), ["'stauts'", "Extra inputs"]),
    "unregistered type": (NewEvent("r", "s", "bad", {"x": 1}, type="NoSuchEvent"), ["unknown event type 'NoSuchEvent'"]),
    "dict without type": (NewEvent("r", "s", "bad", {"status": "finished"}), ["needs type="]),
    "plain model": (NewEvent("r", "s", "bad", Rogue()), ["must be an EventPayload model or a mapping", "Rogue"]),
    "type mismatch": (NewEvent("r", "s", "bad", p.RunFinished(status="finished"), type="RunStarted"), ["does not match"]),
    "literal": (NewEvent("r", "s", "bad", {"status": "done"}, type="RunFinished"), ["'status'", "'finished'"]),
    "mutated list": (NewEvent("r", "s", "bad", _mutated()), ["no longer matches", "problem_ids", "Expected `str`"]),
    "copy with bad update": (NewEvent("r", "s", "bad", p.RunFinished(status="finished").model_copy(update={"status": "x"})), ["'status'"]),
    "empty key": (NewEvent("r", "s", "", p.RunFinished(status="finished")), ["key must be a non-empty string"]),
    "run_id type": (NewEvent(7, "s", "bad", p.RunFinished(status="finished")), ["run_id must be a non-empty string"]),  # type: ignore[arg-type]
    "not an event": ({"run_id": "r"}, ["expected a NewEvent"]),
}


def test_bad_event_rejects_the_whole_batch(db_url):
    store = EventStore(db_url)
    for case, (bad, fragments) in BAD.items():
        with pytest.raises(InvalidEvent) as info:
            store.append([ps("r", f"{case}-1"), bad, ps("r", f"{case}-2")])
        message = str(info.value)
        assert message.startswith("event #1"), (case, message)
        for fragment in fragments:
            assert fragment in message, (case, message)
        assert info.value.index == 1
        assert list(store.read()) == [], case  # nothing of the batch
    assert store.append([ps("r", "good")])[0].position == 1  # and the store still works


# --- blobs --------------------------------------------------------------------------------------------------


def test_blobs_round_trip(db_url):
    store = EventStore(db_url)
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    digest = store.put_blob(data)
    assert len(digest) == 64 and digest == store.put_blob(data)  # idempotent
    assert store.get_blob(digest) == data
    assert store.has_blob(digest)
    assert store.put_blobs([b"", b"a", b"a"]) == [store.put_blob(b""), store.put_blob(b"a"), store.put_blob(b"a")]
    assert store.get_blob(store.put_blob(b"")) == b""
    with pytest.raises(BlobNotFound):
        store.get_blob("0" * 64)
    with pytest.raises(KeyError):
        store.get_blob("nope")
    assert not store.has_blob("0" * 64)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT COUNT(*) FROM blobs").scalar_one() == 3


# --- runs ---------------------------------------------------------------------------------------------------


def test_runs_status_is_derived_from_events(db_url):
    store = EventStore(db_url)
    assert store.runs() == []
    store.append([
        NewEvent("done", "run", "done/start", EXAMPLES["RunStarted"]),
        NewEvent("live", "run", "live/start", EXAMPLES["RunStarted"]),
        NewEvent("eval", "run", "eval/start", EXAMPLES["EvalRunStarted"]),
        ps("done", "done/p"),
        ps("orphan", "orphan/p"),
    ])
    store.append([
        NewEvent("done", "run", "done/end", p.RunFinished(status="finished")),
        NewEvent("eval", "run", "eval/end", p.EvalRunFinished(status="failed", error="x")),
        ps("live", "live/p"),
    ])
    runs = {r.run_id: r for r in store.runs()}
    assert [r.run_id for r in store.runs()] == ["done", "live", "eval", "orphan"]  # by first event
    assert {k: (r.kind, r.status, r.n_events) for k, r in runs.items()} == {
        "done": ("train", "finished", 3),
        "live": ("train", "running", 2),
        "eval": ("eval:kernelbench", "failed", 2),
        "orphan": ("unknown", "unknown", 1),
    }
    live = runs["live"]
    assert live.started_at <= live.last_event_at and live.started_at.tzinfo is not None
    assert live.first_position < live.last_position
    # a resumed run is running again
    store.append([NewEvent("done", "run", "done/resume", EXAMPLES["RunStarted"])])
    assert {r.run_id: r.status for r in store.runs()}["done"] == "running"
    assert store.has_run("done") and not store.has_run("nope")


# --- append-only --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sql", ["UPDATE events SET stream = 'x'", "DELETE FROM events", "UPDATE blobs SET size = 0", "DELETE FROM blobs"])
def test_database_refuses_update_and_delete(db_url, sql):
    store = EventStore(db_url)
    store.append([ps("r", "k")])
    store.put_blob(b"x")
    with pytest.raises(sa.exc.DBAPIError, match="append-only"):
        with store.engine.begin() as conn:
            conn.exec_driver_sql(sql)
    assert [e.key for e in store.read()] == ["k"]


@pytest.mark.postgres
def test_postgres_refuses_truncate(postgres_url):
    store = EventStore(postgres_url)
    store.append([ps("r", "k")])
    with pytest.raises(sa.exc.DBAPIError, match="append-only"):
        with store.engine.begin() as conn:
            conn.exec_driver_sql("TRUNCATE events")


def test_event_to_dict_is_json_ready(sqlite_url):
    import json

    (event,) = EventStore(sqlite_url).append([ps("r", "k")])
    data = json.loads(json.dumps(event.to_dict()))
    assert data["key"] == "k" and datetime.fromisoformat(data["created_at"]) == event.created_at
    assert event.created_at.tzinfo == UTC


def test_in_memory_sqlite_store():
    store = EventStore("sqlite://")  # one private database per store: handy in other rooms' unit tests
    store.append([ps("r", "k")])
    assert [e.key for e in store.read()] == ["k"]
    assert EventStore("sqlite://").last_position() == 0


def test_follow_with_a_rare_type_filter(db_url):
    store = EventStore(db_url)
    store.append([ps("r", f"noise-{i}") for i in range(50)])

    def later() -> None:
        time.sleep(0.2)
        store.append([ps("r", f"more-{i}") for i in range(50)])
        store.append([NewEvent("r", "run", "end", p.RunFinished(status="finished"))])

    writer = threading.Thread(target=later)
    writer.start()
    seen: list[Event] = []
    for ev in store.follow(run_id="r", types=[p.RunFinished], poll_interval=0.02, stop=lambda: bool(seen), timeout=10):
        seen.append(ev)
    writer.join()
    assert [e.key for e in seen] == ["end"]

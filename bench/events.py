"""Event store throughput: batched append and full replay of N events (default 1,000,000).

    python bench/events.py                        # SQLite file in a temp dir
    python bench/events.py --postgres postgresql+psycopg://root@127.0.0.1:5432/test --pg-n 200000
    python bench/events.py --n 100000 --out /tmp/events.json

The default events are a realistic mix (a third each of SampleGenerated with a 256-character completion
text, KernelEvaluated with a full EvalResult-shaped dict, TurnCompleted: 536 bytes of JSON on average);
`--mix small` uses ~150-byte bookkeeping events instead, to show how replay cost follows payload size. Payload models are built before the
clock starts: the append time is the store's (validation, JSON encoding, idempotency lookup, insert,
commit), not the producer's. Replay is `EventStore.read()` over everything, decoding every payload,
done `--replays` times (median reported, every run kept).
CPU seconds and the load average are recorded too: on a shared 2-core machine the wall-clock numbers
depend on what else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kbrl.events import payloads as p  # noqa: E402
from kbrl.events.store import EventStore, NewEvent  # noqa: E402

TEXT = ("```python\nimport torch\n# fused kernel candidate\n" + "x = y * 2 + 1  # " * 12)[:256]


def eval_result(i: int) -> dict[str, Any]:
    """A dict shaped like `EvalResult.to_dict()` (kbrl/kernels/result.py)."""
    stats = {"median_ms": 0.1 + i % 7, "mean_ms": 0.11, "std_ms": 0.01, "min_ms": 0.09, "max_ms": 0.2, "n_trials": 100}
    return {
        "problem_id": f"L1/{i % 100}",
        "category": "CORRECT" if i % 3 else "COMPILATION_ERROR",
        "format_ok": True,
        "backend": "triton",
        "compiled": bool(i % 3),
        "correct": bool(i % 3),
        "n_correct": 5,
        "n_trials": 5,
        "max_abs_err": 1e-6,
        "tolerance": {"preset": "current", "atol": 1e-4, "rtol": 1e-4},
        "runtime": stats,
        "ref_eager": stats,
        "ref_compile": None,
        "speedup_eager": 1.25,
        "speedup_compile": None,
        "timing_available": True,
        "timing_note": "",
        "cheat_flags": [],
        "error": "",
        "feedback": "",
        "stage_seconds": {"compile": 1.5, "verify": 0.2, "time": 0.8},
        "device": "cuda:0",
        "stdout_tail": "",
        "stderr_tail": "",
        "source_hash": "ab" * 32,
    }


def make_small_event(run_id: str, i: int) -> NewEvent:
    """The light mix: bookkeeping events of ~150 bytes (turns, heartbeats, eval requests)."""
    kind = i % 3
    if kind == 0:
        payload: p.EventPayload = p.TurnCompleted(traj=f"t{i // 3}", turn=0, category="CORRECT", speedup=1.25)
    elif kind == 1:
        payload = p.WorkerHeartbeat(worker="gpu-0", gpu=0, busy=bool(i % 2), host="node-1")
    else:
        payload = p.EvalRequested(sample_id=f"{run_id}/sample/{i}", problem_id=f"L1/{i % 100}")
    return NewEvent(run_id=run_id, stream=f"traj/t{i // 3}", key=f"{run_id}/{i}", payload=payload)


def make_event(run_id: str, i: int) -> NewEvent:
    traj = f"{i // 3 // 8}-{i // 3 % 8}"
    kind = i % 3
    if kind == 0:
        payload: p.EventPayload = p.SampleGenerated(
            step=i // 3000, group=i // 24, traj=traj, turn=0, problem_id=f"L1/{i % 100}",
            completion_ref="cd" * 32, logprobs_ref="ef" * 32, text=TEXT, policy_version=i // 3000,
        )
    elif kind == 1:
        payload = p.KernelEvaluated(
            sample_id=f"{run_id}/sample/{i - 1}", problem_id=f"L1/{i % 100}", worker="gpu-0", gpu=0,
            result=eval_result(i), seconds=2.5,
        )
    else:
        payload = p.TurnCompleted(traj=traj, turn=0, problem_id=f"L1/{i % 100}", category="CORRECT", speedup=1.25)
    return NewEvent(run_id=run_id, stream=f"traj/{traj}", key=f"{run_id}/{i}", payload=payload)


def bench(url: str, n: int, batch: int, parse_n: int, replays_n: int = 3, mix: str = "realistic") -> dict[str, Any]:
    """Append n events in batches, then replay them all; returns the timings."""
    make = make_event if mix == "realistic" else make_small_event
    store = EventStore(url)
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    start_pos = store.last_position()
    append_s = build_s = append_cpu = 0.0
    for lo in range(0, n, batch):
        t0 = time.perf_counter()
        chunk = [make(run_id, i) for i in range(lo, min(n, lo + batch))]
        t1 = time.perf_counter()
        c1 = time.process_time()
        store.append(chunk)
        append_cpu += time.process_time() - c1
        t2 = time.perf_counter()
        build_s += t1 - t0
        append_s += t2 - t1
        if lo and lo % (10 * batch * 10) == 0:
            print(f"  appended {lo:,} ({lo / append_s:,.0f} ev/s)", file=sys.stderr)
    replays: list[tuple[float, float]] = []
    for _ in range(replays_n):
        t0, c0 = time.perf_counter(), time.process_time()
        count = 0
        for _ev in store.read(after=start_pos):
            count += 1
        replays.append((time.perf_counter() - t0, time.process_time() - c0))
        assert count == n, (count, n)
    walls = sorted(w for w, _ in replays)
    replay_s, replay_cpu = statistics.median(walls), statistics.median(c for _, c in replays)
    t0 = time.perf_counter()
    parsed = sum(1 for ev in store.read(after=start_pos, limit=parse_n) if ev.parse() is not None)
    parse_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    run_count = sum(1 for _ in store.read(run_id=run_id, after=start_pos))
    run_replay_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    again = store.append([make(run_id, i) for i in range(batch)])  # all duplicates: pure lookups
    dup_s = time.perf_counter() - t0
    assert len(again) == batch and again[0].position == start_pos + 1
    store.close()
    return {
        "url": sa.make_url(url).render_as_string(hide_password=True),
        "mix": mix,
        "n_events": n,
        "batch": batch,
        "append_s": round(append_s, 3),
        "append_events_per_s": round(n / append_s),
        "append_cpu_s": round(append_cpu, 3),
        "build_payloads_s": round(build_s, 3),
        "replay_s": round(replay_s, 3),
        "replay_runs_s": [round(w, 3) for w, _ in replays],
        "replay_events_per_s": round(n / replay_s),
        "replay_cpu_s": round(replay_cpu, 3),
        "replay_run_filter_s": round(run_replay_s, 3),
        "replay_run_filter_events": run_count,
        "replay_parse_events": parsed,
        "replay_parse_events_per_s": round(parsed / parse_s),
        "duplicate_batch_s": round(dup_s, 4),
    }


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    mem_gib = None
    try:
        mem_kb = int(next(line for line in open("/proc/meminfo") if line.startswith("MemTotal")).split()[1])
        mem_gib = round(mem_kb / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    return {
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "mem_gib": mem_gib,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sa.__version__,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1_000_000, help="events to append and replay")
    ap.add_argument("--batch", type=int, default=1000, help="events per append() call")
    ap.add_argument("--db", type=Path, default=None, help="SQLite file (default: a fresh temp file)")
    ap.add_argument("--postgres", default=None, help="also run on this PostgreSQL URL (events are added to it)")
    ap.add_argument("--pg-n", type=int, default=None, help="events for the PostgreSQL run (default --n)")
    ap.add_argument("--parse-n", type=int, default=100_000, help="events replayed with typed parse()")
    ap.add_argument("--mix", choices=["realistic", "small"], default="realistic", help="payload mix (see module doc)")
    ap.add_argument("--replays", type=int, default=3, help="full replays; the median is reported, all are kept")
    ap.add_argument("--label", default="", help="machine description stored in the result")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "events.json")
    args = ap.parse_args()

    results: dict[str, Any] = {"machine": machine(), "label": args.label, "load_before": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory(prefix="kbrl-bench-") as tmp:
        db = args.db or Path(tmp) / "events.db"
        print(f"SQLite {db}: {args.n:,} events, batches of {args.batch}", file=sys.stderr)
        res = bench(f"sqlite:///{db}", args.n, args.batch, args.parse_n, args.replays, args.mix)
        res["backend"] = "sqlite"
        res["db_bytes"] = sum(f.stat().st_size for f in db.parent.glob(db.name + "*"))
        results["runs"].append(res)
        print(json.dumps(res, indent=2))
    if args.postgres:
        n = args.pg_n or args.n
        print(f"PostgreSQL: {n:,} events, batches of {args.batch}", file=sys.stderr)
        res = bench(args.postgres, n, args.batch, min(args.parse_n, n), args.replays, args.mix)
        res["backend"] = "postgresql"
        results["runs"].append(res)
        print(json.dumps(res, indent=2))
    results["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

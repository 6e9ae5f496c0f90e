"""What the `kbrl db upgrade`, `kbrl runs` and `kbrl replay` commands do; `kbrl/cli.py` wires them to typer.

Plain functions taking plain arguments, so they are testable without the CLI and print with rich
(tables for people) or JSON lines (for scripts: `--json`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from kbrl.events import db, migrate
from kbrl.events.store import Event, EventStore

SUMMARY_CHARS = 100
"""Width of the payload summary column in `kbrl replay`."""


def _out() -> Console:
    return Console(file=sys.stdout, soft_wrap=False)


def _err() -> Console:
    return Console(file=sys.stderr)


def db_upgrade(url: str | None = None) -> None:
    """Apply pending migrations to the store (default `KBRL_DATABASE_URL`) and say what changed."""
    where = db.redact(url)
    before = migrate.current_revision(url)
    head = migrate.upgrade(url)
    if before == head:
        _out().print(f"{where}: already at revision {head} (head)", highlight=False)
    else:
        _out().print(f"{where}: upgraded {before or '<empty>'} -> {head} (head)", highlight=False)


def list_runs(url: str | None = None, as_json: bool = False) -> None:
    """Print every run: id, kind, status, start, last event, event count (oldest first).

    Reserved runs whose id starts with "_" (worker heartbeats) are not runs anyone started: not listed.
    """
    runs = [run for run in EventStore(url).runs() if not run.run_id.startswith("_")]
    if as_json:
        for run in runs:
            sys.stdout.write(json.dumps(run.to_dict()) + "\n")
        return
    if not runs:
        _out().print(f"no runs in {db.redact(url)}", highlight=False)
        return
    table = Table(title=f"runs in {db.redact(url)}")
    for col in ("run id", "kind", "status", "started", "last event"):
        table.add_column(col, no_wrap=col != "run id", min_width=len(col))
    table.add_column("events", justify="right", no_wrap=True, min_width=6)
    colors = {"running": "yellow", "finished": "green", "failed": "red"}
    for run in runs:
        color = colors.get(run.status, "white")
        table.add_row(
            run.run_id,
            run.kind,
            f"[{color}]{run.status}[/]",
            _time(run.started_at),
            _time(run.last_event_at),
            f"{run.n_events:,}",
        )
    _out().print(table)


def replay(
    url: str | None = None,
    run_id: str = "",
    as_json: bool = False,
    types: list[str] | None = None,
) -> int:
    """Print a run's event log (a table, or JSON lines); returns the count, or -1 for an unknown run."""
    store = EventStore(url)
    if not store.has_run(run_id):
        known = [r.run_id for r in store.runs()[-5:]]
        hint = f" (latest runs: {', '.join(known)})" if known else " (the store has no runs)"
        _err().print(f"[red]error:[/] no run {run_id!r} in {db.redact(url)}{hint}", highlight=False)
        return -1
    type_filter = _split(types)
    events = store.read(run_id=run_id, types=type_filter)
    if as_json:
        n = 0
        write = sys.stdout.write
        for event in events:
            write(json.dumps(event.to_dict(), ensure_ascii=False) + "\n")
            n += 1
        return n
    table = Table(title=f"run {run_id}" + (f" — {', '.join(type_filter)}" if type_filter else ""))
    table.add_column("pos", justify="right", no_wrap=True, min_width=3)
    table.add_column("time", no_wrap=True, min_width=14)
    table.add_column("stream", no_wrap=True, overflow="ellipsis", min_width=6, max_width=24)
    table.add_column("type", no_wrap=True, min_width=4)
    table.add_column("payload", min_width=20)
    n = 0
    for event in events:
        table.add_row(
            str(event.position), _time(event.created_at, short=True), event.stream, event.type, summarize(event)
        )
        n += 1
    _out().print(table)
    _out().print(f"{n:,} events", highlight=False)
    return n


def summarize(event: Event, width: int = SUMMARY_CHARS) -> str:
    """A one-line `key=value` digest of a payload: long strings cut, containers sized, None fields left out."""
    parts = []
    for key, value in event.payload.items():
        if value is None or value == {} or value == []:
            continue
        parts.append(f"{key}={_short(value)}")
    text = " ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "…"


def _short(value: Any) -> str:
    if isinstance(value, str):
        one_line = " ".join(value.split())
        return repr(one_line if len(one_line) <= 24 else one_line[:23] + "…")
    if isinstance(value, dict):
        if "category" in value:  # an EvalResult: its verdict is the interesting part
            return f"{{category={value['category']}, …}}"
        return f"{{{len(value)} keys}}"
    if isinstance(value, list):
        return f"[{len(value)} items]"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _time(ts: datetime, short: bool = False) -> str:
    return ts.strftime("%m-%d %H:%M:%S" if short else "%Y-%m-%d %H:%M")


def _split(types: Iterable[str] | None) -> list[str] | None:
    """Accept repeated options and comma lists alike: ["A,B", "C"] -> ["A", "B", "C"]."""
    if not types:
        return None
    return [t.strip() for item in types for t in item.split(",") if t.strip()]

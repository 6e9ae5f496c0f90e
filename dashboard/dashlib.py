"""Shared helpers of the dashboard pages: the store, per-session run projections, selectors, formatting.

The dashboard reads the event store only (plus the metric projections, the same code TensorBoard and
`kbrl replay` use); each browser session folds a run's events once and then only the new ones.
"""

from __future__ import annotations

import difflib
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import streamlit as st

from kbrl import settings
from kbrl.events.store import EventStore, RunInfo
from kbrl.metrics.projections import RunProjection, fmt
from kbrl.training.replay import Sample, decode_numbers
from kbrl.workers.heartbeat import WORKERS_RUN


def refresh_s() -> float:
    """Seconds between live refreshes (`KBRL_DASHBOARD_REFRESH_S`, default 2)."""
    return float(os.environ.get("KBRL_DASHBOARD_REFRESH_S", "2"))


@st.cache_resource(show_spinner=False)
def _store(url: str) -> EventStore:
    return EventStore(url)


def store() -> EventStore:
    """The event store at `KBRL_DATABASE_URL` (one engine per server process)."""
    return _store(settings.database_url())


def projection(run_id: str) -> RunProjection:
    """This session's projection of `run_id`, brought up to date with the events appended since last time."""
    key = f"projection:{settings.database_url()}:{run_id}"
    proj = st.session_state.get(key)
    if proj is None:
        proj = st.session_state[key] = RunProjection(run_id)
    proj.update(store())
    return proj


def runs(kind: str | None = None) -> list[RunInfo]:
    """Runs of the store, newest first, without the workers' heartbeat run; `kind` "train" or "eval"."""
    out = [r for r in store().runs() if r.run_id != WORKERS_RUN]
    if kind is not None:
        out = [r for r in out if r.kind.split(":")[0] == kind]
    return sorted(out, key=lambda r: r.first_position, reverse=True)


def query_list(name: str) -> list[str]:
    """A comma-separated query parameter (`?category=CORRECT,CHEAT`) as a list: pages can be linked to."""
    raw = st.query_params.get(name)
    return [v for v in (raw or "").split(",") if v]


def select_run(kind: str | None = "train", label: str = "Run") -> str | None:
    """A run picker defaulting to `?run=` or the newest run; keeps `?run=` in the URL for sharing."""
    ids = [r.run_id for r in runs(kind)]
    if not ids:
        st.info("No runs in the store yet: start one with `kbrl train --config tiny_cpu`.")
        return None
    wanted = st.query_params.get("run")
    index = ids.index(wanted) if wanted in ids else 0
    run_id = st.selectbox(label, ids, index=index, key=f"run-select-{kind}")
    if run_id != wanted:
        st.query_params["run"] = run_id
    return run_id


def ago(when: datetime | None) -> str:
    """'12 s ago' style age of a timestamp."""
    if when is None:
        return "-"
    seconds = (datetime.now(UTC) - when).total_seconds()
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return when.strftime("%Y-%m-%d %H:%M")


def opt(value: float | None, digits: int = 4) -> str:
    """`fmt`, the projections' number format (the browser test compares against it)."""
    return fmt(value, digits)


_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)(?:```|$)", re.S)


def kernel_source(text: str) -> str:
    """The code of a completion: its first fenced block (the evaluator extracts the same), else the text."""
    m = _FENCE.search(text)
    return m.group(1).rstrip() if m else text


def diff(previous: str, current: str) -> str:
    """Unified diff of two kernel sources (previous turn → this turn)."""
    lines = difflib.unified_diff(previous.splitlines(), current.splitlines(), "previous turn", "this turn",
                                 lineterm="")  # fmt: skip
    return "\n".join(lines) or "(no change)"


@st.cache_resource(show_spinner=False)
def _tokenizer(path: str) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


def tokenizer_file(config: dict[str, Any], run_id: str, model: str) -> Path | None:
    """Where the run's tokenizer lies on this host, if anywhere: kbrl's tiny model in the run's log_path,
    a local model directory, or the Hugging Face cache (nothing is downloaded)."""
    candidates = []
    log_path = config.get("log_path")
    if model == "tiny" and isinstance(log_path, str):
        candidates.append(Path(log_path.replace("{run_id}", run_id)) / "tiny-model" / "tokenizer.json")
    candidates.append(Path(model) / "tokenizer.json")
    for path in candidates:
        if path.is_file():
            return path
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "tokenizer.json")
    except Exception:  # no hub package, or an id it cannot parse: no tokenizer, the page says so
        return None
    return Path(cached) if isinstance(cached, str) else None


def prompt_text(proj: RunProjection, sample: Sample) -> str | None:
    """The prompt the policy saw, decoded from its stored token ids with the run's tokenizer (None when
    the tokenizer is not on this host)."""
    if sample.prompt_ref is None:
        return None
    path = tokenizer_file(proj.state.config, proj.run_id, proj.state.model)
    if path is None:
        return None
    try:
        ids = decode_numbers(store().get_blob(sample.prompt_ref))
        return str(_tokenizer(str(path)).decode(ids, skip_special_tokens=False))
    except Exception as exc:  # a view must not fail on one undecodable prompt
        return f"(could not decode the prompt: {type(exc).__name__}: {exc})"


CATEGORY_COLOURS = {
    "CORRECT": "green",
    "CORRECTNESS_ERROR": "orange",
    "COMPILATION_ERROR": "red",
    "RUNTIME_ERROR": "red",
    "TIMEOUT": "violet",
    "FORMAT_ERROR": "gray",
    "CHEAT": "red",
    "UNVERIFIED": "blue",
}


def badge(category: str | None) -> str:
    """A coloured Markdown badge for a verdict category."""
    if category is None:
        return ":gray-badge[pending]"
    return f":{CATEGORY_COLOURS.get(category, 'gray')}-badge[{category}]"

"""Kernel browser: every judged (or queued) kernel of the chosen runs, filtered by problem, level, category,
backend and speedup range; pick one to read its source, verdict and feedback.

Filters can come from the URL, so a view can be linked: `?run=ID&category=CORRECT&backend=triton&level=1&
speedup_min=1.0&speedup_max=8`.
"""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st
from dashlib import badge, kernel_source, opt, projection, query_list, runs

from kbrl.metrics.projections import SampleRow

st.title("Kernels")


def pick(label: str, options: list[str], param: str) -> list[str]:
    """A multiselect whose default comes from the `param` query parameter (empty = no filter)."""
    wanted = [o for o in query_list(param) if o in options]
    return st.multiselect(label, options, default=wanted, key=f"filter-{param}")


def matches(row: SampleRow, problems: list[str], levels: list[str], categories: list[str], backends: list[str],
            speed: tuple[float, float] | None) -> bool:  # fmt: skip
    """Whether a kernel passes every filter; with a speedup range, kernels without a speedup are left out."""
    if problems and row.problem_id not in problems:
        return False
    if levels and str(row.level) not in levels:
        return False
    if categories and (row.category or "pending") not in categories:
        return False
    if backends and (row.backend or "-") not in backends:
        return False
    if speed is not None:
        return row.speedup is not None and speed[0] <= row.speedup <= speed[1]
    return True


all_runs = [r.run_id for r in runs(None)]
if not all_runs:
    st.info("No runs in the store yet.")
    st.stop()
chosen = [r for r in query_list("run") if r in all_runs] or all_runs[:10]
run_ids = st.multiselect("Runs", all_runs, default=chosen, key="filter-run")
rows = [row for run_id in run_ids for row in projection(run_id).sample_rows()]

c1, c2, c3, c4 = st.columns(4)
with c1:
    problems = pick("Problem", sorted({r.problem_id for r in rows}), "problem")
with c2:
    levels = pick("Level", sorted({str(r.level) for r in rows}), "level")
with c3:
    categories = pick("Category", sorted({r.category or "pending" for r in rows}), "category")
with c4:
    backends = pick("Backend", sorted({r.backend or "-" for r in rows}), "backend")
lo_param, hi_param = st.query_params.get("speedup_min"), st.query_params.get("speedup_max")
use_speed = st.checkbox("Filter by speedup (vs eager)", value=lo_param is not None or hi_param is not None)
speed = None
if use_speed:
    known = [r.speedup for r in rows if r.speedup is not None]
    top = max([8.0, *known])
    speed = st.slider("Speedup range", 0.0, float(top), (float(lo_param or 0.0), float(hi_param or top)), step=0.05)

shown = [r for r in rows if matches(r, problems, levels, categories, backends, speed)]
st.markdown(f"**{len(shown)} kernels match** (of {len(rows)} in {len(run_ids)} run(s))")
if not shown:
    st.stop()
columns = ["run_id", "sample_id", "step", "turn", "problem_id", "level", "category", "backend", "speedup",
           "speedup_compile", "reward", "advantage", "eval_seconds", "worker"]  # fmt: skip
frame = pd.DataFrame([{c: r.to_dict()[c] for c in columns} for r in shown])
st.dataframe(frame, hide_index=True)

labels = [f"{r.run_id} · {r.sample_id}" for r in shown]
choice = st.selectbox("Kernel", range(len(shown)), format_func=lambda i: labels[i], key="kernel-pick")
row = shown[choice]
proj = projection(row.run_id)
st.markdown(f"{badge(row.category)} `{row.problem_id}` · backend `{row.backend or '-'}` · speedup "
            f"`{opt(row.speedup, 3)}` (compile `{opt(row.speedup_compile, 3)}`) · reward `{opt(row.reward)}` · "
            f"advantage `{opt(row.advantage)}`")  # fmt: skip
left, right = st.columns([3, 2])
with left:
    text = proj.text(row.sample_id)
    st.code(kernel_source(text) if text is not None else "(source not stored for this kernel)", language="python")
with right:
    verdict = proj.verdict(row.sample_id) or {}
    if verdict.get("feedback"):
        st.markdown("**Feedback**")
        st.text(str(verdict["feedback"]))
    if verdict:
        with st.expander("verdict (KernelEvaluated.result)"):
            st.code(json.dumps(verdict, indent=2, default=str), language="json")

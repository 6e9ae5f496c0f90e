"""Run metrics: reward, pass rates, per-level numbers, timings and histograms over steps, refreshed live."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st
from dashlib import opt, projection, refresh_s, select_run

st.title("Run metrics")
run_id = select_run("train")

# The per-step table (numbers as `kbrl.metrics.projections.fmt` prints them, as the browser test expects).
TABLE_COLUMNS = ["reward/mean", "reward/std", "reward/min", "reward/max", "eval/format_rate", "eval/compile_rate",
                 "eval/correct_rate", "eval/cheat_rate", "progress/completion_fraction", "optim/learning_rate",
                 "train/loss", "time/total_s", "time/rollout_s", "time/train_s", "time/save_s"]  # fmt: skip


def chart(frame: pd.DataFrame, prefix: str, title: str, strip: bool = True, suffix: str = "") -> None:
    """A line chart over steps of the columns named `prefix…suffix`."""
    cols = [c for c in frame.columns if c.startswith(prefix) and c.endswith(suffix)]
    if not cols:
        return
    st.markdown(f"**{title}**")
    data = frame[cols].rename(columns={c: c.removeprefix(prefix) for c in cols} if strip else {})
    st.line_chart(data)


@st.fragment(run_every=refresh_s() * 2)
def metrics_view(run_id: str) -> None:
    proj = projection(run_id)
    scalars = proj.scalars()
    if not scalars:
        st.info("This run has no samples yet.")
        return
    frame = pd.DataFrame.from_dict(scalars, orient="index").sort_index()
    frame.index.name = "step"
    last_step = max(scalars)
    last = scalars[last_step]
    done = sum(proj.state.steps[n].done for n in scalars)
    cols = st.columns(5)
    cols[0].metric("Steps done", f"{done}/{proj.n_steps or '?'}")
    cols[1].metric(f"Reward mean (step {last_step})", opt(last.get("reward/mean")))
    cols[2].metric("Correct rate", opt(last.get("eval/correct_rate")))
    cols[3].metric("Compile rate", opt(last.get("eval/compile_rate")))
    cols[4].metric("Status", proj.state.status or "running")

    left, right = st.columns(2)
    with left:
        chart(frame, "reward/", "Reward")
        chart(frame, "level/", "Per level", strip=False)
        chart(frame, "train/loss", "Loss", strip=False, suffix="loss")
    with right:
        chart(frame, "eval/", "Rates", suffix="_rate")
        chart(frame, "time/", "Seconds per step")
        chart(frame, "rollout/worker_idle_frac", "Evaluation workers idle (fraction of the rollout)", strip=False)
        chart(frame, "multiturn/", "Multi-turn")

    st.subheader("Per step")
    table = pd.DataFrame({c: [opt(scalars[n].get(c)) for n in sorted(scalars)] for c in TABLE_COLUMNS},
                         index=pd.Index(sorted(scalars), name="step"))  # fmt: skip
    st.table(table)
    level_cols = sorted(c for c in frame.columns if c.startswith(("level/", "multiturn/")))
    if level_cols:
        st.subheader("Per level and turn")
        st.table(pd.DataFrame({c: [opt(scalars[n].get(c)) for n in sorted(scalars)] for c in level_cols},
                              index=pd.Index(sorted(scalars), name="step")))  # fmt: skip

    st.subheader("Distributions")
    step = st.selectbox("Step", sorted(scalars), index=len(scalars) - 1, key="hist-step")
    hists = proj.step_histograms(step)
    for col, (tag, values) in zip(st.columns(max(1, len(hists))), hists.items(), strict=False):
        counts, edges = np.histogram(values, bins=min(20, max(1, len(set(values)))))
        with col:
            st.markdown(f"**{tag}** ({len(values)} values)")
            st.bar_chart(pd.DataFrame({"count": counts}, index=[f"{e:.3g}" for e in edges[:-1]]))


if run_id is not None:
    metrics_view(run_id)

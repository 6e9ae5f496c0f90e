"""Runs: every training and evaluation run with its status and headline metrics, refreshed live."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from dashlib import ago, opt, projection, refresh_s, runs

st.title("Runs")


@st.fragment(run_every=refresh_s())
def runs_table() -> None:
    """One row per run; training runs get the last step's projected reward and rates."""
    infos = runs(None)
    if not infos:
        st.info("No runs in the store yet: start one with `kbrl train --config tiny_cpu`.")
        return
    rows = []
    for info in infos:
        row = {"run": info.run_id, "kind": info.kind, "status": info.status, "events": str(info.n_events),
               "started": info.started_at.strftime("%Y-%m-%d %H:%M:%S"), "last event": ago(info.last_event_at),
               "steps": "-", "reward mean": "-", "correct rate": "-", "compile rate": "-", "kernels judged": "-"}  # fmt: skip
        proj = projection(info.run_id)
        if info.kind == "train":
            steps = proj.steps()
            done = sum(proj.state.steps[n].done for n in steps)
            row["steps"] = f"{done}/{proj.n_steps or '?'}"
            if steps:
                last = proj.step_scalars(steps[-1])
                row["reward mean"] = opt(last.get("reward/mean"))
                row["correct rate"] = opt(last.get("eval/correct_rate"))
                row["compile rate"] = opt(last.get("eval/compile_rate"))
        row["kernels judged"] = str(len(proj.verdicts))
        rows.append(row)
    running = sum(r.status == "running" for r in infos)
    a, b, c = st.columns(3)
    a.metric("Runs", len(infos))
    b.metric("Running", running)
    c.metric("Kernels judged", sum(int(r["kernels judged"]) for r in rows))
    st.caption("Reward and rates are those of each training run's latest step (projected from its events).")
    st.table(pd.DataFrame(rows).set_index("run"))


runs_table()

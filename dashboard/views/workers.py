"""Workers: each worker's last heartbeat (busy or idle, on which GPU, which job) and the queue depth, i.e.
evaluations requested but not yet judged, per running run (from the store, whatever the broker)."""

from __future__ import annotations

import pandas as pd
import streamlit as st
from dashlib import refresh_s, runs, store

from kbrl.workers.status import run_progress, worker_states

st.title("Workers")


@st.fragment(run_every=refresh_s())
def workers_view() -> None:
    workers = worker_states(store())
    depth = []
    for info in runs(None):
        if info.status != "running":
            continue
        progress = run_progress(store(), info.run_id)
        if progress.in_flight:
            depth.append({"run": info.run_id, "in flight": progress.in_flight, "done": progress.done,
                          "failed": progress.failed, "requested": progress.requested})  # fmt: skip
    alive = [w for w in workers if w.alive]
    cols = st.columns(4)
    cols[0].metric("Workers alive", len(alive))
    cols[1].metric("Busy", sum(w.busy for w in alive))
    cols[2].metric("Idle", sum(not w.busy for w in alive))
    cols[3].metric("Queue depth", sum(d["in flight"] for d in depth))
    st.subheader("Heartbeats")
    if workers:
        st.table(pd.DataFrame([{"worker": w.worker, "gpu": "-" if w.gpu is None else str(w.gpu),
                                "state": ("busy" if w.busy else "idle") if w.alive else "gone",
                                "job": w.job or "-", "last heartbeat": f"{w.seconds_ago:.0f} s ago"}
                               for w in workers]).set_index("worker"))  # fmt: skip
    else:
        st.info("No worker heartbeat in the store (in-process evaluation writes none; `kbrl worker` does).")
    st.subheader("Queue depth (requested, not yet judged)")
    if depth:
        st.table(pd.DataFrame(depth).set_index("run"))
    else:
        st.caption("Nothing in flight.")


workers_view()

"""Enqueue eval: a form that records an evaluation run and queues one job (`kbrl enqueue eval`, one kernel).

With `KBRL_BROKER_URL` the job goes to the Celery workers; without a broker it runs in the dashboard's own
process through the in-process queue (fine for a CPU check on one machine, not for a fleet). Either way the
verdict arrives as a `KernelEvaluated` event, shown on the Kernels page.
"""

from __future__ import annotations

import uuid

import streamlit as st
from dashlib import store

from kbrl import settings
from kbrl.evalrun import Candidate
from kbrl.kernels.evaluator import TOLERANCES, EvalConfig
from kbrl.problems import builtin_solutions, load_problems
from kbrl.problems.model import Problem
from kbrl.workers.enqueue import enqueue_eval
from kbrl.workers.queue import CeleryQueue, JobQueue, LocalQueue

st.title("Enqueue an evaluation")


@st.cache_resource(show_spinner=False)
def _queue(database_url: str, broker_url: str | None) -> JobQueue:
    """One queue per server process, kept open (an in-process pool must outlive the page run)."""
    if broker_url:
        return CeleryQueue(store(), broker_url)
    return LocalQueue(store(), workers=1, worker_name="dashboard")


@st.cache_data(show_spinner=False)
def _problems(source: str) -> list[Problem]:
    return load_problems(source)


broker = settings.broker_url()
st.caption(f"Queue: Celery on `{broker}`" if broker else
           "Queue: in-process (no KBRL_BROKER_URL): the job runs inside this dashboard's process.")  # fmt: skip

source = st.text_input("Problem source", value=st.query_params.get("source", "builtin"))
try:
    problems = _problems(source)
except Exception as exc:  # a bad source name or a missing KERNELBENCH_ROOT: say so, keep the page up
    st.error(f"cannot load problems from {source!r}: {exc}")
    st.stop()
ids = [p.id for p in problems]
wanted = st.query_params.get("problem")
with st.form("enqueue"):
    problem_id = st.selectbox("Problem", ids, index=ids.index(wanted) if wanted in ids else 0)
    origin = st.radio("Kernel", ["kbrl's reference solution (builtin problems)", "paste below"], horizontal=True)
    backend = st.selectbox("Reference solution backend", ["triton", "cuda"])
    pasted = st.text_area("Kernel source (a ModelNew in a ```python block, or plain code)", height=200)
    c1, c2, c3, c4 = st.columns(4)
    device = c1.selectbox("Device", ["cuda", "cpu"], index=0 if broker else 1)
    trials = c2.number_input("Correctness trials", min_value=1, max_value=20, value=2)
    tolerance = c3.selectbox("Tolerance", sorted(TOLERANCES), index=sorted(TOLERANCES).index("v0.1"))
    timeout = c4.number_input("Timeout (s)", min_value=5.0, value=120.0)
    submitted = st.form_submit_button("Enqueue")

if submitted:
    problem = problems[ids.index(problem_id)]
    try:
        if origin.startswith("kbrl"):
            text = builtin_solutions(problem)[backend]
        else:
            text = pasted
            if not text.strip():
                raise ValueError("paste a kernel, or choose kbrl's reference solution")
        candidate = Candidate(f"{problem.id}/dashboard-{uuid.uuid4().hex[:6]}", problem, text)
        config = EvalConfig(n_trials=int(trials), tolerance=tolerance, timeout_s=float(timeout))
        run_id, jobs = enqueue_eval(store(), _queue(settings.database_url(), broker), [candidate], config,
                                    device, kind="dashboard")  # type: ignore[arg-type]  # fmt: skip
    except (ValueError, KeyError) as exc:
        st.error(f"not enqueued: {exc}")
    else:
        st.success(f"enqueued run {run_id}: {len(jobs)} job ({candidate.sample_id})")
        st.session_state["last-enqueued"] = run_id
if st.session_state.get("last-enqueued"):
    run_id = st.session_state["last-enqueued"]
    st.page_link("views/kernels.py", label=f"See {run_id} on the Kernels page", query_params={"run": run_id})

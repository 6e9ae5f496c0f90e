"""kbrl dashboard: live runs, trajectories, kernels, workers, and an eval-job form, read from the event store.

Start it with `kbrl dashboard` (binds 127.0.0.1) or
`KBRL_DATABASE_URL=... streamlit run dashboard/app.py --server.address 127.0.0.1`.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the pages import `dashlib` from this folder, however Streamlit was started
    sys.path.insert(0, str(HERE))

import streamlit as st  # noqa: E402

st.set_page_config(page_title="kbrl", page_icon=":material/monitoring:", layout="wide")

PAGES = [
    st.Page(HERE / "views" / "runs.py", title="Runs", icon=":material/list:", url_path="runs", default=True),
    st.Page(HERE / "views" / "run.py", title="Run metrics", icon=":material/show_chart:", url_path="metrics"),
    st.Page(HERE / "views" / "live.py", title="Live trajectories", icon=":material/bolt:", url_path="live"),
    st.Page(HERE / "views" / "kernels.py", title="Kernels", icon=":material/code:", url_path="kernels"),
    st.Page(HERE / "views" / "workers.py", title="Workers", icon=":material/dns:", url_path="workers"),
    st.Page(HERE / "views" / "enqueue.py", title="Enqueue eval", icon=":material/add_task:", url_path="enqueue"),
]

st.navigation(PAGES).run()

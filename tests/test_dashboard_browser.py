"""The dashboard in a real browser: a CPU training run fills a SQLite store, `streamlit run dashboard/app.py`
serves it on 127.0.0.1, and headless Chromium (Selenium) opens every page, checks that the numbers shown are
the metric projections' (`kbrl.metrics.projections`), sees an event appended during the test appear on the
live page without a reload, and submits the eval form. Screenshots go to `$KBRL_TEST_ARTIFACTS/dashboard`
(default `test-artifacts/dashboard` in the checkout).

Needs the Debian packages `chromium` and `chromium-driver` and the Python packages `streamlit`, `selenium`
(CI installs them); skipped with the reason when any is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kbrl.events.payloads import (
    EvalRequested,
    EvalRunStarted,
    KernelEvaluated,
    SampleGenerated,
    WorkerHeartbeat,
)
from kbrl.events.store import EventStore, NewEvent
from kbrl.metrics.projections import fmt, project_run
from kbrl.metrics.serve import streamlit_command

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
RUN = "dash"
N_STEPS = 2

try:
    import selenium  # noqa: F401
    import streamlit  # noqa: F401

    MISSING = None
except ImportError as exc:
    MISSING = f"python package missing: {exc.name} (pip install streamlit selenium)"
if MISSING is None and not (CHROMIUM and CHROMEDRIVER):
    MISSING = "chromium / chromedriver not installed (apt-get install -y chromium chromium-driver)"

pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

ARTIFACTS = Path(os.environ.get("KBRL_TEST_ARTIFACTS") or ROOT / "test-artifacts") / "dashboard"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KBRL_BROKER_URL"}  # in-process queue: no fleet needed
    env.update(KBRL_DATABASE_URL=url, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", KBRL_DASHBOARD_REFRESH_S="1")
    return env


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A real CPU training run (kbrl's tiny model, two built-in problems) in a fresh SQLite store."""
    tmp = tmp_path_factory.mktemp("dashboard")
    url = f"sqlite:///{tmp / 'kbrl.db'}"
    done = subprocess.run([sys.executable, "-m", "kbrl.cli", "train", "--config", "tiny_cpu", f"run_id={RUN}",
                           f"n_steps={N_STEPS}", f"log_path={tmp}/runs/{{run_id}}"],
                          env=_env(url), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return url, tmp


@pytest.fixture(scope="module")
def server(trained: tuple[str, Path]) -> Iterator[str]:
    """`streamlit run dashboard/app.py` on a free localhost port (the command `kbrl dashboard` runs)."""
    url, tmp = trained
    port = _free_port()
    log = open(tmp / "streamlit.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(streamlit_command("127.0.0.1", port) + ["--server.fileWatcherType", "none"],
                            cwd=ROOT, env=_env(url), stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "streamlit.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{base}/_stcore/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "streamlit did not come up"
            time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--no-first-run",
                "--disable-extensions", "--window-size=1400,2000"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


# --- reading the page ------------------------------------------------------------------------------------

_TABLES_JS = """return Array.from(document.querySelectorAll('[data-testid="stTable"] table')).map(t =>
  Array.from(t.rows).map(r => Array.from(r.cells).map(c => c.innerText.trim())));"""
_METRICS_JS = """const out = {}; document.querySelectorAll('[data-testid="stMetric"]').forEach(m => {
  const l = m.querySelector('[data-testid="stMetricLabel"]'), v = m.querySelector('[data-testid="stMetricValue"]');
  if (l && v) out[l.innerText.trim()] = v.innerText.trim(); }); return out;"""


def tables(driver: Any) -> list[list[list[str]]]:
    """Every `st.table` on the page as rows of cell texts (read in one script call: the page re-renders)."""
    return driver.execute_script(_TABLES_JS)


def records(table: list[list[str]]) -> dict[str, dict[str, str]]:
    """A table as {first cell: {header: cell}}."""
    header = table[0]
    return {row[0]: dict(zip(header[1:], row[1:], strict=True)) for row in table[1:]}


def metric_values(driver: Any) -> dict[str, str]:
    return driver.execute_script(_METRICS_JS)


def text(driver: Any) -> str:
    return driver.execute_script("return document.body.innerText")


def wait_for(driver: Any, what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
    """Poll `check()` until it returns something truthy; fail with `what` and the page text otherwise."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # the page re-renders under us (stale elements, half-drawn tables)
            last_error = exc
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} ({last_error!r}); page text:\n{text(driver)[:3000]}")


def shoot(driver: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{name}.png"))


# --- the test ------------------------------------------------------------------------------------------------


def test_dashboard_pages_show_the_projections_and_update_live(trained: tuple[str, Path], server: str,
                                                              browser: Any) -> None:  # fmt: skip
    sys.path.insert(0, str(ROOT / "dashboard"))
    from dashlib import kernel_source  # what the pages show of a completion: its code block

    url, _ = trained
    store = EventStore(url)
    proj = project_run(store, RUN)
    scalars = proj.scalars()
    assert sorted(scalars) == list(range(N_STEPS))
    last = scalars[N_STEPS - 1]

    # Runs: status and the last step's headline numbers.
    browser.get(server + "/")
    runs = wait_for(browser, "the runs table", lambda: records(tables(browser)[0]).get(RUN))
    assert runs["kind"] == "train" and runs["status"] == "finished" and runs["steps"] == f"{N_STEPS}/{N_STEPS}"
    assert runs["reward mean"] == fmt(last["reward/mean"])
    assert runs["correct rate"] == fmt(last["eval/correct_rate"])
    assert runs["compile rate"] == fmt(last["eval/compile_rate"])
    assert runs["kernels judged"] == str(len(proj.verdicts))
    shoot(browser, "1-runs")

    # Run metrics: every cell of the per-step table, and the headline metrics.
    browser.get(f"{server}/metrics?run={RUN}")

    def per_step() -> dict[str, dict[str, str]] | None:
        found = [records(t) for t in tables(browser) if t and t[0] and t[0][0] == "step"]
        return found[0] if found and len(found[0]) == N_STEPS else None

    table = wait_for(browser, "the per-step table", per_step)
    columns = next(iter(table.values())).keys()
    assert {"reward/mean", "reward/std", "eval/correct_rate", "time/total_s", "optim/learning_rate"} <= set(columns)
    for step, values in scalars.items():
        assert table[str(step)] == {c: fmt(values.get(c)) for c in columns}, step
    shown = metric_values(browser)
    assert shown[f"Reward mean (step {N_STEPS - 1})"] == fmt(last["reward/mean"])
    assert shown["Correct rate"] == fmt(last["eval/correct_rate"])
    assert shown["Steps done"] == f"{N_STEPS}/{N_STEPS}"
    wait_for(browser, "the charts", lambda: len(browser.find_elements("css selector", '[data-testid="stVegaLiteChart"]')) >= 4)
    shoot(browser, "2-run-metrics")

    # Kernels: the count of kernels of one category, and the first one's details.
    rows = proj.sample_rows()
    category = rows[0].category
    assert category is not None
    matching = [r for r in rows if r.category == category]
    browser.get(f"{server}/kernels?run={RUN}&category={category}")
    wait_for(browser, "the kernel count", lambda: f"{len(matching)} kernels match (of {len(rows)} in 1 run(s))" in text(browser))
    first = matching[0]
    wait_for(browser, "the first kernel's details", lambda: f"reward {fmt(first.reward)}" in text(browser).replace("\n", " "))
    source_line = kernel_source(first_text := proj.text(first.sample_id) or "").strip().splitlines()[0]
    assert first_text
    wait_for(browser, "the kernel's source", lambda: any(source_line in c.text for c in
             browser.find_elements("css selector", '[data-testid="stCode"]')))  # fmt: skip
    wait_for(browser, "the kernel table", lambda: browser.find_elements("css selector", '[data-testid="stDataFrame"] canvas'))
    time.sleep(1)  # let the grid paint before the screenshot
    shoot(browser, "3-kernels")

    # Workers: a heartbeat and a queued job appended now show up (the page reads the store, nothing else).
    store.append([
        NewEvent("_workers", "worker/w-test", "hb/w-test/1", WorkerHeartbeat(worker="w-test", gpu=0, busy=True, job="q/x")),
        NewEvent("queued", "run/queued", "queued/started", EvalRunStarted(kind="test", n_candidates=1)),
        NewEvent("queued", "sample/x", "queued/x/requested", EvalRequested(sample_id="x", problem_id="builtin/L1/5")),
    ])  # fmt: skip
    browser.get(server + "/workers")
    wait_for(browser, "the worker panel", lambda: metric_values(browser).get("Workers alive") == "1")
    shown = metric_values(browser)
    assert (shown["Busy"], shown["Idle"], shown["Queue depth"]) == ("1", "0", "1")
    heartbeats = wait_for(browser, "the heartbeat table", lambda: records(tables(browser)[0]).get("w-test"))
    assert (heartbeats["state"], heartbeats["gpu"], heartbeats["job"]) == ("busy", "0", "q/x")
    shoot(browser, "4-workers")

    # Live trajectories: the latest step's trajectories; then a new turn appended to one of them appears
    # without a reload (the page's fragment polls the store).
    browser.get(f"{server}/live?run={RUN}")
    position = store.last_position()
    wait_for(browser, "the live page", lambda: f"last event position: {store.last_position(RUN)}" in text(browser))
    step = proj.state.steps[N_STEPS - 1]
    page = text(browser)
    for traj in {s.traj for s in step.samples.values()}:
        assert traj in page
    shoot(browser, "5-live-before")
    target = sorted(step.samples.values(), key=lambda s: s.traj)[0]
    marker = "live_marker_kernel"
    new_id = f"{RUN}/{target.traj}/turn1"
    body = f"```python\nimport torch\n\ndef {marker}(x):\n    return torch.relu(x)\n```"
    appended = store.append([
        NewEvent(RUN, f"traj/{target.traj}", new_id, SampleGenerated(step=target.step, group=target.group,
                 traj=target.traj, turn=1, problem_id=target.problem_id, text=body)),
        NewEvent(RUN, f"sample/{new_id}", f"{RUN}/{new_id}/evaluated", KernelEvaluated(sample_id=new_id,
                 problem_id=target.problem_id, worker="w-test", result={"category": "CORRECT", "format_ok": True,
                 "compiled": True, "correct": True, "backend": "triton"}, seconds=0.5)),
    ])  # fmt: skip
    assert appended[-1].position > position
    wait_for(browser, "the appended turn", lambda: f"last event position: {appended[-1].position}" in text(browser)
             and marker in text(browser), timeout=30)  # fmt: skip
    page = text(browser)
    assert f"{target.traj} · {target.problem_id} · group {target.group} · 2 turn(s)" in page.replace("\n", " ")
    assert "turn 1" in page and "eval 0.50 s on w-test" in page
    shoot(browser, "6-live-after-append")
    # Inside the (collapsed) expanders: the prompt decoded from its stored token ids, and the diff.
    open_js = """Array.from(document.querySelectorAll('[data-testid="stExpander"] details')).slice(0, 8)
      .forEach(d => { if (!d.open) d.querySelector('summary').click(); });"""

    def opened() -> str | None:
        browser.execute_script(open_js)  # (again, if a refresh redrew them closed)
        page = text(browser)
        return page if f"+def {marker}(x):" in page and "You are given the following PyTorch" in page else None

    content = wait_for(browser, "the prompt and the diff", opened)
    assert "-class ModelNew" in content or "-import triton" in content  # turn 0's lines, gone in turn 1
    browser.execute_script("window.scrollTo(0, 0); document.querySelectorAll('section, div').forEach(e => "
                           "{ if (e.scrollTop) e.scrollTop = 0; })")  # fmt: skip
    shoot(browser, "7-live-expanded")

    # Enqueue: the form records an eval run and queues the job; the in-process queue judges it.
    before = {r.run_id for r in store.runs()}
    browser.get(f"{server}/enqueue?problem=builtin/L1/5")
    button = wait_for(browser, "the form", lambda: [b for b in browser.find_elements("css selector", "button")
                                                    if b.text.strip() == "Enqueue"])  # fmt: skip
    button[0].click()
    wait_for(browser, "the confirmation", lambda: "enqueued run" in text(browser))
    shoot(browser, "8-enqueue")
    (new_run,) = [r for r in store.runs() if r.run_id not in before]
    assert new_run.kind == "eval:dashboard"
    requested = list(store.read(run_id=new_run.run_id, types=[EvalRequested]))
    assert len(requested) == 1 and requested[0].payload["problem_id"] == "builtin/L1/5"
    verdicts = wait_for(browser, "the verdict", lambda: list(store.read(run_id=new_run.run_id, types=[KernelEvaluated])),
                        timeout=120)  # fmt: skip
    assert verdicts[0].payload["result"]["category"] == "CORRECT"  # kbrl's own ReLU solution
    # The confirmation links to the Kernels page of the new run, which shows the judged kernel.
    link = wait_for(browser, "the link", lambda: [a for a in browser.find_elements("css selector", "a")
                                                  if new_run.run_id in a.text])  # fmt: skip
    link[0].click()
    wait_for(browser, "the new run's kernel", lambda: "1 kernels match (of 1 in 1 run(s))" in text(browser)
             and "CORRECT" in text(browser))  # fmt: skip
    shoot(browser, "9-enqueued-kernel")

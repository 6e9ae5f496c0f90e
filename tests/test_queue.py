"""The job queue, for real: Celery worker processes on this machine's Redis, and the in-process queue.

Celery tests start `kbrl worker` as a subprocess (prefork pool, not eager mode) against the Redis at
127.0.0.1:6379 (a database number of its own per test), with a SQLite store in the test's tmp dir. The
Redis-restart test runs a private redis-server with the persistence setting the README documents.
Skipped, with the reason, when no Redis server is reachable.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kbrl.evalrun import builtin_candidates
from kbrl.events.payloads import EvalFailed, KernelEvaluated, WorkerHeartbeat
from kbrl.events.store import EventStore
from kbrl.kernels.evaluator import EvalConfig
from kbrl.problems import get_problem
from kbrl.workers.heartbeat import WORKERS_RUN
from kbrl.workers.jobs import EvalJob, evaluated_key, wait_for_verdicts
from kbrl.workers.queue import CeleryQueue, LocalQueue
from kbrl.workers.status import run_progress

REDIS = "redis://127.0.0.1:6379"
CORPUS = Path(__file__).parent / "corpus"
CONFIG = EvalConfig(device="cpu", n_trials=2, timeout_s=120)


def _redis_up(host: str = "127.0.0.1", port: int = 6379) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


needs_redis = pytest.mark.skipif(not _redis_up(), reason="no Redis server at 127.0.0.1:6379")


def _jobs(run_id: str, n: int) -> list[EvalJob]:
    """`n` jobs: 4 real Triton evaluations (interpreter) and the rest rejected early by the evaluator
    (no code block, or a static cheat), so the queue is exercised at volume in seconds."""
    real = builtin_candidates(level=1, backend="triton")[:4]
    relu = get_problem("builtin/L1/4")
    cheat = (CORPUS / "cheats" / "plain_pytorch.py").read_text()
    jobs = [EvalJob.for_problem(run_id, c.sample_id, c.problem, c.text, "cpu", CONFIG, expected=n) for c in real]
    for i in range(n - len(jobs)):
        text = f"```python\n{cheat}\n```" if i % 10 == 0 else f"answer {i}: no code here"
        jobs.append(EvalJob.for_problem(run_id, f"s{i}", relu, text, "cpu", CONFIG, expected=n))
    return jobs


def _slow_job(run_id: str, seconds: float) -> EvalJob:
    """A correct Triton ReLU whose import sleeps: long enough to kill or stop a worker mid-job."""
    candidate = next(c for c in builtin_candidates(level=1, backend="triton") if c.problem.id == "builtin/L1/4")
    text = f"import time\ntime.sleep({seconds})\n{candidate.text}"
    return EvalJob.for_problem(run_id, "slow", candidate.problem, text, "cpu", CONFIG)


def _verdicts(store: EventStore, run_id: str) -> list[str]:
    return [e.key for e in store.read(run_id=run_id, types=[KernelEvaluated, EvalFailed])]


def _sandbox_pids() -> dict[int, int]:
    """Live sandbox processes (pid → parent pid): candidates started cold (`python -m kbrl.kernels.runner`),
    and the warm fork server with every candidate it forked (`python -m kbrl.kernels.warm_pool`)."""
    pids = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if b"kbrl.kernels.runner" in cmdline or b"kbrl.kernels.warm_pool" in cmdline:
                    stat = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
                    pids[int(entry.name)] = int(stat[1])
            except (OSError, IndexError, ValueError):
                continue
    return pids


def _runner_pids() -> set[int]:
    return set(_sandbox_pids())


def _candidate_pids() -> set[int]:
    """Processes running a candidate: cold runners, and children forked by a warm fork server."""
    procs = _sandbox_pids()
    return {pid for pid, parent in procs.items() if parent in procs or b"runner" in _cmdline(pid)}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


class Workers:
    """Starts and stops `kbrl worker --cpu` processes (each in its own session, like a real host)."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, concurrency: int = 1) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        env = dict(self.env, KBRL_WORKER_NAME=name)
        proc = subprocess.Popen(
            [sys.executable, "-m", "kbrl.cli", "worker", "--cpu", "--concurrency", str(concurrency), "--loglevel", "info"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def celery_env(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, str], EventStore]]:
    """Environment for worker processes and the test: own Redis db (flushed), own SQLite store."""
    import redis

    db = 8 + abs(hash(request.node.name)) % 8
    client = redis.Redis.from_url(f"{REDIS}/{db}")
    client.flushdb()
    url = f"sqlite:///{tmp_path / 'kbrl.db'}"
    env = dict(os.environ, KBRL_BROKER_URL=f"{REDIS}/{db}", KBRL_DATABASE_URL=url, KBRL_HEARTBEAT_S="1",
               KBRL_VISIBILITY_TIMEOUT="6", KBRL_RESTORE_INTERVAL="1", PYTHONUNBUFFERED="1")  # fmt: skip
    yield env, EventStore(url)
    client.flushdb()


@pytest.fixture
def workers(celery_env: tuple[dict[str, str], EventStore], tmp_path: Path) -> Iterator[Workers]:
    w = Workers(celery_env[0], tmp_path)
    yield w
    w.stop_all()


@needs_redis
def test_hundred_jobs_give_exactly_hundred_verdicts(celery_env: tuple[dict[str, str], EventStore], workers: Workers) -> None:
    env, store = celery_env
    queue = CeleryQueue(store, env["KBRL_BROKER_URL"])
    jobs = _jobs("run-100", 100)
    queue.submit(jobs)
    queue.submit(jobs[:10])  # a producer that retries: the same 10 jobs again
    workers.start("w1", concurrency=2)
    found = wait_for_verdicts(store, "run-100", [j.sample_id for j in jobs], timeout=240)
    assert len(found) == 100, workers.log("w1")[-3000:]
    time.sleep(2)  # let the duplicates drain
    keys = _verdicts(store, "run-100")
    assert len(keys) == 100 and len(set(keys)) == 100
    categories = [store.get(evaluated_key("run-100", j.sample_id)).payload["result"]["category"] for j in jobs]
    assert categories[:4] == ["CORRECT"] * 4
    assert categories.count("CHEAT") == 10 and categories.count("FORMAT_ERROR") == 86
    progress = run_progress(store, "run-100")
    assert (progress.done, progress.in_flight, progress.failed, progress.finished) == (100, 0, 0, "finished")
    assert progress.requested == 100  # the retried submission recorded no second request
    queue.close()


@needs_redis
def test_sigkilled_worker_job_is_redelivered_with_one_verdict(celery_env: tuple[dict[str, str], EventStore],
                                                             workers: Workers) -> None:  # fmt: skip
    env, store = celery_env
    queue = CeleryQueue(store, env["KBRL_BROKER_URL"])
    job = _slow_job("run-kill", seconds=8)
    elsewhere = _runner_pids()  # sandboxes of anything else running on this machine
    first = workers.start("doomed")
    queue.submit([job])

    def busy_with_job() -> bool:
        return any(e.payload["busy"] and e.payload["job"] == "run-kill/slow"
                   for e in store.read(run_id=WORKERS_RUN, types=[WorkerHeartbeat]))  # fmt: skip

    _wait(busy_with_job, 60, "the first worker to take the job")
    _wait(lambda: bool(_candidate_pids() - elsewhere), 30, "the candidate's sandbox process")
    sandbox = _runner_pids() - elsewhere  # the candidate, and the fork server it came from
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    # The sandbox child is in a session of its own, so the group kill does not reach it: it must die
    # with its parent (PR_SET_PDEATHSIG) instead of running on, orphaned, on the worker's GPU.
    _wait(lambda: not (sandbox & _runner_pids()), 3, "the orphaned candidate to die")
    assert store.get(evaluated_key("run-kill", "slow")) is None
    workers.start("rescuer")
    found = wait_for_verdicts(store, "run-kill", ["slow"], timeout=120)
    assert "slow" in found, workers.log("rescuer")[-3000:]
    verdict = found["slow"].payload
    assert verdict["worker"].startswith("rescuer") and verdict["result"]["category"] == "CORRECT"
    assert _verdicts(store, "run-kill") == [evaluated_key("run-kill", "slow")]
    queue.close()


@needs_redis
def test_sigterm_finishes_the_job_in_hand(celery_env: tuple[dict[str, str], EventStore], workers: Workers) -> None:
    env, store = celery_env
    queue = CeleryQueue(store, env["KBRL_BROKER_URL"])
    proc = workers.start("graceful")
    queue.submit([_slow_job("run-term", seconds=3)])
    _wait(lambda: any(e.payload["busy"] for e in store.read(run_id=WORKERS_RUN, types=[WorkerHeartbeat])), 60,
          "the worker to take the job")  # fmt: skip
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(120) == 0
    verdict = store.get(evaluated_key("run-term", "slow"))
    assert verdict is not None and verdict.payload["worker"].startswith("graceful")
    last = store.latest_per_stream(WORKERS_RUN)
    assert last and not any(e.payload["busy"] for e in last)
    queue.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


REDIS_CONF = Path(__file__).resolve().parent.parent / "infra" / "redis.conf"


def _redis_server(port: int, data: Path, persistent: bool) -> subprocess.Popen[bytes]:
    """The documented broker config (infra/redis.conf), or the same with persistence switched off."""
    override = [] if persistent else ["--appendonly", "no"]
    proc = subprocess.Popen(
        ["redis-server", str(REDIS_CONF), "--port", str(port), "--dir", str(data), *override],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )  # fmt: skip
    _wait(lambda: _redis_up(port=port), 20, f"redis-server on port {port}")
    return proc


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
@pytest.mark.parametrize("persistent", [True, False], ids=["aof", "no-persistence"])
def test_redis_restart_with_queued_jobs(tmp_path: Path, persistent: bool) -> None:
    """With infra/redis.conf (AOF, fsync every second) queued jobs survive a Redis crash and restart;
    with persistence off (this machine's default Redis) they are lost."""
    import redis

    from kbrl.workers.celery_app import CPU_QUEUE

    port = _free_port()
    data = tmp_path / "redis"
    data.mkdir()
    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    server = _redis_server(port, data, persistent)
    broker = f"redis://127.0.0.1:{port}/0"
    try:
        queue = CeleryQueue(store, broker)
        jobs = _jobs("run-restart", 12)[4:]  # 8 quick ones
        queue.submit(jobs)
        queue.close()
        assert redis.Redis(port=port).llen(CPU_QUEUE) == 8
        server.kill()  # a crash (SIGKILL), not a clean shutdown: no chance to save anything on the way out
        server.wait(20)
        server = _redis_server(port, data, persistent)
        assert redis.Redis(port=port).llen(CPU_QUEUE) == (8 if persistent else 0)
        if not persistent:
            return
        env = dict(os.environ, KBRL_BROKER_URL=broker, KBRL_DATABASE_URL=str(store.engine.url),
                   KBRL_HEARTBEAT_S="1")  # fmt: skip
        w = Workers(env, tmp_path)
        w.start("after-restart", concurrency=2)
        try:
            found = wait_for_verdicts(store, "run-restart", [j.sample_id for j in jobs], timeout=120)
            assert len(found) == 8, w.log("after-restart")[-3000:]
        finally:
            w.stop_all()
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(20)


def test_local_queue_same_flow_without_services(tmp_path: Path) -> None:
    """LocalQueue + SQLite: 100 jobs → 100 verdicts, a resubmission adds none; no Redis, no workers."""
    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    queue = LocalQueue(store, workers=2)
    jobs = _jobs("run-local", 100)
    queue.submit(jobs)
    queue.join()
    queue.submit(jobs[:10])
    queue.join()
    queue.close()
    keys = _verdicts(store, "run-local")
    assert len(keys) == 100 and len(set(keys)) == 100
    progress = run_progress(store, "run-local")
    assert (progress.done, progress.in_flight, progress.finished) == (100, 0, "finished")
    assert progress.categories["CORRECT"] == 4


def test_job_without_text_reads_the_sample_from_the_store(tmp_path: Path) -> None:
    from kbrl.events.payloads import SampleGenerated
    from kbrl.events.store import NewEvent

    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    problem = get_problem("builtin/L1/4")
    store.append_one(NewEvent(run_id="train-1", stream="traj/t0", key="train-1/s0",
                              payload=SampleGenerated(step=0, group=0, traj="t0", problem_id=problem.id,
                                                      text="I would write a kernel but here is none")))  # fmt: skip
    queue = LocalQueue(store, workers=1)
    queue.submit([EvalJob.for_problem("train-1", "train-1/s0", problem, None, "cpu", CONFIG),
                  EvalJob.for_problem("train-1", "missing", problem, None, "cpu", CONFIG)])  # fmt: skip
    queue.join()
    queue.close()
    verdict = store.get(evaluated_key("train-1", "train-1/s0"))
    assert verdict is not None and verdict.payload["result"]["category"] == "FORMAT_ERROR"
    failed = store.get("train-1/missing/failed")
    assert failed is not None and "no text" in failed.payload["error"]
    assert run_progress(store, "train-1").failed == 1


@needs_redis
def test_cli_enqueue_then_status(celery_env: tuple[dict[str, str], EventStore], workers: Workers) -> None:
    """What a user types: `kbrl enqueue eval ... --wait` prints the run id; `kbrl status` shows it done."""
    import json

    env, store = celery_env
    workers.start("cli-worker")
    kbrl = [sys.executable, "-m", "kbrl.cli"]
    out = subprocess.run([*kbrl, "enqueue", "eval", "builtin", "--problems", "builtin/L1/5,builtin/L1/6",
                          "--backend", "triton", "--device", "cpu", "--wait", "--wait-timeout", "120"],
                         env=env, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    run_id = out.stdout.splitlines()[0].strip()
    status = subprocess.run([*kbrl, "status", run_id, "--json"], env=env, capture_output=True, text=True, timeout=60)
    data = json.loads(status.stdout)
    assert (data["requested"], data["done"], data["in_flight"], data["categories"]) == (2, 2, 0, {"CORRECT": 2})
    assert data["finished"] == "finished"
    assert any(w["worker"].startswith("cli-worker") and w["alive"] for w in data["workers"])


def test_cli_queue_commands_explain_missing_broker(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KBRL_BROKER_URL"}
    env["KBRL_DATABASE_URL"] = f"sqlite:///{tmp_path / 'kbrl.db'}"
    kbrl = [sys.executable, "-m", "kbrl.cli"]
    for argv in (["worker"], ["enqueue", "eval", "builtin"]):
        out = subprocess.run([*kbrl, *argv], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 2 and "KBRL_BROKER_URL is not set" in out.stderr
    out = subprocess.run([*kbrl, "status", "no-such-run"], env=env, capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)  # fmt: skip
    assert out.returncode == 1 and "no run 'no-such-run'" in out.stderr

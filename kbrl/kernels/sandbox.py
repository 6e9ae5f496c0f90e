"""Run untrusted candidate code in its own child process, with limits, and always come back with an answer.

Isolation layers, each cheap and independent:
- its own process (never imported into the worker), in its own session so the whole tree can be killed;
- network and PID namespaces when the host allows them (`unshare`): no route to Redis, PostgreSQL or
  anything else on localhost, and no view of (or ptrace access to) the worker's memory;
- rlimits: address space on CPU runs (CUDA reserves too much virtual memory for RLIMIT_AS, so GPU runs
  use a resident-memory watchdog instead), file size, no core dumps;
- a scrubbed environment built from an allowlist (no API keys or secrets), HOME and TMPDIR pointing into
  its private working directory;
- a wall-clock deadline, after which the process group is killed.

The child talks to the parent through two pipes: JSON lines on a dedicated fd (child → parent) and its
stdin (parent → child), so a verdict can be given between the correctness and timing phases.
"""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import IO, Any, Protocol

# Variables a candidate may see. Everything else (TINKER_API_KEY, AWS_*, KBRL_DATABASE_URL, ...) is dropped.
ENV_ALLOWLIST = (
    "PATH",
    "LANG",
    "LC_ALL",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_HOME",
    "CUDA_PATH",
    "LD_LIBRARY_PATH",
    "TORCH_CUDA_ARCH_LIST",
    "MAX_JOBS",
    "CC",
    "CXX",
    "NVIDIA_VISIBLE_DEVICES",
    "NCCL_NVLS_ENABLE",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST",
    "NVSHMEM_DISABLE_NVLS",
)
MESSAGE_FD_ENV = "KBRL_SANDBOX_FD"
_TAIL_BYTES = 8192


@dataclass
class SandboxLimits:
    """Limits for one candidate process; defaults suit one KernelBench candidate on one GPU."""

    timeout_s: float = 180.0
    memory_mb: int = 16_384
    file_size_mb: int = 2_048
    isolate: bool = True


@dataclass
class SandboxExit:
    """How the child ended: exactly one of normal exit, signal, timeout or memory kill describes it."""

    returncode: int | None
    signal_name: str | None = None
    timed_out: bool = False
    memory_exceeded: bool = False
    wall_s: float = 0.0
    stdout_tail: str = ""
    stderr_tail: str = ""
    peak_rss_mb: float = 0.0
    messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return self.signal_name is not None and not self.timed_out and not self.memory_exceeded


@cache
def namespaces_available() -> bool:
    """Whether `unshare` can give the child its own network and PID namespaces here (needs root or userns)."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        probe = subprocess.run(
            [exe, "--net", "--pid", "--fork", "--mount-proc", "--kill-child", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def scrubbed_env(extra: dict[str, str] | None = None, workdir: Path | None = None) -> dict[str, str]:
    """The child's environment: allowlisted variables only, plus what the evaluator sets on purpose."""
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if workdir is not None:
        env["HOME"] = str(workdir)
        env["TMPDIR"] = str(workdir)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _set_limits(memory_mb: int | None, file_size_mb: int) -> None:
    """Runs in the child between fork and exec."""
    _die_with_parent()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    fsize = file_size_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    if memory_mb is not None:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL the child when the thread that spawned it dies: a worker killed with SIGKILL
    must not leave an orphaned candidate building or running on the GPU (its job is redelivered anyway)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the session kill on timeout still applies
        pass


def _session_rss_mb(session_id: int) -> float:
    """Memory of every process in the child's session (the candidate, its compilers, its threads).

    Proportional set size where the kernel gives it: children forked from a warm interpreter share its
    pages copy-on-write, and plain RSS would count those once per process.
    """
    total_kb = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) != session_id:  # field 6 (session) after the ")"-terminated comm
                continue
            total_kb += _process_memory_kb(entry.name)
        except (OSError, IndexError, ValueError):
            continue
    return total_kb / 1024


def _process_memory_kb(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    with open(f"/proc/{pid}/statm", "rb") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024


def _tail(path: Path, limit: int = _TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return ("…[truncated]\n" + text) if size > limit else text


class ChildHandle(Protocol):
    """What supervising a candidate needs of its process: `subprocess.Popen`, or a child forked by the
    warm pool (`kbrl.kernels.warm_pool`). `pid` leads the child's session, so killing its group (and
    summing its session's memory) reaches everything the candidate started."""

    pid: int
    returncode: int | None
    stdin: IO[bytes] | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def launch(argv: list[str], workdir: Path, env: dict[str, str], limits: SandboxLimits,
           cpu_memory_limit: bool) -> SandboxProcess:  # fmt: skip
    """Start `argv` as a fresh sandboxed process (the cold path: a new interpreter per candidate)."""
    read_fd, write_fd = os.pipe()
    env = dict(env)
    env[MESSAGE_FD_ENV] = str(write_fd)
    namespaced = limits.isolate and namespaces_available()
    if namespaced:
        # A shell as PID 1 of the new namespace: the kernel ignores default-action signals sent to a
        # namespace's init, so the candidate must not be PID 1 or its own abort() would not end it.
        argv = [
            "unshare", "--net", "--pid", "--fork", "--mount-proc", "--kill-child",
            "/bin/sh", "-c", '"$@"; exit $?', "sh", *argv,
        ]  # fmt: skip
    memory = limits.memory_mb if cpu_memory_limit else None
    with open(workdir / "stdout.txt", "wb") as out, open(workdir / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=err,
            pass_fds=(write_fd,),
            start_new_session=True,
            preexec_fn=lambda: _set_limits(memory, limits.file_size_mb),
        )
    os.close(write_fd)
    return SandboxProcess(proc, read_fd, workdir, limits, namespaced)


class SandboxProcess:
    """Supervises one running candidate process (however it was started). Use as a context manager;
    `kill()` is always safe to call.

    `namespaced`: the candidate runs under a PID-namespace init that reports a signal death as 128 + N.
    """

    def __init__(self, proc: ChildHandle, read_fd: int, workdir: Path, limits: SandboxLimits,
                 namespaced: bool) -> None:  # fmt: skip
        self.proc = proc
        self.workdir = workdir
        self.limits = limits
        self.namespaced = namespaced
        self._stdout = workdir / "stdout.txt"
        self._stderr = workdir / "stderr.txt"
        self._messages: list[dict[str, Any]] = []
        self._buffer = b""
        self._killed_for: str | None = None
        self._peak_rss = 0.0
        self._read_fd = read_fd
        self.started = time.monotonic()
        self._deadline = self.started + limits.timeout_s
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, daemon=True)
        self._watchdog.start()

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
        os.close(self._read_fd)

    def _watch(self) -> None:
        """Kill the group on deadline or memory excess; runs beside the parent's blocking reads."""
        while not self._stop.wait(0.2):
            if self.proc.poll() is not None:
                return
            if time.monotonic() > self._deadline:
                self._kill_group("timeout")
                return
            rss = _session_rss_mb(self.proc.pid)
            self._peak_rss = max(self._peak_rss, rss)
            if rss > self.limits.memory_mb:
                self._kill_group("memory")
                return

    def _kill_group(self, reason: str) -> None:
        if self._killed_for is None:
            self._killed_for = reason
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def extend_deadline(self, seconds: float) -> None:
        """Give back time the child spent waiting on the parent (e.g. queued for the GPU)."""
        self._deadline += seconds

    def send(self, message: dict[str, Any]) -> None:
        """Send one JSON line to the child's stdin (ignored if it already exited)."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def receive(self, until_type: str) -> dict[str, Any] | None:
        """Block until the child sends a message of `until_type`, exits, or the deadline passes."""
        while True:
            for msg in self._messages:
                if msg.get("type") == until_type and not msg.get("_seen"):
                    msg["_seen"] = True
                    return msg
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                self._kill_group("timeout")
                return None
            ready, _, _ = select.select([self._read_fd], [], [], min(remaining, 0.5))
            if not ready:
                if self.proc.poll() is not None and not self._drain():
                    return None
                continue
            if not self._drain():
                return None

    def _drain(self) -> bool:
        """Read what is available into complete messages; False at end of stream."""
        try:
            chunk = os.read(self._read_fd, 1 << 20)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                self._messages.append(msg)
        return True

    def wait(self) -> SandboxExit:
        """Wait for the child to end (bounded by the deadline) and describe how it ended."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        except OSError:
            pass
        remaining = max(0.0, self._deadline - time.monotonic())
        try:
            self.proc.wait(timeout=remaining + 1.0)
        except subprocess.TimeoutExpired:
            self._kill_group("timeout")
            self.proc.wait()
        self._stop.set()
        while self._drain():
            pass
        return self._exit()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self._kill_group("killed")
            self.proc.wait()
        self._stop.set()

    def _exit(self) -> SandboxExit:
        rc = self.proc.returncode
        sig: str | None = None
        if rc is not None and rc < 0:
            sig = signal.Signals(-rc).name
        elif rc is not None and rc > 128 and self.namespaced:
            try:  # the namespace's shell reports a signal-killed child as 128 + N
                sig = signal.Signals(rc - 128).name
            except ValueError:
                sig = None
        return SandboxExit(
            returncode=rc,
            signal_name=sig,
            timed_out=self._killed_for == "timeout",
            memory_exceeded=self._killed_for == "memory",
            wall_s=time.monotonic() - self.started,
            stdout_tail=_tail(self._stdout),
            stderr_tail=_tail(self._stderr),
            peak_rss_mb=self._peak_rss,
            messages=[{k: v for k, v in m.items() if k != "_seen"} for m in self._messages],
        )


def send_to_parent(message: dict[str, Any]) -> None:
    """Child side: one JSON line to the parent's message pipe."""
    fd = int(os.environ.get(MESSAGE_FD_ENV, "-1"))
    if fd < 0:
        return
    os.write(fd, (json.dumps(message, default=str) + "\n").encode())

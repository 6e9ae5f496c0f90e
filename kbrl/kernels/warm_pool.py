"""Warm sandboxes: a fork server that has imported torch and Triton once, and forks one child per candidate.

Starting Python and importing torch costs seconds per candidate (~3.9 s of a ~5.5 s Triton evaluation
on an H100), far more than judging it. The fork server (the "zygote") pays that once: it starts
sandboxed (scrubbed environment, no network), imports torch, Triton and kbrl's runner, never touches
CUDA, and then forks one child per request. Each child does exactly one candidate and exits, so a
hostile candidate still cannot reach the next one:

- the child makes its own session (the worker kills its whole group, and sums its memory, by that id);
- where namespaces are available it enters a new PID and mount namespace with its own /proc, under a
  tiny init that reports a signal death as 128 + N, as the cold path's `unshare` shell does: it sees
  only its own processes, not the fork server, not other candidates, not the worker;
- the network namespace is the fork server's own, which has no interfaces up;
- rlimits (core dumps off, file size, address space on CPU runs) are set in the child, and its parent-death
  signal ties it to the fork server, which exits when the worker's end of its socket closes.

The fork happens before any CUDA initialisation (the server checks `torch.cuda.is_initialized()` before
every fork), so each child initialises CUDA itself, as a fresh process would. The worker talks to the
server over a Unix socket; the child's stdin, message pipe, stdout and stderr are the worker's own
pipes and files, passed with SCM_RIGHTS, so supervising a forked child (`SandboxProcess`) is the same
as supervising a cold one.

Per-candidate settings that a warm interpreter would otherwise have cached at import (HOME, TMPDIR,
cache directories) are applied in the child before the runner starts; what must be fixed at import
(TRITON_INTERPRET, CUDA_VISIBLE_DEVICES) is part of the server's key, so one server serves one kind
of evaluation.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Any, NoReturn

from kbrl.kernels.sandbox import (
    MESSAGE_FD_ENV,
    SandboxLimits,
    SandboxProcess,
    _die_with_parent,
    _set_limits,
    namespaces_available,
)

SOCKET_FD_ENV = "KBRL_FORKSERVER_FD"
# What is imported once, in the server: everything a candidate's first seconds would otherwise spend on.
# Not torch.utils.cpp_extension: importing it calls torch.cuda.is_available(), which initialises the
# CUDA driver, after which no forked child can use CUDA (each child imports it when it builds).
PRELOAD = (
    "torch",
    "torch.utils._python_dispatch",
    "triton",
    "triton.language",
    "kbrl.kernels.runner",
)
_CLONE_NEWNS, _CLONE_NEWPID = 0x00020000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
_READY_TIMEOUT_S = 300.0


class ForkServerError(RuntimeError):
    """The fork server could not start or died; callers fall back to a cold sandbox process."""


# ------------------------------------------------------------------------------------ worker side


class ForkedChild:
    """A candidate process forked by the server, shaped like `subprocess.Popen` for `SandboxProcess`.
    Its exit status arrives from the server (its parent), which reaps it."""

    def __init__(self, pid: int, stdin: IO[bytes]) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.returncode: int | None = None
        self._done = threading.Event()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired("forked candidate", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def _exited(self, returncode: int) -> None:
        if self.returncode is None:
            self.returncode = returncode
            self._done.set()


class ForkServer:
    """One warm fork server: started on construction, ready in the background, forks on `spawn`."""

    def __init__(self, env: dict[str, str], isolate: bool, log_path: Path) -> None:
        self.owner = os.getpid()
        self.namespaced = isolate and namespaces_available()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock = ours
        argv = [sys.executable, "-m", "kbrl.kernels.warm_pool"]
        if self.namespaced:
            argv = ["unshare", "--net", *argv]  # the server and every child it forks: no network
        env = {**env, SOCKET_FD_ENV: str(theirs.fileno())}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, env=env, cwd=log_path.parent, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, pass_fds=(theirs.fileno(),), start_new_session=True)  # fmt: skip
        theirs.close()
        self._ready = threading.Event()
        self._dead: str | None = None
        self._lock = threading.Lock()
        self._next_id = 0
        self._spawned: dict[int, tuple[threading.Event, list[int]]] = {}
        self._children: dict[int, ForkedChild] = {}
        self._early_exits: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, name="kbrl-forkserver", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self._dead is None and self.proc.poll() is None

    def wait_ready(self, timeout: float = _READY_TIMEOUT_S) -> None:
        if not self._ready.wait(timeout) or self._dead is not None:
            raise ForkServerError(self._dead or f"fork server not ready after {timeout:.0f} s")

    def spawn(self, workdir: Path, job_path: Path, env: dict[str, str], limits: SandboxLimits,
              cpu_memory_limit: bool) -> SandboxProcess:  # fmt: skip
        """Fork a child that runs `python -m kbrl.kernels.runner job_path` in `workdir`, supervised like a
        cold one (the deadline starts now)."""
        self.wait_ready()
        read_fd, msg_fd = os.pipe()
        stdin_r, stdin_w = os.pipe()
        out = open(workdir / "stdout.txt", "wb")
        err = open(workdir / "stderr.txt", "wb")
        done = threading.Event()
        box: list[int] = []
        request = {"workdir": str(workdir), "job": str(job_path), "env": env, "file_size_mb": limits.file_size_mb,
                   "memory_mb": limits.memory_mb if cpu_memory_limit else None, "namespaced": self.namespaced}  # fmt: skip
        try:
            with self._lock:
                if self._dead is not None:
                    raise ForkServerError(self._dead)
                request["id"] = self._next_id = self._next_id + 1
                self._spawned[request["id"]] = (done, box)
                socket.send_fds(self._sock, [json.dumps(request).encode()], [stdin_r, msg_fd, out.fileno(), err.fileno()])
        except OSError as exc:
            os.close(read_fd)
            os.close(stdin_w)
            raise ForkServerError(f"fork server unreachable: {exc}") from exc
        finally:
            for fd in (stdin_r, msg_fd):
                os.close(fd)
            out.close()
            err.close()
        if not done.wait(30.0) or not box:
            os.close(read_fd)
            os.close(stdin_w)
            raise ForkServerError(self._dead or "fork server did not fork within 30 s")
        child = ForkedChild(box[0], os.fdopen(stdin_w, "wb"))
        with self._lock:
            self._children[request["id"]] = child
            if request["id"] in self._early_exits:  # exited before we registered it
                child._exited(self._early_exits.pop(request["id"]))
            elif self._dead is not None:
                child._exited(-signal.SIGKILL)
        return SandboxProcess(child, read_fd, workdir, limits, self.namespaced)

    def close(self) -> None:
        """Stop the server; children it forked die with it (parent-death signal)."""
        self._fail("fork server closed")
        try:
            self._sock.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                code = self.proc.poll()
                self._fail(f"fork server exited (code {code}); see {self.log_path}")
                return
            msg = json.loads(data)
            with self._lock:
                if msg["type"] == "ready":
                    self._ready.set()
                elif msg["type"] == "error":
                    self._dead = msg["error"]
                    self._ready.set()
                elif msg["type"] == "spawned":
                    done, box = self._spawned.pop(msg["id"])
                    box.append(msg["pid"])
                    done.set()
                elif msg["type"] == "exit":
                    child = self._children.pop(msg["id"], None)
                    if child is None:
                        self._early_exits[msg["id"]] = msg["returncode"]
                    else:
                        child._exited(msg["returncode"])

    def _fail(self, why: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = why
            self._ready.set()
            for done, _ in self._spawned.values():
                done.set()
            for child in self._children.values():
                child._exited(-signal.SIGKILL)  # the parent-death signal has killed it
            self._children.clear()


_servers: dict[tuple[str, ...], ForkServer] = {}
_servers_lock = threading.Lock()


def fork_server(env: dict[str, str], isolate: bool, log_dir: Path) -> ForkServer:
    """This process's warm server for `env` (started on first use, restarted if it died).

    Keyed by what a warm interpreter fixes at import (the variables, kbrl's path, isolation); the
    rest of a candidate's environment is applied per child.
    """
    key = (repr(sorted(env.items())), str(isolate))
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and server.owner != os.getpid():
            server = None  # inherited through a fork (e.g. a prefork pool): the parent's, not ours to use
        if server is None or not server.alive:
            if server is not None:
                server.close()
            home = tempfile.mkdtemp(prefix="kbrl-forkserver-")  # the server's own HOME/TMPDIR, not a candidate's
            log = log_dir / f"forkserver-{os.getpid()}-{len(_servers)}.log"
            server = ForkServer({**env, "HOME": home, "TMPDIR": home}, isolate, log)
            _servers[key] = server
        return server


def close_all() -> None:
    with _servers_lock:
        for server in _servers.values():
            server.close()
        _servers.clear()


# ------------------------------------------------------------------------------------ server side


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _wait_for(target: int) -> int:
    """Reap children (as a namespace init must) until `target` ends; its status as a shell reports it."""
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        if pid == target:
            return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _run_runner(job: str) -> NoReturn:
    import faulthandler

    from kbrl.kernels import runner

    faulthandler.enable()
    code = 1
    try:
        code = runner.main(["runner", job])
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _child(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """In the forked child: become an isolated one-candidate process, run the runner, exit."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        stdin_fd, msg_fd, out_fd, err_fd = fds
        os.dup2(stdin_fd, 0)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        msg = os.dup2(msg_fd, 3)
        os.closerange(4, os.sysconf("SC_OPEN_MAX"))  # nothing of the server's leaks into a candidate
        _set_limits(request["memory_mb"], request["file_size_mb"])
        workdir = request["workdir"]
        os.chdir(workdir)
        os.environ.update({**request["env"], "HOME": workdir, "TMPDIR": workdir, MESSAGE_FD_ENV: str(msg)})
        tempfile.tempdir = None  # the server's cached temp dir is not this candidate's
        if not request["namespaced"]:
            _run_runner(request["job"])
        libc = _libc()
        _check(libc.unshare(_CLONE_NEWPID | _CLONE_NEWNS), "unshare")
        _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
        init = os.fork()
        if init == 0:  # PID 1 of the candidate's namespace: its own /proc, then one child that runs it
            _die_with_parent()
            _check(libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None), "mount /proc")
            candidate = os.fork()
            if candidate == 0:
                _run_runner(request["job"])
            os._exit(_wait_for(candidate))
        os._exit(_wait_for(init))
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def _exit_if_orphaned_while(sock: socket.socket) -> Any:
    """Importing torch takes seconds; a worker killed meanwhile must not leave us importing on. Nothing
    arrives before we report ready, so the socket turning readable means the worker hung up. Returns a
    function that stops (and joins) the watch."""
    stop_r, stop_w = os.pipe()

    def watch() -> None:
        readable, _, _ = select.select([sock, stop_r], [], [])
        if stop_r not in readable:
            os._exit(0)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()

    def stop() -> None:
        os.write(stop_w, b"x")
        thread.join()
        os.close(stop_r)
        os.close(stop_w)

    return stop


def _children_can_use_cuda() -> bool:
    """Fork a probe: CUDA refuses to initialise in the child of a process that initialised it (torch
    marks such a child "in bad fork"); `torch.cuda.is_initialized()` alone does not see the driver
    having been touched by e.g. `torch.cuda.is_available()`."""
    import torch

    probe = os.fork()
    if probe == 0:
        bad = getattr(torch._C, "_cuda_isInBadFork", lambda: False)()
        os._exit(1 if bad else 0)
    _, status = os.waitpid(probe, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def serve() -> None:
    """The server's loop: fork on each request, report each child's pid and exit status."""
    sock = socket.socket(fileno=int(os.environ.pop(SOCKET_FD_ENV)))
    started = time.perf_counter()
    stop_watch = _exit_if_orphaned_while(sock)
    try:
        import importlib

        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException as exc:
        _send(sock, {"type": "error", "error": f"fork server could not import: {type(exc).__name__}: {exc}"})
        raise
    finally:
        stop_watch()  # single-threaded again before anything forks
    import torch

    if not _children_can_use_cuda():
        _send(sock, {"type": "error", "error": "a preloaded module initialised CUDA: forked children could not use it"})
        return
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sys.stdout.flush()
    sys.stderr.flush()
    _send(sock, {"type": "ready", "pid": os.getpid(), "preload_s": time.perf_counter() - started,
                 "threads": len(os.listdir("/proc/self/task"))})  # fmt: skip
    ids: dict[int, int] = {}
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        while ids:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            _send(sock, {"type": "exit", "id": ids.pop(pid), "returncode": code})
        if sock not in readable:
            continue
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
        if not data:
            break  # the worker is gone: exiting kills every child through its parent-death signal
        request = json.loads(data)
        if torch.cuda.is_initialized():  # a forked CUDA context is unusable: never hand one out
            _send(sock, {"type": "error", "error": "fork server initialised CUDA; refusing to fork"})
            break
        pid = os.fork()
        if pid == 0:
            sock.close()
            os.close(wake_r)
            os.close(wake_w)
            _child(request, fds)
        for fd in fds:
            os.close(fd)
        ids[pid] = request["id"]
        _send(sock, {"type": "spawned", "id": request["id"], "pid": pid})


if __name__ == "__main__":
    serve()
    # No interpreter teardown (seconds with torch loaded): exit now, and every child dies with us
    # through its parent-death signal, at once, when the worker that owned us is gone.
    os._exit(0)

"""`kbrl worker`: start Celery workers bound to GPUs (one process per GPU) or to the CPU queue."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from kbrl.workers.celery_app import CPU_QUEUE, GPU_QUEUE


def visible_gpus() -> list[str]:
    """GPU indices this host exposes (respecting an outer CUDA_VISIBLE_DEVICES)."""
    outer = os.environ.get("CUDA_VISIBLE_DEVICES")
    if outer is not None:
        return [g for g in outer.split(",") if g.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def celery_argv(queue: str, name: str, concurrency: int, loglevel: str) -> list[str]:
    return [
        sys.executable, "-m", "celery", "-A", "kbrl.workers.celery_app:app", "worker",
        "--queues", queue, "--hostname", name, "--concurrency", str(concurrency), "--pool", "prefork",
        "--loglevel", loglevel, "--without-gossip", "--without-mingle",
    ]  # fmt: skip


def exec_gpu_worker(gpu: str, loglevel: str = "info") -> None:
    """Become a Celery worker that owns GPU `gpu`: one job at a time, so timings see an idle device."""
    name = os.environ.get("KBRL_WORKER_NAME") or f"gpu{gpu}@{socket.gethostname()}"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, KBRL_WORKER_KIND="gpu", KBRL_WORKER_NAME=name)
    os.execve(sys.executable, celery_argv(GPU_QUEUE, name, 1, loglevel), env)


def exec_cpu_worker(concurrency: int, loglevel: str = "info") -> None:
    """Become a CPU worker: CUDA prebuilds for the GPU workers of this host, and CPU-device evaluations."""
    name = os.environ.get("KBRL_WORKER_NAME") or f"cpu@{socket.gethostname()}"
    env = dict(os.environ, KBRL_WORKER_KIND="cpu", KBRL_WORKER_NAME=name)
    os.execve(sys.executable, celery_argv(CPU_QUEUE, name, concurrency, loglevel), env)


def run_gpu_fleet(gpus: list[str], loglevel: str = "info") -> int:
    """One worker process per GPU; SIGTERM/SIGINT are passed on (warm shutdown: jobs in hand finish).

    A worker that dies is restarted (its job was redelivered by the broker meanwhile).
    """
    procs: dict[str, subprocess.Popen[bytes]] = {}
    stopping = False

    env = {k: v for k, v in os.environ.items() if k != "KBRL_WORKER_NAME"}  # each names itself gpuN@host

    def spawn(gpu: str) -> None:
        argv = [sys.executable, "-m", "kbrl.cli", "worker", "--gpu", gpu, "--loglevel", loglevel]
        procs[gpu] = subprocess.Popen(argv, env=env)

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for gpu in gpus:
        spawn(gpu)
    while True:
        time.sleep(1)
        for gpu, proc in list(procs.items()):
            if proc.poll() is not None and not stopping:
                print(f"kbrl worker: gpu {gpu} exited with {proc.returncode}; restarting in 5 s", file=sys.stderr)
                time.sleep(5)
                spawn(gpu)
        if stopping and all(p.poll() is not None for p in procs.values()):
            return max((p.returncode or 0) for p in procs.values())

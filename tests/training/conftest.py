"""Fixtures for the training tests: the tiny model, built once per session, and a light CPU footprint.

* `tiny_model_path` — a directory with a random-init tiny Llama and its locally trained tokenizer, saved in
  Hugging Face format (loaded through the same `from_pretrained(path)` as a real model id).
* `tiny_tokenizer`  — that tokenizer, loaded with `AutoTokenizer`.
* `one_torch_thread` — torch on one thread for the test (the host's cores are shared), restored after.
* `kbrl_train_killed_when` — `kbrl train` in a subprocess, SIGKILLed the moment its store shows a state.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kbrl.training.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


KilledTrain = Callable[[list[str], Callable[[Any], bool], float, str], tuple[dict[str, str], Any]]


@pytest.fixture
def kbrl_train_killed_when(tmp_path: Path) -> KilledTrain:
    """Returns `run(args, until, timeout, what)`: `kbrl train ARGS` on a SQLite store in `tmp_path` (no
    broker: LocalQueue), its whole process group SIGKILLed as soon as `until(store)` holds (within
    `timeout` seconds, else the test fails with `what`); gives back (the environment to resume it in,
    the store)."""
    from kbrl.events.store import EventStore

    def run(args: list[str], until: Callable[[Any], bool], timeout: float, what: str) -> tuple[dict[str, str], Any]:
        url = f"sqlite:///{tmp_path / 'kbrl.db'}"
        env = {k: v for k, v in os.environ.items() if k != "KBRL_BROKER_URL"}
        env.update(KBRL_DATABASE_URL=url, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        with open(tmp_path / "first.log", "wb") as log:
            first = subprocess.Popen([sys.executable, "-m", "kbrl.cli", "train", *args], env=env, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            store = EventStore(url)
            deadline = time.monotonic() + timeout
            while not until(store):
                assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
                assert time.monotonic() < deadline, what
                time.sleep(0.05)
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(30)
        return env, store

    return run

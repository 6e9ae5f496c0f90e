"""GpuSlots: correctness runs share the GPU (up to a cap), timing has it alone and is never starved."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from kbrl.kernels.gpu_slots import GpuSlots


def _hold(slots: GpuSlots, kind: str, log: list[tuple[str, str]], name: str, release: threading.Event) -> None:
    with slots.exclusive() if kind == "x" else slots.shared():
        log.append(("enter", name))
        release.wait(10)
        log.append(("leave", name))


def _start(*args: object) -> threading.Thread:
    thread = threading.Thread(target=_hold, args=args, daemon=True)
    thread.start()
    return thread


def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_shared_holders_run_together_up_to_the_cap() -> None:
    slots, log, release = GpuSlots(shared=2), [], threading.Event()
    threads = [_start(slots, "s", log, f"s{i}", release) for i in range(3)]
    _until(lambda: len(log) == 2, "two shared holders inside")
    time.sleep(0.1)
    assert len(log) == 2  # the third waits for a free slot
    release.set()
    for t in threads:
        t.join(5)
    assert [e for e, _ in log].count("enter") == 3


def test_exclusive_waits_for_shared_and_blocks_newcomers() -> None:
    slots, log = GpuSlots(shared=4), []
    first, timing, late = threading.Event(), threading.Event(), threading.Event()
    a = _start(slots, "s", log, "correctness", first)
    _until(lambda: ("enter", "correctness") in log, "the first shared holder")
    x = _start(slots, "x", log, "timing", timing)
    time.sleep(0.1)
    b = _start(slots, "s", log, "newcomer", late)
    time.sleep(0.1)
    assert ("enter", "timing") not in log and ("enter", "newcomer") not in log  # writer preference
    first.set()
    _until(lambda: ("enter", "timing") in log, "timing to start once correctness left")
    time.sleep(0.1)
    assert ("enter", "newcomer") not in log  # nothing runs beside a timing
    timing.set()
    late.set()
    for t in (a, x, b):
        t.join(5)
    assert log.index(("leave", "timing")) < log.index(("enter", "newcomer"))


def test_at_least_one_slot() -> None:
    with pytest.raises(ValueError):
        GpuSlots(shared=0)

"""Who may use the GPU when: correctness runs share it, timing has it alone.

Correctness trials only need the right answer, so several candidates may run them on one GPU at once
(each in its own process and CUDA context); a timed measurement needs the GPU idle, or another
candidate's kernels would land inside its interval. A readers–writer lock with a cap on readers and
preference for writers: a timing request waits for the running correctness trials to finish, and no new
ones start meanwhile, so timing never starves.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class GpuSlots:
    def __init__(self, shared: int = 4) -> None:
        if shared < 1:
            raise ValueError("at least one shared slot is needed")
        self.max_shared = shared
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting_exclusive = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Run beside up to `max_shared - 1` others; never beside an exclusive holder."""
        with self._cond:
            self._cond.wait_for(lambda: not self._exclusive and not self._waiting_exclusive
                                and self._shared < self.max_shared)  # fmt: skip
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """The GPU alone: waits for shared holders to leave; new ones queue behind."""
        with self._cond:
            self._waiting_exclusive += 1
            self._cond.wait_for(lambda: not self._exclusive and self._shared == 0)
            self._waiting_exclusive -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()

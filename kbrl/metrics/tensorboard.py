"""TensorBoard scalars for training and evaluation runs (`log_path/tensorboard`).

A thin wrapper over `torch.utils.tensorboard.SummaryWriter` that never takes a run down: the event store is
the record, TensorBoard only a view of it. Without the `tensorboard` package, or when disabled, it writes
nothing and says so once; non-finite or non-numeric values are skipped and counted (TensorBoard would plot
NaN/inf as gaps or axis-wrecking spikes), with one warning per tag.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

_warned: set[str] = set()
"""Reasons already reported (once per process: every run of a sweep would otherwise repeat them)."""


def _warn_once(reason: str, message: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        log.warning(message)


class ScalarLogger:
    """Writes `{tag: value}` scalars per step as TensorBoard event files under `log_dir`.

    `purge_step`: when a resumed run logs again from step N, pass N so TensorBoard drops the killed
    attempt's points at steps >= N instead of drawing both.
    """

    def __init__(self, log_dir: Path | str, enabled: bool = True, purge_step: int | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.skipped = 0
        """Values not written because they were NaN, ±inf or not numbers."""
        self.skipped_by_tag: dict[str, int] = {}
        self._writer: Any = None
        if not enabled:
            _warn_once("disabled", "TensorBoard logging is disabled (tensorboard_enabled=false): no scalars are written")
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            _warn_once("missing", "the tensorboard package is not installed (pip install tensorboard): "
                                  "no TensorBoard scalars are written")  # fmt: skip
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    @property
    def enabled(self) -> bool:
        """Whether scalars are actually written (False when disabled, tensorboard is missing, or closed)."""
        return self._writer is not None

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Write each finite value at `step`, then flush: steps are minutes apart, and a killed run keeps
        every step it logged."""
        if self._writer is None:
            return
        for tag, value in scalars.items():
            number = _finite(value)
            if number is None:
                self.skipped += 1
                self.skipped_by_tag[tag] = self.skipped_by_tag.get(tag, 0) + 1
                if self.skipped_by_tag[tag] == 1:
                    log.warning("TensorBoard: skipping non-finite or non-numeric %s=%r at step %d "
                                "(later ones for this tag are only counted)", tag, value, step)  # fmt: skip
                continue
            self._writer.add_scalar(tag, number, global_step=step)
        self._writer.flush()

    def flush(self) -> None:
        """Push pending events to disk."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; later `log` calls are no-ops. Safe to call twice."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> ScalarLogger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.close()


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def read_scalars(log_dir: Path | str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the event files directly under `log_dir`: {tag: [(step, value), ...]} in the
    order written (values as TensorBoard stores them, float32). For tests and quick analysis."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    path = Path(log_dir)
    if not path.is_dir():
        raise FileNotFoundError(f"no TensorBoard directory {str(path)!r}")
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})  # 0: keep every point, not a sample
    acc.Reload()
    return {tag: [(event.step, event.value) for event in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


__all__ = ["ScalarLogger", "read_scalars"]

"""TensorBoard scalars: real event files read back exactly; non-finite values skipped and counted; disabled
or missing tensorboard is a no-op that says so."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import pytest

from kbrl.metrics import tensorboard
from kbrl.metrics.tensorboard import ScalarLogger, read_scalars


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tensorboard, "_warned", set())  # "once per process" must not leak between tests


def test_scalars_round_trip_exactly(tmp_path: Path) -> None:
    with ScalarLogger(tmp_path / "tb") as logger:
        assert logger.enabled
        logger.log(0, {"reward/mean": 0.25, "train/loss": 1.5})
        logger.log(1, {"reward/mean": 0.5, "train/loss": -0.75})
        logger.log(2, {"reward/mean": 1.0, "count": 3})
    assert read_scalars(tmp_path / "tb") == {
        "reward/mean": [(0, 0.25), (1, 0.5), (2, 1.0)],
        "train/loss": [(0, 1.5), (1, -0.75)],
        "count": [(2, 3.0)],
    }
    assert logger.skipped == 0 and not logger.enabled  # closed by the with block


def test_non_finite_values_are_skipped_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    logger = ScalarLogger(tmp_path / "tb")
    with caplog.at_level(logging.WARNING, logger=tensorboard.__name__):
        logger.log(0, {"loss": float("nan"), "reward": 0.5, "ratio": float("inf")})
        logger.log(1, {"loss": float("-inf"), "reward": 0.25, "bad": "n/a"})
        logger.log(2, {"loss": 2.0, "none": None})  # type: ignore[dict-item]
    logger.close()
    assert read_scalars(tmp_path / "tb") == {"reward": [(0, 0.5), (1, 0.25)], "loss": [(2, 2.0)]}
    assert logger.skipped == 5
    assert logger.skipped_by_tag == {"loss": 2, "ratio": 1, "bad": 1, "none": 1}
    warned = [r.getMessage() for r in caplog.records if "skipping" in r.getMessage()]
    assert len(warned) == 4 and "loss=nan at step 0" in warned[0]  # one per tag, not one per value


def test_disabled_writes_nothing_and_says_so_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=tensorboard.__name__):
        first = ScalarLogger(tmp_path / "off", enabled=False)
        first.log(0, {"x": 1.0})
        first.flush()
        first.close()
        ScalarLogger(tmp_path / "off2", enabled=False).log(0, {"x": 1.0})
    assert not first.enabled
    assert not (tmp_path / "off").exists() and not (tmp_path / "off2").exists()
    assert [r.getMessage() for r in caplog.records].count(
        "TensorBoard logging is disabled (tensorboard_enabled=false): no scalars are written") == 1


def test_missing_tensorboard_is_a_no_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # makes the import fail
    with caplog.at_level(logging.WARNING, logger=tensorboard.__name__):
        logger = ScalarLogger(tmp_path / "tb")
        logger.log(0, {"x": 1.0})
    assert not logger.enabled and not (tmp_path / "tb").exists()
    assert any("pip install tensorboard" in r.getMessage() for r in caplog.records)


def test_resume_with_purge_step_replaces_the_killed_attempts_points(tmp_path: Path) -> None:
    with ScalarLogger(tmp_path / "tb") as killed:
        for step in range(4):
            killed.log(step, {"x": float(step)})
    time.sleep(1.1)  # event file names carry whole seconds: the resumed file must sort after the first
    with ScalarLogger(tmp_path / "tb", purge_step=2) as resumed:
        for step in (2, 3):
            resumed.log(step, {"x": 10.0 + step})
    assert read_scalars(tmp_path / "tb") == {"x": [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]}


def test_reading_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no TensorBoard directory"):
        read_scalars(tmp_path / "nowhere")

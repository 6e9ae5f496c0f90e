"""`kbrl eval-kernels`, as a user runs it: one candidate file, results JSON, and the eval run's events."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kbrl.events.payloads import EvalRunFinished, EvalRunStarted, KernelEvaluated
from kbrl.events.store import EventStore
from kbrl.problems import builtin_solutions, get_problem
from kbrl.workers.jobs import evaluated_key


def test_eval_kernels_records_the_run_and_writes_results(tmp_path: Path) -> None:
    problem = get_problem("builtin/L1/5")
    candidate = tmp_path / "relu.py"
    candidate.write_text(builtin_solutions(problem)["triton"])
    url = f"sqlite:///{tmp_path / 'kbrl.db'}"
    env = dict(os.environ, KBRL_DATABASE_URL=url)
    out = subprocess.run([sys.executable, "-m", "kbrl.cli", "eval-kernels", str(candidate), "--problem", problem.id,
                          "--device", "cpu", "--trials", "2", "--json", "--out", str(tmp_path / "results.json")],
                         env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    printed = json.loads(out.stdout)
    run_id = printed["run_id"]
    assert printed["results"]["relu"]["category"] == "CORRECT"
    assert json.loads((tmp_path / "results.json").read_text())["summary"]["n"] == 1
    store = EventStore(url)
    assert [e.type for e in store.read(run_id=run_id)] == [
        EvalRunStarted.event_type, KernelEvaluated.event_type, EvalRunFinished.event_type]  # fmt: skip
    verdict = store.get(evaluated_key(run_id, "relu"))
    assert verdict is not None and verdict.payload["result"]["category"] == "CORRECT"

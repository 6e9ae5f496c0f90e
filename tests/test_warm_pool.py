"""The warm sandbox pool (fork server): one fresh process per candidate, isolated from the server and from
each other, surviving every fault, and the same verdicts as the cold path (the corpus tests in
test_evaluator.py run through the pool, since it is the default; the cold path is checked here)."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from kbrl.evalrun import builtin_candidates
from kbrl.kernels.evaluator import EvalConfig, Evaluator
from kbrl.kernels.result import Category
from kbrl.kernels.sandbox import namespaces_available
from kbrl.kernels.warm_pool import ForkServer, fork_server
from kbrl.problems import get_problem

CORPUS = Path(__file__).parent / "corpus"
# The faults that act on the process itself (the rest fail inside Python, the same in any process).
PROCESS_FAULTS = ["abort", "infinite_loop", "kill_everything", "memory_bomb", "network", "os_system",
                  "read_secret", "segfault"]  # fmt: skip
FAULTS = [CORPUS / "faults" / f"{name}.py" for name in PROCESS_FAULTS]
RELU = next(c for c in builtin_candidates(level=1, backend="triton") if c.problem.id == "builtin/L1/5")


def header(path: Path, key: str) -> str:
    match = re.search(rf"^# {key}: (\S+)$", path.read_text(), re.M)
    assert match
    return match.group(1)


@pytest.fixture(scope="module")
def unchecked(tmp_path_factory: pytest.TempPathFactory) -> Evaluator:
    """Static checks off: candidates that probe the process are allowed to run."""
    config = EvalConfig(device="cpu", timeout_s=20, memory_mb=3072, static_checks=False)
    return Evaluator(config, cache_dir=tmp_path_factory.mktemp("warm-cache"))


def _server(ev: Evaluator) -> ForkServer:
    server = ev.warm_server()
    assert server is not None
    return server


def _with_prelude(prelude: str) -> str:
    """The correct ReLU solution with `prelude` run at import (after its own imports)."""
    return RELU.text.replace("\nclass ModelNew", f"\n{prelude}\n\nclass ModelNew", 1)


def test_each_candidate_gets_a_fresh_process(unchecked: Evaluator) -> None:
    """State a candidate leaves in its interpreter (a patched torch attribute) never reaches the next one."""
    code = _with_prelude(
        "import os, torch\n"
        "if hasattr(torch, '_kbrl_mark'):\n"
        "    raise RuntimeError(f'state leaked from pid {torch._kbrl_mark}')\n"
        "torch._kbrl_mark = os.getpid()"
    )
    results = [unchecked.evaluate(RELU.problem, code) for _ in range(3)]
    assert [r.category for r in results] == [Category.CORRECT] * 3, [r.error for r in results]


@pytest.mark.skipif(not namespaces_available(), reason="no PID namespaces here")
def test_a_candidate_sees_only_its_own_processes(unchecked: Evaluator) -> None:
    """Its own PID namespace and /proc: neither the fork server, nor other candidates, nor the worker."""
    code = _with_prelude(
        "import os\n"
        "raise RuntimeError('pids=' + ','.join(sorted(p for p in os.listdir('/proc') if p.isdigit())) + ';')"
    )
    result = unchecked.evaluate(RELU.problem, code)
    assert result.category == Category.COMPILATION_ERROR
    pids = re.search(r"pids=([\d,]*);", result.error)
    assert pids is not None, result.error
    assert set(pids.group(1).split(",")) == {"1", "2"}  # the namespace's init and the candidate


def test_the_server_survives_every_fault(unchecked: Evaluator) -> None:
    """Crashes, hangs, memory bombs and kill(-1) end their own child only: the same server goes on."""
    server = _server(unchecked)
    pid = server.proc.pid
    for path in FAULTS:
        if "os.kill(-1" in path.read_text() and not namespaces_available():
            continue
        result = unchecked.evaluate(get_problem(header(path, "problem")), path.read_text())
        assert result.category == Category(header(path, "expect-unchecked")), (path.stem, result.error)
    assert _server(unchecked) is server and server.alive and server.proc.pid == pid
    assert unchecked.evaluate(RELU.problem, RELU.text).category == Category.CORRECT


def test_a_killed_server_is_replaced(tmp_path: Path) -> None:
    ev = Evaluator(EvalConfig(device="cpu", timeout_s=60), cache_dir=tmp_path)
    assert ev.evaluate(RELU.problem, RELU.text).category == Category.CORRECT
    server = _server(ev)
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    result = ev.evaluate(RELU.problem, RELU.text)
    assert result.category == Category.CORRECT, result.error
    assert _server(ev) is not server and _server(ev).alive


@pytest.mark.slow  # the cold path: a fresh interpreter per candidate, seconds each
@pytest.mark.parametrize("path", FAULTS, ids=[p.stem for p in FAULTS])
def test_cold_path_gives_the_same_verdicts(path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """With the pool off, a fresh interpreter per candidate: the fault corpus's verdicts do not change."""
    if "os.kill(-1" in path.read_text() and not namespaces_available():
        pytest.skip("no PID namespace here: a kill(-1) candidate would hit the test runner")
    config = EvalConfig(device="cpu", timeout_s=20, memory_mb=3072, static_checks=False, warm_pool=False)
    ev = Evaluator(config, cache_dir=tmp_path_factory.getbasetemp() / "cold-cache")
    result = ev.evaluate(get_problem(header(path, "problem")), path.read_text())
    assert result.category == Category(header(path, "expect-unchecked")), (result.error, result.stderr_tail)


def test_fork_server_is_shared_per_environment(tmp_path: Path) -> None:
    """One warm server per kind of evaluation in a process, whatever the cache directory."""
    env = {"PATH": os.environ["PATH"], "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    a = fork_server(env, True, tmp_path / "a")
    b = fork_server(dict(env), True, tmp_path / "b")
    c = fork_server({**env, "TRITON_INTERPRET": "0"}, True, tmp_path / "c")
    assert a is b and a is not c
    c.close()
    assert not c.alive

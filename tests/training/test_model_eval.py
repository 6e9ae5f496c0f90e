"""`kbrl eval-model`'s engine: the pass@k / fast_p estimators on hand-computed cases, and whole runs on CPU
(tiny random model → 4 samples → LocalQueue → SQLite), checked against the events they leave behind."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from kbrl.events.payloads import (
    EvalRequested,
    EvalRunFinished,
    EvalRunStarted,
    KernelEvaluated,
    SampleGenerated,
)
from kbrl.events.store import EventStore
from kbrl.kernels.evaluator import EvalConfig
from kbrl.problems import builtin_solutions, get_problem
from kbrl.training.backends.base import Backend, SampledSequence
from kbrl.training.model_eval import (
    SampleOutcome,
    compute_metrics,
    eval_model_cli,
    evaluate_model,
    load_policy,
    pass_at_k,
    pass_ks,
)
from kbrl.training.replay import decode_numbers
from kbrl.workers.queue import LocalQueue

CPU = EvalConfig(device="cpu", n_trials=1, timeout_s=120)

# ------------------------------------------------------------------------------------------ estimators


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # c/n
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (5, 0, 3, 0.0),
        (5, 5, 1, 1.0),
        (5, 4, 2, 1.0),  # n - c < k: every draw of 2 holds a correct one
        (4, 1, 4, 1.0),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_k_is_unbiased_not_the_plugin_estimate() -> None:
    # The plug-in 1 - (1 - c/n)^k gives 0.64 here; drawing 2 of 5 without replacement gives 0.7.
    assert pass_at_k(5, 2, 2) != pytest.approx(1 - (1 - 2 / 5) ** 2)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)  # k > n: undefined
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


def test_pass_ks_are_powers_of_two_then_k() -> None:
    assert pass_ks(1) == [1]
    assert pass_ks(2) == [1, 2]
    assert pass_ks(5) == [1, 2, 4, 5]
    assert pass_ks(8) == [1, 2, 4, 8]


def _outcome(
    pid: str, i: int, category: str | None, speedup: Any = None, compiled: bool | None = None
) -> SampleOutcome:
    if category is None:
        return SampleOutcome(f"{pid}/s{i}", pid, error="evaluator crashed")
    compiled = category in ("CORRECT", "CORRECTNESS_ERROR", "RUNTIME_ERROR") if compiled is None else compiled
    result = {"category": category, "compiled": compiled, "speedup_eager": speedup}
    return SampleOutcome(f"{pid}/s{i}", pid, result=result)


def _synthetic() -> list[SampleOutcome]:
    """Problem A: two correct (1.2x, 0.8x), a compile error, a format error. Problem B: one correct (2.5x),
    a wrong answer, an evaluator failure, a runtime error."""
    a = ["CORRECT", "CORRECT", "COMPILATION_ERROR", "FORMAT_ERROR"]
    b = ["CORRECT", "CORRECTNESS_ERROR", None, "RUNTIME_ERROR"]
    speed_a = [1.2, 0.8, None, None]
    speed_b = [2.5, None, None, None]
    return [_outcome("A", i, c, s) for i, (c, s) in enumerate(zip(a, speed_a))] + [
        _outcome("B", i, c, s) for i, (c, s) in enumerate(zip(b, speed_b))
    ]


def test_metrics_on_synthetic_verdicts_with_timing() -> None:
    m = compute_metrics(_synthetic(), k=4, timed=True)
    assert m.n_problems == 2 and m.n_samples == 8 and m.n_eval_failed == 1 and m.n_missing == 0
    # pass@k' per problem (c_A = 2, c_B = 1, n = 4), averaged
    assert m.pass_at[1] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert m.pass_at[2] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)
    assert m.pass_at[4] == pytest.approx(1.0)
    # fast_p per sample: mean over problems of the fraction of samples correct and faster than p
    assert m.fast_p == pytest.approx(
        {0.0: 3 / 8, 1.0: (1 / 4 + 1 / 4) / 2, 1.5: (0 + 1 / 4) / 2, 2.0: (0 + 1 / 4) / 2}
    )
    assert m.fast_p[0.0] == pytest.approx(m.pass_at[1])  # fast_0 is the correctness rate, as in KernelBench
    # fast_p@4, best of k: A's best is 1.2x, B's is 2.5x
    assert m.fast_p_at_k == pytest.approx({0.0: 1.0, 1.0: 1.0, 1.5: 0.5, 2.0: 0.5})
    assert m.fast_at[2][1.0] == pytest.approx((0.5 + 0.5) / 2)  # one fast sample in 4, draws of 2
    assert m.compile_rate == pytest.approx(5 / 8) and m.correct_rate == pytest.approx(3 / 8)
    assert m.categories == {"CORRECT": 3, "COMPILATION_ERROR": 1, "FORMAT_ERROR": 1, "CORRECTNESS_ERROR": 1,
                            "RUNTIME_ERROR": 1}  # fmt: skip
    assert m.mean_speedup == pytest.approx((1.2 + 0.8 + 2.5) / 3)
    assert m.geomean_speedup == pytest.approx((1.2 * 0.8 * 2.5) ** (1 / 3))
    assert [(s.problem_id, s.n_correct, s.best_speedup) for s in m.problems] == [("A", 2, 1.2), ("B", 1, 2.5)]
    assert m.problems[1].categories["EVAL_FAILED"] == 1
    flat = m.to_dict()
    assert flat["pass@1"] == m.pass_at[1] and flat["fast_1"] == m.fast_p[1.0] and flat["fast_1.5@4"] == 0.5
    assert flat["fast_2@2"] == m.fast_at[2][2.0] and flat["n"] == 8


def test_fast_p_is_none_not_zero_without_timing() -> None:
    outcomes = [_outcome("A", 0, "CORRECT"), _outcome("A", 1, "FORMAT_ERROR")]
    m = compute_metrics(outcomes, k=2, timed=False, not_timed_reason="evaluated on cpu")
    assert m.pass_at == {1: 0.5, 2: 1.0}  # correctness is still scored
    assert all(v is None for by_p in m.fast_at.values() for v in by_p.values())
    assert set(m.fast_p) == {0.0, 1.0, 1.5, 2.0}
    assert m.mean_speedup is None and m.geomean_speedup is None
    assert any("not measured" in note and "evaluated on cpu" in note for note in m.notes)
    assert m.to_dict()["fast_1"] is None and m.to_dict()["fast_1@2"] is None


def test_timed_run_without_a_correct_kernel_scores_zero_not_none() -> None:
    m = compute_metrics([_outcome("A", 0, "COMPILATION_ERROR"), _outcome("B", 0, "CHEAT")], k=1, timed=True)
    assert m.fast_p == {0.0: 0.0, 1.0: 0.0, 1.5: 0.0, 2.0: 0.0}


def test_stored_non_finite_speedups_and_missing_verdicts() -> None:
    outcomes = [
        _outcome("A", 0, "CORRECT", "Infinity"),  # how the store keeps inf inside free-form dicts
        _outcome("A", 1, "CORRECT", "NaN"),
        SampleOutcome("B/s0", "B", error="no verdict", missing=True),
    ]
    m = compute_metrics(outcomes, k=2, timed=True, ps=(1.0,))
    assert m.fast_p[1.0] == pytest.approx((1 / 2 + 0) / 2)  # inf > 1; NaN is not faster than anything
    assert m.mean_speedup is None  # neither is a usable speedup to average
    assert m.n_missing == 1 and m.pass_at == {1: 0.5}  # B has 1 sample: k' = 2 is left out, with a note
    assert any("pass@k' reported for k' <= 1" in note for note in m.notes)


# ------------------------------------------------------------------------------------------ whole runs


def _run_events(store: EventStore, run_id: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for event in store.read(run_id=run_id):
        out.setdefault(event.type, []).append(event)
    return out


def test_tiny_model_end_to_end_on_cpu(tmp_path: Path, tiny_model_path: Path, one_torch_thread: None) -> None:
    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    queue = LocalQueue(store, workers=2)
    problems = [get_problem("builtin/L1/5"), get_problem("builtin/L1/6")]
    out = tmp_path / "results" / "eval.json"
    with load_policy(str(tiny_model_path), "local", None, device="cpu", lora_rank=2) as policy:
        report = evaluate_model(policy, problems, k=2, max_tokens=32, temperature=1.0, kernel_backend="triton",
                                store=store, queue=queue, eval_config=CPU, device="cpu", model_label="tiny-test",
                                run_id="em-1", progress=True, out=out, tensorboard_dir=tmp_path / "tb",
                                tensorboard_step=3)  # fmt: skip
    queue.close()

    events = _run_events(store, "em-1")
    (started,) = events[EvalRunStarted.event_type]
    assert started.payload["kind"] == "eval-model" and started.payload["model"] == "tiny-test"
    assert started.payload["n_candidates"] == 4
    assert started.payload["problem_ids"] == ["builtin/L1/5", "builtin/L1/6"]
    assert started.payload["config"]["k"] == 2 and started.payload["config"]["eval"]["device"] == "cpu"

    samples = events[SampleGenerated.event_type]
    assert sorted(e.key for e in samples) == [f"em-1/builtin/L1/{n}/s{i}" for n in (5, 6) for i in (0, 1)]
    for e in samples:
        p = e.payload
        assert p["step"] == 0 and p["turn"] == 0 and p["traj"] == f"{p['problem_id']}/{e.key[-1]}"
        assert p["group"] == (0 if p["problem_id"] == "builtin/L1/5" else 1)
        tokens = decode_numbers(store.get_blob(p["completion_ref"]))
        logprobs = decode_numbers(store.get_blob(p["logprobs_ref"]))
        assert len(tokens) == len(logprobs) == p["n_completion_tokens"] <= 32
        assert len(decode_numbers(store.get_blob(p["prompt_ref"]))) == p["n_prompt_tokens"] > 0
    # Jobs carry no text: the worker read each sample from its SampleGenerated event.
    assert all(e.payload["text"] is None for e in events[EvalRequested.event_type])

    verdicts = events[KernelEvaluated.event_type]
    assert sorted(e.payload["sample_id"] for e in verdicts) == sorted(e.key for e in samples)
    assert {e.payload["result"]["category"] for e in verdicts} == {
        "FORMAT_ERROR"
    }  # random weights write no code

    (finished,) = events[EvalRunFinished.event_type]
    summary = finished.payload["summary"]
    assert (
        finished.payload["status"] == "finished" and summary["run_id"] == "em-1"
    )  # our report, not a bare one
    assert summary["pass@1"] == 0.0 and summary["pass@2"] == 0.0
    assert summary["categories"] == {"FORMAT_ERROR": 4} and summary["n"] == 4 and summary["n_problems"] == 2
    assert summary["fast_1"] is None and summary["fast_1@2"] is None  # CPU: not timed
    assert [r.status for r in store.runs() if r.run_id == "em-1"] == ["finished"]

    assert report.metrics.pass_at == {1: 0.0, 2: 0.0} and report.status == "finished"
    data = json.loads(out.read_text())
    assert {k: v for k, v in data.items() if k != "samples"} == json.loads(json.dumps(report.to_dict()))
    assert len(data["samples"]) == 4
    assert {s["result"]["category"] for s in data["samples"]} == {"FORMAT_ERROR"}
    assert not list(out.parent.glob("*.tmp"))

    from kbrl.metrics.tensorboard import read_scalars

    scalars = read_scalars(tmp_path / "tb")
    assert scalars["eval_model/pass@1"] == [(3, 0.0)]
    assert "eval_model/fast_1" not in scalars  # unmeasured, so not plotted as 0


class ScriptedBackend(Backend):
    """A policy that answers from a script: the evaluator's positive and negative paths, no model needed."""

    name = "scripted"

    def __init__(self, tokenizer: Any, answers: Sequence[str]) -> None:
        super().__init__()
        self._tok = tokenizer
        self.answers = list(answers)

    @property
    def tokenizer(self) -> Any:
        return self._tok

    def sample(self, prompts: Sequence[Any], n: int, max_tokens: int, temperature: float = 1.0,
               stop: Any = None) -> list[list[SampledSequence]]:  # fmt: skip
        texts = [self.answers[i % len(self.answers)] for i in range(n)]
        return [[SampledSequence((1, 2), (-0.5, -0.25), t, "stop") for t in texts] for _ in prompts]

    def forward_backward(self, datums: Any, loss: Any = "importance_sampling") -> dict[str, float]:
        raise NotImplementedError

    def optim_step(self, params: Any) -> dict[str, float]:
        raise NotImplementedError

    def save_checkpoint(self, name: str) -> str:
        raise NotImplementedError

    def load_checkpoint(self, path: str) -> None:
        raise NotImplementedError

    def refresh_sampler(self) -> None:
        pass


def test_correct_and_wrong_samples_score_pass_at_k(tmp_path: Path, tiny_tokenizer: Any) -> None:
    """One correct Triton ReLU (run in the interpreter) and one answer without code: pass@1 = 1/2, pass@2 = 1."""
    relu = get_problem("builtin/L1/5")
    good = f"```python\n{builtin_solutions(relu)['triton']}\n```"
    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    queue = LocalQueue(store, workers=2)
    report = evaluate_model(ScriptedBackend(tiny_tokenizer, [good, "no code, sorry"]), [relu], k=2, max_tokens=8,
                            temperature=1.0, kernel_backend="triton", store=store, queue=queue, eval_config=CPU,
                            device="cpu", model_label="scripted", progress=False)  # fmt: skip
    queue.close()
    m = report.metrics
    assert m.pass_at == {1: 0.5, 2: 1.0}
    assert m.categories == {"CORRECT": 1, "FORMAT_ERROR": 1}
    assert m.fast_p[1.0] is None and m.mean_speedup is None  # correct, but the CPU cannot time it
    assert report.run_id.startswith("eval-model-") and store.count(report.run_id, [KernelEvaluated]) == 2


def test_evaluate_model_refuses_bad_arguments(tmp_path: Path, tiny_tokenizer: Any) -> None:
    store = EventStore(f"sqlite:///{tmp_path / 'kbrl.db'}")
    backend = ScriptedBackend(tiny_tokenizer, ["x"])
    relu = get_problem("builtin/L1/5")
    common: dict[str, Any] = dict(max_tokens=8, temperature=1.0, store=store, queue=LocalQueue(store),
                                  eval_config=CPU, device="cpu", model_label="x", progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="kernel backend"):
        evaluate_model(backend, [relu], k=1, kernel_backend="tilelang", **common)
    with pytest.raises(ValueError, match="duplicate"):
        evaluate_model(backend, [relu, relu], k=1, kernel_backend="triton", **common)
    with pytest.raises(ValueError, match="k must be"):
        evaluate_model(backend, [relu], k=0, kernel_backend="triton", **common)
    assert store.runs() == []  # nothing was started


# ------------------------------------------------------------------------------------------ policy & CLI


def test_load_policy_reads_the_checkpoint_lora_shape(tmp_path: Path, tiny_model_path: Path,
                                                      one_torch_thread: None) -> None:  # fmt: skip
    from kbrl.training.backends import make_backend

    with make_backend(
        "local", str(tiny_model_path), lora_rank=3, device="cpu", checkpoint_dir=tmp_path
    ) as trained:
        trained.restore_version(7)
        checkpoint = trained.save_checkpoint("step-7")
    # Default rank is 32: without reading adapter_config.json the adapter would not fit. "tiny" resolves to
    # the checkpoint's own base directory, so no fresh tiny model is built in the cache.
    with load_policy("tiny", "local", checkpoint, device="cpu", tiny_root=tmp_path / "cache") as policy:
        assert policy.policy_version == 7
        assert policy.model_name == str(tiny_model_path)  # type: ignore[attr-defined]
    assert not (tmp_path / "cache").exists()
    with pytest.raises(FileNotFoundError):
        load_policy(str(tiny_model_path), "local", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="local"):
        load_policy("tiny", "tinker", None)


def test_eval_model_cli(tmp_path: Path, tiny_model_path: Path, one_torch_thread: None,
                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from rich.console import Console

    url = f"sqlite:///{tmp_path / 'kbrl.db'}"
    monkeypatch.setenv("KBRL_DATABASE_URL", url)
    monkeypatch.delenv("KBRL_BROKER_URL", raising=False)
    console = Console(record=True, width=160)
    args: dict[str, Any] = dict(model=str(tiny_model_path), backend="local", checkpoint=None, level=1,
                                source="builtin", k=1, max_tokens=16, temperature=1.0, kernel_backend="triton",
                                device="cpu", out=tmp_path / "out.json", timeout=60.0, trials=1,
                                tensorboard_dir=None, tensorboard_step=None, progress=False, console=console)  # fmt: skip
    assert eval_model_cli(problem_ids=["builtin/L1/404"], **args) == 2
    assert "builtin/L1/404" in console.export_text()
    assert eval_model_cli(problem_ids=["builtin/L1/5"], run_id="cli-1", **args) == 0
    text = console.export_text()
    assert "pass@1" in text and "builtin/L1/5" in text and "cli-1" in text and "not measured" in text
    assert json.loads((tmp_path / "out.json").read_text())["run_id"] == "cli-1"
    assert EventStore(url).get("cli-1/finished") is not None
    assert math.isclose(json.loads((tmp_path / "out.json").read_text())["pass@1"], 0.0)

"""RA-ICL end to end: `kbrl train --config tiny_cpu dataset_builder.prompt_option=raicl …` and `kbrl eval-model
--rag-index` put k retrieved examples into the recorded prompts, visible through `kbrl replay --samples`,
with the leakage guard's removals counted (and gone with --allow-same-task)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kbrl.events.payloads import SampleGenerated
from kbrl.events.store import EventStore
from kbrl.training.model_eval import eval_model_cli


def _kbrl(*args: str) -> list[str]:
    return [sys.executable, "-m", "kbrl.cli", *args]


def test_train_with_raicl_prompts_and_replay(tmp_path: Path, index_dir: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kbrl.db'}"
    env = {k: v for k, v in os.environ.items() if k != "KBRL_BROKER_URL"}
    env.update(KBRL_DATABASE_URL=url, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    train = subprocess.run(_kbrl("train", "--config", "tiny_cpu", "run_id=rag", "n_steps=1", "group_size=2",
                                 f"log_path={tmp_path}/runs/{{run_id}}", "dataset_builder.prompt_option=raicl",
                                 f"dataset_builder.rag_index_path={index_dir}"),
                           env=env, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert train.returncode == 0, train.stdout[-2000:] + train.stderr[-3000:]
    samples = [SampleGenerated.model_validate(e.payload) for e in EventStore(url).read(run_id="rag", types=[SampleGenerated])]
    assert len(samples) == 4  # 2 problems × group of 2
    assert all(len(s.rag_examples) == 3 and s.rag_dropped_for_budget == 0 for s in samples)
    relu = [s for s in samples if s.problem_id == "builtin/L1/5"]  # builtin ReLU = KernelBench 19_ReLU
    assert relu and all(s.rag_removed_same_task == 1 and "sakana/L1/19/3" not in s.rag_examples for s in relu)
    gelu = [s for s in samples if s.problem_id == "builtin/L1/6"]  # the ReLU solution is a fair example here
    assert gelu and all(s.rag_removed_same_task == 0 and "sakana/L1/19/3" in s.rag_examples for s in gelu)

    replay = subprocess.run(_kbrl("replay", "rag", "--samples"), env=env, capture_output=True, text=True, timeout=300)
    assert replay.returncode == 0, replay.stderr[-2000:]
    blocks = replay.stdout.split("=== ")[1:]
    assert len(blocks) == 4
    for s, block in zip(samples, blocks, strict=True):
        assert f"RA-ICL examples: {', '.join(s.rag_examples)}; withheld as same task: {s.rag_removed_same_task}" in block
        assert "Here are examples of PyTorch code rewritten with custom Triton kernels." in block
        assert "Example 1:" in block and "Example 3:" in block and "Example 4:" not in block
        assert all(f"({x}" in block for x in s.rag_examples)  # each example's header names its id
        assert "You are given the following PyTorch architecture" in block  # the problem itself follows


def test_eval_model_with_raicl_and_the_guard_ablation(tmp_path: Path, index_dir: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    from rich.console import Console

    from kbrl.training.tiny import build_tiny_model

    url = f"sqlite:///{tmp_path / 'kbrl.db'}"
    monkeypatch.setenv("KBRL_DATABASE_URL", url)
    monkeypatch.delenv("KBRL_BROKER_URL", raising=False)
    model = build_tiny_model(tmp_path / "tiny", seed=0)
    args: dict[str, Any] = dict(model=str(model), backend="local", checkpoint=None, level=1, source="builtin",
                                problem_ids=["builtin/L1/5"], k=1, max_tokens=8, temperature=1.0,
                                kernel_backend="triton", device="cpu", out=tmp_path / "out.json", timeout=60.0,
                                trials=1, tensorboard_dir=None, tensorboard_step=None, progress=False,
                                console=Console(record=True, width=160), rag_index=str(index_dir), raicl_k=2)  # fmt: skip
    assert eval_model_cli(run_id="guarded", **args) == 0
    assert eval_model_cli(run_id="ablation", allow_same_task=True, **args) == 0
    store = EventStore(url)
    (guarded,) = [SampleGenerated.model_validate(e.payload) for e in store.read(run_id="guarded", types=[SampleGenerated])]
    (ablation,) = [SampleGenerated.model_validate(e.payload) for e in store.read(run_id="ablation", types=[SampleGenerated])]
    assert len(guarded.rag_examples) == 2 and guarded.rag_removed_same_task == 1
    assert "sakana/L1/19/3" not in guarded.rag_examples
    assert ablation.rag_examples[0] == "sakana/L1/19/3" and ablation.rag_removed_same_task == 0
    assert ablation.rag_examples[1] == guarded.rag_examples[0]  # the same ranking, less the withheld one
    assert eval_model_cli(run_id="missing", **(args | {"rag_index": str(tmp_path / "nowhere")})) == 2
    assert "no RA-ICL index directory" in args["console"].export_text()


def test_train_config_errors_name_what_to_do(tmp_path: Path) -> None:
    from kbrl.config import load_config
    from kbrl.training.trainer import TrainingError, open_run_retriever

    assert open_run_retriever(load_config("tiny_cpu")) is None  # basic prompts: no index needed
    with pytest.raises(TrainingError, match="prompt_option=raicl needs dataset_builder.rag_index_path"):
        open_run_retriever(load_config("tiny_cpu", ["dataset_builder.prompt_option=raicl"]))
    with pytest.raises(TrainingError, match="rag_index_path: no RA-ICL index directory"):
        open_run_retriever(load_config("tiny_cpu", ["dataset_builder.prompt_option=raicl",
                                                    f"dataset_builder.rag_index_path={tmp_path / 'none'}"]))  # fmt: skip

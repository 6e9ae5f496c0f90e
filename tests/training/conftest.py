"""Fixtures for the training tests: the tiny model, built once per session, and a light CPU footprint.

* `tiny_model_path` — a directory with a random-init tiny Llama and its locally trained tokenizer, saved in
  Hugging Face format (loaded through the same `from_pretrained(path)` as a real model id).
* `tiny_tokenizer`  — that tokenizer, loaded with `AutoTokenizer`.
* `one_torch_thread` — torch on one thread for the test (the host's cores are shared), restored after.
"""

from __future__ import annotations

from collections.abc import Iterator
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

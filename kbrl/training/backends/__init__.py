"""Training backends behind one interface: `tinker` (the Tinker service) and `local` (transformers + peft).

`make_backend("local" | "tinker", ...)` imports only the chosen one, so a Tinker run never loads peft and a
local run never needs the Tinker SDK.
"""

from __future__ import annotations

from typing import Any

from kbrl.training.backends.base import AdamParams, Backend, LossName, SampledSequence, StopReason, Tokenizer

BACKENDS = ("local", "tinker")

__all__ = [
    "BACKENDS",
    "AdamParams",
    "Backend",
    "LossName",
    "SampledSequence",
    "StopReason",
    "Tokenizer",
    "make_backend",
]


def make_backend(kind: str, model: str, **options: Any) -> Backend:
    """A backend of `kind` for `model` (a Hugging Face id or, for `local`, a checkpoint directory).

    `options` go to the backend's constructor (e.g. `lora_rank`, `seed`, `checkpoint_dir` for local,
    `resume_from` for tinker).
    """
    if kind == "local":
        from kbrl.training.backends.local import LocalBackend

        return LocalBackend(model, **options)
    if kind == "tinker":
        from kbrl.training.backends.tinker_backend import TinkerBackend

        return TinkerBackend(model, **options)
    raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")

"""The problem record shared by every loader: a KernelBench-format PyTorch reference."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One KernelBench-format problem: `class Model`, `get_inputs()`, `get_init_inputs()` in `code`.

    `collection` names where the problem comes from ("kernelbench" for the upstream set, whether read
    from a checkout or from the Hugging Face dataset, so both give the same id; "builtin" for kbrl's
    offline set). `number` is the 1-based task id inside its level, as in `{number}_{name}.py`.
    """

    collection: str
    level: int
    number: int
    name: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.collection}/L{self.level}/{self.number}"

    @property
    def code_hash(self) -> str:
        """Content hash of the reference source; keys baseline timings and reference-output caches."""
        return hashlib.sha256(self.code.encode()).hexdigest()[:16]

"""Retrieval for RA-ICL prompts: the k examples whose PyTorch code is nearest a problem's, with a leakage guard.

The guard (on by default) withholds every example derived from the problem being solved, since the Sakana
archive holds finished solutions of KernelBench's own tasks; a policy shown one would learn to copy. An
example is withheld when any of these holds:

1. same task: the problem is a KernelBench one (`collection == "kernelbench"`) and the example was made for
   the same level and task number (Sakana's `Level_ID`/`Task_ID`);
2. same code: the example's normalised PyTorch code hash equals the problem's (`corpus.code_hash`: comments,
   docstrings and formatting ignored) — this also catches copies of a KernelBench task in other problem
   sets, whose numbering differs (kbrl's built-in set);
3. near duplicate: the cosine similarity of the two PyTorch codes is at least `near_duplicate`
   (renamed variables, a reordered file).

How many were withheld is returned with the examples, and recorded on each sample's `SampleGenerated`
(`rag_removed_same_task`), so a run shows how much the guard did. `allow_same_task=True` turns it off, for
ablations (`--allow-same-task`, `dataset_builder.raicl_allow_same_task`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kbrl.problems.model import Problem
from kbrl.rag.corpus import Example, code_hash
from kbrl.rag.embed import Embedder
from kbrl.rag.index import RagIndex, read_meta

NEAR_DUPLICATE = 0.98
"""Default cosine similarity at or above which an example's PyTorch code counts as the problem's own."""

KERNEL_LANG = {"triton": "python", "cuda": "cpp"}
KERNEL_TITLE = {"triton": "Triton", "cuda": "CUDA"}


@dataclass(frozen=True)
class Retrieval:
    """The examples for one problem (most similar first) and what the leakage guard withheld."""

    examples: tuple[Example, ...]
    scores: tuple[float, ...]
    removed_same_task: int
    removed_ids: tuple[str, ...] = ()


class Retriever:
    """Nearest examples for problems, through one index and the embedding model it was built with."""

    def __init__(self, index: RagIndex, embedder: Embedder, *, allow_same_task: bool = False,
                 near_duplicate: float = NEAR_DUPLICATE) -> None:  # fmt: skip
        self.index, self.embedder = index, embedder
        self.allow_same_task, self.near_duplicate = allow_same_task, near_duplicate
        self._cache: dict[tuple[str, str, int], Retrieval] = {}

    @classmethod
    def open(cls, path: str | Path, *, model: str | None = None, allow_same_task: bool = False,
             near_duplicate: float = NEAR_DUPLICATE, device: str | None = None) -> Retriever:  # fmt: skip
        """Load the index at `path` with `model` (default: the model it records), refusing another model."""
        meta = read_meta(Path(path))
        embedder = Embedder(model or str(meta["model"]), device=device, max_seq_length=meta.get("max_seq_length"))
        return cls(RagIndex.load(path, embedder), embedder, allow_same_task=allow_same_task,
                   near_duplicate=near_duplicate)  # fmt: skip

    def same_task(self, problem: Problem, problem_hash: str, example: Example, score: float) -> bool:
        """Whether `example` is derived from `problem` (the three tests of the module docstring)."""
        if problem.collection == "kernelbench" and (example.level, example.task) == (problem.level, problem.number):
            return True
        return example.code_hash == problem_hash or score >= self.near_duplicate

    def retrieve(self, problem: Problem, k: int) -> Retrieval:
        """The `k` nearest examples not derived from `problem` (fewer only if the index runs out)."""
        return self.retrieve_many([problem], k)[0]

    def retrieve_many(self, problems: Sequence[Problem], k: int) -> list[Retrieval]:
        """`retrieve` for several problems, embedded in one batch; results are cached per problem code."""
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        keys = [(p.id, p.code_hash, k) for p in problems]
        todo = [p for p, key in zip(problems, keys, strict=True) if key not in self._cache]
        if todo:
            vectors = self.embedder.embed([p.code for p in todo])
            for problem, vector in zip(todo, vectors, strict=True):
                self._cache[(problem.id, problem.code_hash, k)] = self._pick(problem, vector[None, :], k)
        return [self._cache[key] for key in keys]

    def _pick(self, problem: Problem, vector: np.ndarray, k: int) -> Retrieval:
        """Walk the hits in order until k examples survive the guard, searching wider while the index has more.

        The withheld ones counted are those ranked above the k-th kept example: the ones the prompt would
        have shown without the guard.
        """
        problem_hash = code_hash(problem.code)
        total = len(self.index.examples)
        n = min(total, 4 * k + 16)
        while True:
            (hits,) = self.index.search(vector, n)
            kept: list[tuple[float, Example]] = []
            removed: list[str] = []
            for score, position in hits:
                if len(kept) == k:
                    break
                example = self.index.examples[position]
                if not self.allow_same_task and self.same_task(problem, problem_hash, example, score):
                    removed.append(example.id)
                else:
                    kept.append((score, example))
            if len(kept) == k or n >= total:
                return Retrieval(tuple(e for _, e in kept), tuple(s for s, _ in kept), len(removed), tuple(removed))
            n = min(total, n * 4)


def render_example(example: Example) -> str:
    """An example as prompt text: the PyTorch program, then its kernel implementation, each in a code block."""
    title = KERNEL_TITLE[example.backend]
    speed = f", {example.speedup:.2f}x faster than PyTorch" if example.speedup else ""
    return (f"`{example.name}` ({example.id}{speed})\n\nPyTorch:\n```python\n{example.pytorch_code.strip()}\n```\n\n"
            f"{title} implementation:\n```{KERNEL_LANG[example.backend]}\n{example.kernel_code.strip()}\n```")  # fmt: skip

"""RA-ICL in training and evaluation: the first-turn prompt with retrieved examples, and what a sample records.

Only turn 0 carries examples. Refinement turns (Kevin mode) show the task, the policy's own earlier kernels
and the evaluator's feedback instead: by then the model has its own attempt to fix, the examples would
compete with that history for `max_prompt_tokens`, and a refinement prompt stays the same with or without
RA-ICL, so multi-turn comparisons isolate what the examples do to the first attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kbrl.problems.model import Problem
from kbrl.prompts import fit_task_prompt, task_messages
from kbrl.training.backends import Backend

if TYPE_CHECKING:
    from kbrl.rag.retrieve import Retriever


def open_retriever(index_path: str, *, allow_same_task: bool = False) -> Retriever:
    """The retriever of the index at `index_path`, with the embedding model it was built with.

    Raises ValueError (RagIndexError, EmbedError) with a message saying what to do when the index is
    missing, unreadable or its model cannot be loaded.
    """
    from kbrl.rag.retrieve import Retriever

    return Retriever.open(index_path, allow_same_task=allow_same_task)


def first_turn_prompt(problem: Problem, *, backend: Backend, kernel_backend: str, retriever: Retriever | None,
                      k: int, max_prompt_tokens: int) -> tuple[list[int], dict[str, Any]]:  # fmt: skip
    """Turn 0's prompt tokens and the `SampleGenerated` RA-ICL fields ({} without a retriever).

    With a retriever: the k nearest examples that pass the leakage guard, rendered into the prompt; the
    longest are dropped while the prompt exceeds `max_prompt_tokens` (the task is never cut).
    """
    if retriever is None:
        return backend.encode_prompt(task_messages(problem, kernel_backend)), {}
    from kbrl.rag.retrieve import render_example

    found = retriever.retrieve(problem, k)
    rendered = [render_example(e) for e in found.examples]
    ids, kept = fit_task_prompt(problem, kernel_backend, rendered, backend.encode_prompt, max_prompt_tokens)
    return ids, {"rag_examples": [found.examples[i].id for i in kept],
                 "rag_removed_same_task": found.removed_same_task,
                 "rag_dropped_for_budget": len(rendered) - len(kept)}  # fmt: skip

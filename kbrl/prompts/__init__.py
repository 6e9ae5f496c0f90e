"""Prompts: the KernelBench task as chat messages, and the refinement turn that shows a kernel's feedback.

Single-turn prompts follow KernelBench's own (the reference architecture, the instruction to write
`ModelNew` with custom kernels, one code block as the answer); the backend's chat template turns the
messages into tokens. Later turns (Kevin mode) append the previous answer and the evaluator's categorized
feedback, so the model sees exactly what the reward saw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kbrl.problems.model import Problem

Message = dict[str, str]

SYSTEM = (
    "You are an expert GPU kernel engineer. You replace PyTorch operators with custom {backend_name} kernels "
    "that are correct and faster than PyTorch."
)

BACKEND_NAMES = {"cuda": "CUDA", "triton": "Triton"}

BACKEND_HOWTO = {
    "cuda": "Write the kernels in CUDA C++ and compile them inline with "
    "`torch.utils.cpp_extension.load_inline`.",
    "triton": "Write the kernels in Triton (`@triton.jit` functions launched from Python).",
}

TASK = """You are given the following PyTorch architecture:

```python
{reference}
```

Replace its operators with custom {backend_name} kernels to get a speedup. {howto} You may fuse operators
(e.g. matmul + activation) and change algorithms (e.g. online softmax), but the outputs must match the
reference within tolerance on random inputs from `get_inputs()`. Do not call the reference `Model`, do not
fall back to PyTorch for the work you replace, and do not cache outputs across calls.

Name the optimized architecture `ModelNew`, with the same `__init__` arguments and `forward` signature as
`Model`. Answer with the complete Python code of `ModelNew` (imports and kernels included) in one
```python code block, and nothing after it."""

REFINE = """Your kernel was evaluated.

{feedback}

Improve it: fix what failed, or make it faster if it is correct. Answer with the complete new `ModelNew` in
one ```python code block."""


@dataclass(frozen=True)
class Turn:
    """One earlier attempt in a trajectory: the model's answer and the evaluator's feedback on it."""

    answer: str
    feedback: str


def task_messages(problem: Problem, backend: str = "triton", examples: Sequence[str] = ()) -> list[Message]:
    """The first-turn prompt for `problem`; `examples` are retrieved PyTorch→kernel pairs (RA-ICL)."""
    if backend not in BACKEND_NAMES:
        raise ValueError(f"unknown kernel backend {backend!r}; choose one of {sorted(BACKEND_NAMES)}")
    name = BACKEND_NAMES[backend]
    user = TASK.format(reference=problem.code.strip(), backend_name=name, howto=BACKEND_HOWTO[backend])
    if examples:
        shots = "\n\n".join(f"Example {i + 1}:\n{ex.strip()}" for i, ex in enumerate(examples))
        user = f"Here are examples of PyTorch code rewritten with custom {name} kernels.\n\n{shots}\n\n{user}"
    return [{"role": "system", "content": SYSTEM.format(backend_name=name)}, {"role": "user", "content": user}]


def fit_task_prompt(problem: Problem, backend: str, examples: Sequence[str],
                    encode: Callable[[list[Message]], list[int]], max_tokens: int) -> tuple[list[int], list[int]]:  # fmt: skip
    """The first-turn prompt's tokens with as many `examples` as fit in `max_tokens`, and the positions kept.

    The longest example goes first while the prompt is over budget; the task itself is never cut (with no
    examples left the prompt is the plain task, whatever its length).
    """
    kept = list(range(len(examples)))
    while True:
        ids = encode(task_messages(problem, backend, [examples[i] for i in kept]))
        if len(ids) <= max_tokens or not kept:
            return ids, kept
        kept.remove(max(kept, key=lambda i: len(examples[i])))


def refinement_messages(problem: Problem, history: Sequence[Turn], backend: str = "triton",
                        examples: Sequence[str] = (), keep_last: int | None = None) -> list[Message]:  # fmt: skip
    """The prompt of turn len(history): the task, then each earlier answer and its feedback.

    With `keep_last`, only the last `keep_last` turns are shown in full; older ones shrink to one line
    each (their verdict), so long trajectories fit a token budget. The task itself is never cut.
    """
    messages = task_messages(problem, backend, examples)
    shown = list(history) if keep_last is None else list(history[len(history) - keep_last :]) if keep_last else []
    older = history[: len(history) - len(shown)]
    if older:
        lines = "\n".join(f"- attempt {i + 1}: {_status_line(t.feedback)}" for i, t in enumerate(older))
        messages[-1] = {"role": "user", "content": messages[-1]["content"] + f"\n\nYour earlier attempts (not shown):\n{lines}"}
    for turn in shown:
        messages.append({"role": "assistant", "content": turn.answer})
        messages.append({"role": "user", "content": REFINE.format(feedback=turn.feedback.strip())})
    return messages


def _status_line(feedback: str) -> str:
    """The first line of a feedback text (its status), for summarized turns."""
    first = feedback.strip().splitlines()[0] if feedback.strip() else "no feedback"
    return first[:200]

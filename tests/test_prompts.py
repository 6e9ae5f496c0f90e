"""Prompts: the KernelBench task as chat messages, and refinement turns carrying the evaluator's feedback."""

from __future__ import annotations

import pytest

from kbrl.problems import get_problem
from kbrl.prompts import Turn, refinement_messages, task_messages


def test_task_prompt_carries_the_reference_and_the_contract() -> None:
    problem = get_problem("builtin/L1/5")
    system, user = task_messages(problem, "cuda")
    assert system["role"] == "system" and "CUDA" in system["content"]
    assert problem.code.strip() in user["content"] and "load_inline" in user["content"]
    assert "ModelNew" in user["content"] and "```python" in user["content"]
    assert "@triton.jit" in task_messages(problem, "triton")[1]["content"]


def test_examples_and_refinement_turns() -> None:
    problem = get_problem("builtin/L1/6")
    messages = task_messages(problem, "triton", examples=["EXAMPLE-ONE", "EXAMPLE-TWO"])
    assert "Example 1:\nEXAMPLE-ONE" in messages[1]["content"] and "Example 2:" in messages[1]["content"]
    history = [Turn("first answer", "Status: COMPILATION_ERROR\nerror: foo"), Turn("second", "Status: CORRECT")]
    chat = refinement_messages(problem, history)
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert chat[2]["content"] == "first answer" and "COMPILATION_ERROR" in chat[3]["content"]
    with pytest.raises(ValueError, match="unknown kernel backend"):
        task_messages(problem, "opencl")

"""extract_code on the completion shapes LLMs produce: fences, several blocks, none, cut-off, reasoning."""

from __future__ import annotations

import ast

from kbrl.kernels.extract import extract_code, strip_reasoning

KERNEL = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=offs < n), 0.0), mask=offs < n)
"""
MODEL = """class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
"""
FULL = KERNEL + "\n\n" + MODEL


def fence(code: str, lang: str = "python") -> str:
    return f"```{lang}\n{code.rstrip()}\n```\n"


def defines_modelnew(code: str | None) -> bool:
    assert code is not None
    return any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in ast.walk(ast.parse(code)))


def test_single_fenced_block() -> None:
    assert extract_code(f"Here is the kernel:\n\n{fence(FULL)}\nIt is fast.") == FULL


def test_fence_without_language_and_tilde_fences() -> None:
    assert extract_code(fence(FULL, "")) == FULL
    assert extract_code(f"~~~py\n{FULL}~~~\n") == FULL


def test_indented_fence_in_a_list_item() -> None:
    indented = "".join("   " + line if line.strip() else line for line in FULL.splitlines(keepends=True))
    assert extract_code(f"1. The code:\n   ```python\n{indented}   ```\n") == FULL


def test_last_modelnew_block_wins() -> None:
    draft = FULL.replace("BLOCK=1024", "BLOCK=256")
    text = f"First try:\n{fence(draft)}\nBetter:\n{fence(FULL)}\nUsage:\n{fence('m = ModelNew()')}"
    assert extract_code(text) == FULL


def test_broken_final_answer_is_returned_for_the_syntax_error() -> None:
    broken = FULL.replace("return out", "return out +")
    code = extract_code(f"{fence(FULL)}\nFinal:\n{fence(broken)}")
    assert code == broken


def test_kernel_in_its_own_block_is_joined() -> None:
    code = extract_code(f"The kernel:\n{fence(KERNEL)}\nThe model:\n{fence(MODEL)}")
    assert code is not None and "relu_kernel" in code and defines_modelnew(code)
    assert code.index("def relu_kernel") < code.index("class ModelNew")


def test_kernel_after_the_model_is_appended() -> None:
    code = extract_code(f"{fence(MODEL)}\nwith this kernel:\n{fence(KERNEL)}")
    assert code is not None and defines_modelnew(code) and "def relu_kernel" in code


def test_cuda_block_and_python_block() -> None:
    cuda = "__global__ void k(float* x) {}\n"
    code = extract_code(f"{fence(cuda, 'cuda')}\n{fence(FULL)}")
    assert code == FULL


def test_class_split_across_blocks_is_joined() -> None:
    head, tail = FULL.split("        out = torch.empty_like(x)\n")
    text = fence(head + "        out = torch.empty_like(x)\n") + "\n(continued)\n" + fence(tail)
    code = extract_code(text)
    assert code is not None and defines_modelnew(code) and "return out" in code


def test_block_cut_mid_expression_is_joined() -> None:
    head, tail = FULL.split("tl.maximum(")
    code = extract_code(fence(head + "tl.maximum(") + fence(tail))
    assert code is not None and defines_modelnew(code)


def test_no_fences() -> None:
    assert extract_code(FULL) == FULL
    assert extract_code("Sure! Here it is.\n\n" + FULL) == FULL


def test_no_fences_with_trailing_prose() -> None:
    code = extract_code("Here it is:\n" + FULL + "\nThis launches one program per 1024 elements.\n")
    assert code is not None and defines_modelnew(code) and "launches one program" not in code


def test_unterminated_fence_runs_to_the_end() -> None:
    assert extract_code("Answer:\n```python\n" + FULL) == FULL
    cut = FULL[: FULL.index("return out")]
    code = extract_code("```python\n" + cut)
    assert code is not None and "class ModelNew" in code


def test_python_in_a_mislabelled_fence() -> None:
    assert extract_code(fence(FULL, "cuda")) == FULL


def test_reasoning_is_dropped() -> None:
    draft = FULL.replace("ModelNew", "ModelNew  # draft")
    text = f"<think>Let me try\n{fence(draft)}\nhmm</think>\nFinal answer:\n{fence(FULL)}"
    assert extract_code(text) == FULL
    assert extract_code(f"the prompt opened the think tag ... </think>\n{fence(FULL)}") == FULL
    assert extract_code(f"{fence(FULL)}\n<think>and then it was cut off") == FULL
    assert strip_reasoning("a<thinking>b</thinking>c") == "ac"


def test_nothing_found() -> None:
    assert extract_code("") is None
    assert extract_code("   \n") is None
    assert extract_code("I cannot write this kernel.") is None
    assert extract_code("<think>only reasoning, then the generation stopped") is None


def test_block_without_modelnew_is_returned_for_feedback() -> None:
    assert extract_code(fence(KERNEL)) == KERNEL

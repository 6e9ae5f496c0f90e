"""Turn raw failures into the short, specific feedback a model can act on in its next turn."""

from __future__ import annotations

import re

from kbrl.kernels.result import Category, EvalResult

MAX_ERROR_CHARS = 2_000

GUIDANCE: dict[Category, str] = {
    Category.FORMAT_ERROR: (
        "Return one complete Python code block that defines `class ModelNew(nn.Module)` with a `forward` "
        "method and the same constructor arguments as `Model`."
    ),
    Category.CHEAT: (
        "The kernel must do the problem's computation itself: launch your own CUDA/Triton kernel in "
        "`forward`, do not call the reference `Model` or the PyTorch ops it uses, do not cache outputs, "
        "mutate inputs, fall back to PyTorch in try/except, or patch timing functions."
    ),
    Category.COMPILATION_ERROR: (
        "Fix the compiler errors above. Check types, kernel signatures, the `functions=[...]` list of "
        "`load_inline`, and that every declared C++ function has a definition."
    ),
    Category.RUNTIME_ERROR: (
        "The kernel compiled but failed while running. Check indexing and bounds (illegal memory access), "
        "grid/block sizes, tensor devices and dtypes, and that inputs are contiguous."
    ),
    Category.TIMEOUT: (
        "The evaluation exceeded its time limit. Look for infinite loops, a grid that is far too large, "
        "or a kernel that never terminates."
    ),
    Category.CORRECTNESS_ERROR: (
        "The output does not match the reference. Check the math, boundary masks for sizes that are not "
        "a multiple of the block size, accumulation precision, and the output shape."
    ),
    Category.UNVERIFIED: (
        "The kernel compiled; correctness and speed could not be checked on this host (no GPU)."
    ),
    Category.CORRECT: (
        "The kernel is correct. Make it faster: fuse operations, improve memory coalescing, use shared "
        "memory or tensor cores, and tune block sizes."
    ),
}

_NOISE = (
    re.compile(r'^\s*File ".*(kbrl/kernels/runner|importlib|site-packages|/lib/python3\.\d+/|<frozen).*'),
    re.compile(r"^\s*\^+\s*$"),
    re.compile(r"^Traceback \(most recent call last\):"),
    re.compile(r"^\s*(The above exception|During handling)"),
    re.compile(r"^\s*$"),
)
_COMPILER_LINE = re.compile(r"(error|Error|ERROR|undefined|warning: .*deprecated)")
_PATH = re.compile(r"(/[\w.\-+]+)+/(?=[\w.\-]+\.(cu|cpp|h|py|cuh)\b)")


def clean_error(text: str, compiler: bool = False) -> str:
    """Keep the lines that explain the failure; drop traceback frames of the harness and long paths."""
    if not text:
        return ""
    lines = text.splitlines()
    if compiler:
        kept = [_PATH.sub("", ln) for ln in lines if _COMPILER_LINE.search(ln)]
        kept = [ln for ln in kept if "ninja: build stopped" not in ln] or lines[-20:]
    else:
        kept = []
        skip_next = False
        for ln in lines:
            if skip_next:
                skip_next = False
                if not ln.lstrip().startswith("File "):  # faulthandler prints frames without source lines
                    continue
            if _NOISE[0].match(ln):
                skip_next = True  # the source line printed under a harness frame
                continue
            if any(p.match(ln) for p in _NOISE[1:]):
                continue
            kept.append(_PATH.sub("", ln))
    seen: set[str] = set()
    unique = [ln for ln in kept if not (ln in seen or seen.add(ln))]
    out = "\n".join(unique).strip()
    if len(out) > MAX_ERROR_CHARS:
        out = out[: MAX_ERROR_CHARS // 2] + "\n…\n" + out[-MAX_ERROR_CHARS // 2 :]
    return out


_OOM = re.compile(r"out of memory|can't allocate memory|cannot allocate memory|MemoryError", re.I)


def is_out_of_memory(message: str) -> bool:
    """Host (MemoryError, allocator failure) or device (CUDA OOM) memory exhaustion."""
    return bool(_OOM.search(message))


def render_feedback(result: EvalResult) -> str:
    """The multi-turn feedback block: status, compiled, tests passed, details, instructions."""
    lines = [
        f"Status: {result.category}",
        f"Compiled: {'yes' if result.compiled else 'no'}",
        f"Tests passed: {result.n_correct}/{result.n_trials}",
    ]
    if result.correct and result.runtime is not None:
        lines.append(f"Runtime: {result.runtime.median_ms:.4f} ms")
        if result.speedup_eager is not None:
            ci = result.speedup_eager_ci
            interval = f" (95% interval {ci[0]:.3f}-{ci[1]:.3f})" if ci else ""
            lines.append(f"Speedup vs PyTorch eager: {result.speedup_eager:.2f}x{interval}")
        if result.speedup_compile is not None:
            lines.append(f"Speedup vs torch.compile: {result.speedup_compile:.2f}x")
    elif result.correct and not result.timing_available:
        lines.append(f"Runtime: not measured ({result.timing_note or 'no GPU'})")
    details = result.error
    flagged = [f for f in result.cheat_flags if f.severity == "error"]
    if flagged:
        details = "\n".join(f"- {f.name}: {f.reason}" for f in flagged) + ("\n" + details if details else "")
    if details:
        lines += ["Error details:", details]
    warnings = [f for f in result.cheat_flags if f.severity == "warning"]
    if warnings:
        lines += ["Notes:"] + [f"- {f.name}: {f.reason}" for f in warnings]
    lines.append(f"Instructions: {GUIDANCE[result.category]}")
    return "\n".join(lines)

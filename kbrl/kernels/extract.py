"""Pull the candidate's Python source out of an LLM completion.

Completions come in many shapes: one fenced block, several (a CUDA block, then the Python that loads
it; or the code split into pieces), no fences at all, a fence cut off by the token limit, reasoning
inside <think>…</think>. The static checks and the sandbox both want one Python module, so this picks
the most plausible one and returns None only when nothing looks like a candidate.
"""

from __future__ import annotations

import ast
import builtins
import re
import threading

__all__ = ["extract_code", "parse_python", "strip_reasoning"]

_PARSE_LOCK = threading.Lock()


def parse_python(code: str) -> ast.Module:
    """`ast.parse`, one call at a time in this process.

    CPython 3.11 keeps the AST constructor's recursion counter in shared state: two threads parsing at
    once (the evaluator's `evaluate_many` and `LocalQueue` evaluate candidates on threads) can fail with
    "SystemError: AST constructor recursion depth mismatch" (seen in CI). Parsing a candidate takes
    milliseconds, so serializing it costs nothing measurable.
    """
    with _PARSE_LOCK:
        return ast.parse(code)

# Languages whose fenced blocks may hold the candidate; "" is a fence with no language.
_PYTHON_LANGS = frozenset({"", "python", "py", "python3", "py3", "ipython", "python-repl", "pycon"})
_FENCE_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*?)[ \t]*$")
_THINK_BLOCK = re.compile(r"<(think|thinking|reasoning)>.*?</\1>", re.IGNORECASE | re.DOTALL)
_THINK_CLOSE = re.compile(r"</(think|thinking|reasoning)>", re.IGNORECASE)
_THINK_OPEN = re.compile(r"<(think|thinking|reasoning)>", re.IGNORECASE)
_MODELNEW_RE = re.compile(r"^[ \t]*class[ \t]+ModelNew\b", re.MULTILINE)
_CODE_START = re.compile(r"^(import |from |class |def |@|#!|\"\"\"|''')", re.MULTILINE)


def strip_reasoning(text: str) -> str:
    """Drop <think>…</think> reasoning, which often holds draft code that is not the answer.

    A closing tag with no opening one (the opening tag was part of the prompt) drops everything up to
    it; an opening tag with no closing one (generation cut off while thinking) drops everything after.
    """
    text = _THINK_BLOCK.sub("", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end() :]
    opened = _THINK_OPEN.search(text)
    if opened:
        text = text[: opened.start()]
    return text


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block in order; an unterminated last block runs to the end."""
    blocks: list[tuple[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), m.group("indent")
        info = m.group("info").strip()
        lang = info.split()[0].lower().strip("{}.") if info else ""
        closing = re.compile(r"^[ \t]*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[ \t]*$")
        body: list[str] = []
        i += 1
        while i < len(lines) and not closing.match(lines[i]):
            line = lines[i]
            body.append(line[len(indent) :] if indent and line.startswith(indent) else line)
            i += 1
        i += 1  # skip the closing fence (or step past the end)
        blocks.append((lang, "\n".join(body).strip("\n") + "\n"))
    return blocks


def _parses(code: str) -> ast.Module | None:
    try:
        return parse_python(code)
    except (SyntaxError, ValueError):
        return None


def _defines_modelnew(code: str, tree: ast.Module | None) -> bool:
    if tree is None:
        return bool(_MODELNEW_RE.search(code))
    return any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in ast.walk(tree))


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set(dir(builtins)) | {"__file__", "__name__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            names.update(node.names)
    return names


def _free_names(tree: ast.Module) -> set[str]:
    """Names a block reads but never binds: a sign that it continues an earlier block."""
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loads - _defined_names(tree)


def _join(blocks: list[str]) -> str:
    return "\n\n".join(b.rstrip("\n") for b in blocks) + "\n"


def _with_helpers(
    chosen: str,
    tree: ast.Module,
    earlier: list[tuple[str, ast.Module | None]],
    later: list[tuple[str, ast.Module | None]],
) -> str:
    """Add the other blocks that bind names the chosen block uses but does not define (kernel split out).

    Earlier blocks go in front, later ones after: a kernel shown after the model is still defined before
    `forward` first runs.
    """
    needed = _free_names(tree)
    if not needed:
        return chosen

    def helpers(blocks: list[tuple[str, ast.Module | None]]) -> list[str]:
        return [
            body
            for body, btree in blocks
            if btree is not None and not _defines_modelnew(body, btree) and _defined_names(btree) & needed
        ]

    before, after = helpers(earlier), helpers(later)
    if not before and not after:
        return chosen
    joined = _join([*before, chosen, *after])
    return joined if _parses(joined) is not None else chosen


def _trim_trailing_prose(text: str) -> str | None:
    """Bare code followed by explanation: the longest prefix (by whole lines) that parses and defines ModelNew."""
    lines = text.splitlines()
    for end in range(len(lines) - 1, max(0, len(lines) - 200), -1):
        if not lines[end - 1].strip() or lines[end].startswith((" ", "\t")):
            continue
        cand = "\n".join(lines[:end])
        tree = _parses(cand)
        if tree is not None and _defines_modelnew(cand, tree):
            return cand.strip("\n") + "\n"
    return None


def _bare_code(text: str) -> str | None:
    """The whole text (or the text from its first code-like line) if it is Python defining ModelNew."""
    candidates = [text]
    start = _CODE_START.search(text)
    if start and start.start() > 0:
        candidates.append(text[start.start() :])
    for cand in candidates:
        tree = _parses(cand)
        if tree is not None and _defines_modelnew(cand, tree):
            return cand.strip("\n") + "\n"
    if start and _MODELNEW_RE.search(text):
        return _trim_trailing_prose(text[start.start() :])
    return None


def _from_blocks(blocks: list[str]) -> str | None:
    """The candidate among fenced blocks: the last one defining ModelNew, repaired by joining split blocks."""
    parsed = [(b, _parses(b)) for b in blocks]
    defining = [i for i, (b, tree) in enumerate(parsed) if _defines_modelnew(b, tree)]
    if not defining:
        joined = _join(blocks)
        tree = _parses(joined)
        return joined if len(blocks) > 1 and tree is not None and _defines_modelnew(joined, tree) else None
    idx = defining[-1]
    body, tree = parsed[idx]
    # Blocks after it that do not parse on their own are the rest of it (the answer was split mid-class).
    end = idx + 1
    while end < len(parsed) and parsed[end][1] is None:
        end += 1
    if end > idx + 1 and (joined_tree := _parses(joined := _join(blocks[idx:end]))) is not None:
        body, tree = joined, joined_tree
    if tree is not None:
        return _with_helpers(body, tree, parsed[:idx], parsed[end:])
    # It does not parse: maybe it continues an earlier block that was cut off.
    for start in range(idx - 1, -1, -1):
        joined = _join(blocks[start : idx + 1])
        if _parses(joined) is not None:
            return joined
    return body


def extract_code(completion: str) -> str | None:
    """The candidate module in `completion`, or None when it holds no plausible candidate.

    Preference: the last fenced Python block defining `class ModelNew` (the final answer comes last),
    joined with the neighbouring blocks it was split from and with the blocks that define names it uses
    (a kernel in its own block); if it does not parse even so, it is returned as is so the syntax error
    reaches the feedback. Then all Python blocks joined when only together they define ModelNew, then a
    block in another language that is really Python defining ModelNew, then the bare text, then the last
    Python block (so the feedback can say ModelNew is missing).
    """
    if not completion or not completion.strip():
        return None
    text = strip_reasoning(completion)
    fenced = _fenced_blocks(text)
    blocks = [body for lang, body in fenced if lang in _PYTHON_LANGS and body.strip()]
    if blocks and (found := _from_blocks(blocks)) is not None:
        return found
    for lang, body in reversed(fenced):  # ```cuda around what is really the Python module
        if (
            lang not in _PYTHON_LANGS
            and (tree := _parses(body)) is not None
            and _defines_modelnew(body, tree)
        ):
            return body
    bare = _bare_code(text)
    if bare is not None:
        return bare
    if blocks:
        return blocks[-1]
    return None

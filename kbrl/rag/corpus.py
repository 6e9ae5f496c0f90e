"""RA-ICL corpora read through `datasets` into one `Example` record, de-duplicated and filtered.

Two public corpora: KernelBook (`GPUMODE/KernelBook`: PyTorch modules from GitHub paired with the Triton code
TorchInductor generated for them; columns `uuid, module_name, entry_point, python_code, triton_code,
original_triton_code, licenses, synthetic, repo_link, …`) and the AI CUDA Engineer archive
(`SakanaAI/AI-CUDA-Engineer-Archive`: CUDA kernels written by an agent for KernelBench's own tasks, splits
`level_1..3`, columns `Op_Name, Level_ID, Task_ID, Kernel_Name, PyTorch_Code_Module, CUDA_Code, Correct,
CUDA_Speedup_Native, CUDA_Speedup_Compile, Max_Diff, Error, …`). Each source is a Hugging Face id or a
local directory / parquet file(s) with the same columns, so offline machines and tests use the same code.

The Sakana archive was made from KernelBench's tasks, so its rows keep their `Level_ID`/`Task_ID`: the
retriever's leakage guard (kbrl/rag/retrieve.py) needs them to never show a policy the solution of the very
problem it is asked to solve.
"""

from __future__ import annotations

import ast
import hashlib
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from kbrl.kernels.extract import parse_python

KERNELBOOK_ID = "GPUMODE/KernelBook"
SAKANA_ID = "SakanaAI/AI-CUDA-Engineer-Archive"
SAKANA_LICENSE = "CC-BY-4.0"
"""The archive's licence (its dataset card); KernelBook gives one per row (`licenses`)."""

KERNELBOOK_COLUMNS = ("uuid", "module_name", "entry_point", "python_code", "triton_code", "licenses",
                      "repo_link", "synthetic")  # fmt: skip
"""The KernelBook columns read (others, e.g. `original_triton_code`, are left on disk)."""
SAKANA_COLUMNS = ("Op_Name", "Level_ID", "Task_ID", "Kernel_Name", "PyTorch_Code_Module", "CUDA_Code", "Correct",
                  "CUDA_Speedup_Native", "CUDA_Speedup_Compile", "Max_Diff")  # fmt: skip
"""The Sakana columns read; the large profiling columns (NCU_Profile, Torch_Profile, Clang_Tidy) are not."""

Backend = Literal["triton", "cuda"]


class CorpusError(ValueError):
    """A corpus that cannot be read or used (missing columns, no files, empty after filters)."""


@dataclass(frozen=True)
class Example:
    """One PyTorch program with a kernel that implements it: the unit retrieved into a prompt."""

    id: str
    """Stable and readable: `kernelbook/<uuid>` or `sakana/L<level>/<task>/<row>`."""
    corpus: Literal["kernelbook", "sakana"]
    backend: Backend
    name: str
    pytorch_code: str
    kernel_code: str
    code_hash: str
    """`code_hash(pytorch_code)`: the de-duplication key and one of the leakage guard's tests."""
    correct: bool | None = None
    """Sakana's `Correct`; None for KernelBook (compiler output, not measured by the dataset)."""
    speedup: float | None = None
    """Sakana's `CUDA_Speedup_Native` (vs eager PyTorch)."""
    speedup_compile: float | None = None
    level: int | None = None
    """KernelBench level and task number the example was made for (Sakana only)."""
    task: int | None = None
    license: str | None = None
    origin: dict[str, str] = field(default_factory=dict)
    """Where it came from: KernelBook `uuid`, `repo_link`; Sakana `Kernel_Name`, `Op_Name`, split row."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Example:
        return cls(**data)


@dataclass(frozen=True)
class CorpusFilter:
    """What goes into an index. Incorrect Sakana kernels are left out unless `include_incorrect`."""

    triton_only: bool = False
    cuda_only: bool = False
    sakana_levels: tuple[int, ...] = (1, 2, 3)
    include_incorrect: bool = False

    def __post_init__(self) -> None:
        if self.triton_only and self.cuda_only:
            raise CorpusError("--triton-only and --cuda-only exclude each other (every example would go)")
        bad = [lv for lv in self.sakana_levels if lv not in (1, 2, 3)]
        if bad or not self.sakana_levels:
            raise CorpusError(f"--sakana-levels takes levels among 1,2,3, got {list(self.sakana_levels)}")

    def keeps(self, example: Example) -> bool:
        if self.triton_only and example.backend != "triton":
            return False
        if self.cuda_only and example.backend != "cuda":
            return False
        if example.corpus == "sakana" and example.level not in self.sakana_levels:
            return False
        return self.include_incorrect or example.correct is not False


@dataclass
class CorpusStats:
    """Counts at each stage of `load_corpus`, recorded in the index metadata."""

    read: dict[str, int] = field(default_factory=dict)
    filtered_out: int = 0
    duplicates: int = 0
    kept: dict[str, int] = field(default_factory=dict)
    versions: dict[str, dict[str, Any]] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ normalised hashing


def normalise_code(code: str) -> str:
    """Python re-printed from its syntax tree without docstrings: comments, blank lines, quoting and
    formatting no longer matter. Text that is not Python (or not parseable) keeps only its tokens."""
    try:
        tree = parse_python(code)
    except (SyntaxError, ValueError, RecursionError):
        return " ".join(re.sub(r"#[^\n]*", "", code).split())
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):  # fmt: skip
                node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def code_hash(code: str) -> str:
    """sha256 (16 hex digits) of `normalise_code(code)`."""
    return hashlib.sha256(normalise_code(code).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------ reading


def _parquet_files(path: Path) -> list[Path]:
    files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
    if not files:
        raise CorpusError(f"{path}: no parquet files (expected a Hugging Face id, a directory or .parquet file)")
    return files


def _is_local(source: str) -> bool:
    return Path(source).expanduser().exists() or source.endswith(".parquet") or source.startswith((".", "/", "~"))


def _open(source: str, split: str, local_files: list[Path] | None) -> Any:
    """A `datasets.Dataset`: the Hub's `split` of `source`, or the given local parquet files."""
    try:
        from datasets import load_dataset
    except ImportError as exc:  # pragma: no cover - the `rag` extra is missing
        raise CorpusError("reading corpora needs `datasets`: pip install 'kbrl[rag]'") from exc
    try:
        if local_files is not None:
            return load_dataset("parquet", data_files={split: [str(f) for f in local_files]}, split=split)
        return load_dataset(source, split=split)
    except Exception as exc:  # noqa: BLE001 - datasets raises many types (hub, network, arrow): name the source
        where = "local parquet files" if local_files is not None else "a Hugging Face dataset id (no such local path)"
        raise CorpusError(f"cannot read {source!r} split {split!r} as {where}: {type(exc).__name__}: {exc}") from exc


def _columns(ds: Any, wanted: Sequence[str], required: Sequence[str], source: str) -> Any:
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise CorpusError(f"{source}: missing column(s) {missing}; has {ds.column_names}")
    return ds.select_columns([c for c in wanted if c in ds.column_names])


def _version(ds: Any, source: str) -> dict[str, Any]:
    """What identifies the data read: the source, its `datasets` fingerprint (a content hash for local
    files, the revision's for the Hub) and the row count."""
    return {"source": source, "fingerprint": getattr(ds, "_fingerprint", None), "rows": len(ds)}


def _float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def read_kernelbook(source: str = KERNELBOOK_ID, stats: CorpusStats | None = None) -> Iterator[Example]:
    """KernelBook rows as Triton examples (rows without code on either side are skipped)."""
    path = Path(source).expanduser()
    ds = _open(source, "train", _parquet_files(path) if _is_local(source) else None)
    ds = _columns(ds, KERNELBOOK_COLUMNS, ("python_code", "triton_code"), source)
    if stats is not None:
        stats.versions["kernelbook"] = _version(ds, source)
    for i, row in enumerate(ds):
        python, triton = row.get("python_code") or "", row.get("triton_code") or ""
        if not python.strip() or not triton.strip():
            continue
        uuid = str(row.get("uuid") if row.get("uuid") is not None else i)
        licenses = row.get("licenses") or []
        origin = {"uuid": uuid, "repo_link": str(row.get("repo_link") or "")}
        yield Example(id=f"kernelbook/{uuid}", corpus="kernelbook", backend="triton",
                      name=str(row.get("module_name") or row.get("entry_point") or uuid), pytorch_code=python,
                      kernel_code=triton, code_hash=code_hash(python),
                      license=", ".join(licenses) if isinstance(licenses, list) else str(licenses) or None,
                      origin={k: v for k, v in origin.items() if v})  # fmt: skip


def _sakana_files(path: Path, level: int) -> list[Path]:
    """`level_1.parquet`, `level_1-00000-of-00002.parquet` or `level_1/*.parquet` under `path`."""
    files = [f for f in _parquet_files(path)
             if f.name.startswith(f"level_{level}") or f.parent.name == f"level_{level}"]  # fmt: skip
    if path.is_file():
        return files or [path]
    return files


def read_sakana(source: str = SAKANA_ID, levels: Iterable[int] = (1, 2, 3),
                stats: CorpusStats | None = None) -> Iterator[Example]:  # fmt: skip
    """AI CUDA Engineer archive rows of `levels` as CUDA examples, keeping their KernelBench level/task."""
    local = _is_local(source)
    path = Path(source).expanduser()
    for level in levels:
        split = f"level_{level}"
        files = _sakana_files(path, level) if local else None
        if files == []:
            continue  # a local copy without this level
        ds = _columns(_open(source, split, files), SAKANA_COLUMNS,
                      ("Level_ID", "Task_ID", "PyTorch_Code_Module", "CUDA_Code", "Correct"), source)  # fmt: skip
        if stats is not None:
            stats.versions[f"sakana/{split}"] = _version(ds, source)
        for i, row in enumerate(ds):
            python, cuda = row.get("PyTorch_Code_Module") or "", row.get("CUDA_Code") or ""
            if not python.strip() or not cuda.strip():
                continue
            lv, task = int(row["Level_ID"]), int(row["Task_ID"])
            origin = {"Kernel_Name": str(row.get("Kernel_Name") or ""), "Op_Name": str(row.get("Op_Name") or ""),
                      "row": f"{split}/{i}"}  # fmt: skip
            yield Example(id=f"sakana/L{lv}/{task}/{i}", corpus="sakana", backend="cuda",
                          name=str(row.get("Op_Name") or row.get("Kernel_Name") or f"L{lv}/{task}"),
                          pytorch_code=python, kernel_code=cuda, code_hash=code_hash(python),
                          correct=bool(row["Correct"]) if row.get("Correct") is not None else None,
                          speedup=_float(row.get("CUDA_Speedup_Native")),
                          speedup_compile=_float(row.get("CUDA_Speedup_Compile")), level=lv, task=task,
                          license=SAKANA_LICENSE, origin={k: v for k, v in origin.items() if v})  # fmt: skip


def _rank(example: Example) -> tuple[int, float]:
    """Which of two examples with the same PyTorch code to keep: a correct one, then the faster."""
    return (1 if example.correct is not False else 0, example.speedup if example.speedup is not None else 0.0)


def deduplicate(examples: Iterable[Example]) -> tuple[list[Example], int]:
    """One example per normalised PyTorch code hash (the best by `_rank`; first seen on ties), in first-seen
    order; returns (examples, number removed). Retrieval is keyed by the PyTorch code, so copies would
    only fill the k slots of a prompt with one program."""
    best: dict[str, Example] = {}
    n = 0
    for example in examples:
        n += 1
        kept = best.get(example.code_hash)
        if kept is None or _rank(example) > _rank(kept):
            best[example.code_hash] = example
    return list(best.values()), n - len(best)


def load_corpus(kernelbook: str | None = KERNELBOOK_ID, sakana: str | None = SAKANA_ID,
                filters: CorpusFilter | None = None) -> tuple[list[Example], CorpusStats]:  # fmt: skip
    """Both corpora (a source of None is skipped), filtered, then de-duplicated across both.

    Raises CorpusError when nothing is left, naming the counts, so an over-tight filter is never an empty
    index that silently retrieves nothing.
    """
    filters = filters or CorpusFilter()
    stats = CorpusStats()
    readers: list[tuple[str, Iterable[Example]]] = []
    if kernelbook and not filters.cuda_only:
        readers.append(("kernelbook", read_kernelbook(kernelbook, stats)))
    if sakana and not filters.triton_only:
        readers.append(("sakana", read_sakana(sakana, filters.sakana_levels, stats)))
    kept: list[Example] = []
    for name, rows in readers:
        count = 0
        for example in rows:
            count += 1
            if filters.keeps(example):
                kept.append(example)
            else:
                stats.filtered_out += 1
        stats.read[name] = count
    examples, stats.duplicates = deduplicate(kept)
    for example in examples:
        stats.kept[example.corpus] = stats.kept.get(example.corpus, 0) + 1
    if not examples:
        raise CorpusError(f"the corpus is empty after filters: read {stats.read or 'nothing'}, "
                          f"{stats.filtered_out} filtered out ({filters}), {stats.duplicates} duplicates")  # fmt: skip
    return examples, stats

"""Problem loaders: kbrl's built-in offline set, a KernelBench checkout, and the Hugging Face dataset.

Every loader returns `Problem`s sorted by (level, number). A KernelBench problem gets the same id
("kernelbench/L{level}/{number}") and the same code whether it is read from a checkout or from the
dataset, so results recorded against one source stay comparable with the other.

Import-light on purpose: nothing here imports torch, and `datasets` is imported only by the HF loader.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from kbrl.problems.model import Problem

BUILTIN = "builtin"
KERNELBENCH = "kernelbench"
HF_DEFAULT = "ScalingIntelligence/KernelBench"
KERNELBENCH_ROOT_ENV = "KERNELBENCH_ROOT"
BUILTIN_BACKENDS = ("triton", "cuda")

_FILE_RE = re.compile(r"^(\d+)_(.+)\.py$")
_LEVEL_DIR_RE = re.compile(r"^level(\d+)$")
_SPLIT_RE = re.compile(r"^level_?(\d+)")
_ID_RE = re.compile(r"^(?P<collection>[A-Za-z0-9_.-]+)/L(?P<level>\d+)/(?P<number>\d+)$")
_BUILTIN_PACKAGE = "kbrl.problems.builtin"


class ProblemLoadError(ValueError):
    """A problem source is missing, malformed, or was named in a way no loader understands."""


class ProblemNotFoundError(LookupError):
    """No problem with the requested id exists in the source that was searched."""


def parse_problem_filename(filename: str) -> tuple[int, str]:
    """Split a KernelBench file name `{number}_{name}.py` into (number, name)."""
    match = _FILE_RE.match(filename)
    if match is None:
        raise ProblemLoadError(f"{filename!r} is not a problem file name: expected '{{number}}_{{Name}}.py'")
    return int(match.group(1)), match.group(2)


def _check_level(level: int | None) -> None:
    """Reject levels that cannot name a folder, early and with the value that was given."""
    if level is None:
        return
    if isinstance(level, bool) or not isinstance(level, int) or level < 1:
        raise ProblemLoadError(f"level must be a positive integer or None, got {level!r}")


def _sorted(problems: Iterable[Problem]) -> list[Problem]:
    return sorted(problems, key=lambda p: (p.level, p.number))


def _check_unique(problems: list[Problem], where: str) -> None:
    """Two problems with one id would make results ambiguous; say which files collide."""
    seen: dict[str, Problem] = {}
    for problem in problems:
        other = seen.setdefault(problem.id, problem)
        if other is not problem:
            raise ProblemLoadError(
                f"duplicate problem id {problem.id} in {where}: {other.number}_{other.name} and "
                f"{problem.number}_{problem.name}"
            )


# --------------------------------------------------------------------------------------------------
# built-in offline set


def _builtin_root() -> Any:
    """The package folder holding level{N}/ and solutions/, as an importlib.resources Traversable."""
    return resources.files(_BUILTIN_PACKAGE)


def _builtin_levels() -> list[int]:
    levels = []
    for entry in _builtin_root().iterdir():
        match = _LEVEL_DIR_RE.match(entry.name)
        if match and entry.is_dir():
            levels.append(int(match.group(1)))
    return sorted(levels)


def load_builtin(level: int | None = None) -> list[Problem]:
    """kbrl's small offline problem set (KernelBench format, shapes sized for the Triton interpreter).

    It exists so that tests, demos and CPU-only runs need no KernelBench checkout or network.
    """
    _check_level(level)
    available = _builtin_levels()
    if level is not None and level not in available:
        raise ProblemLoadError(f"the builtin set has no level {level}; its levels are {available}")
    problems = []
    for lvl in available if level is None else [level]:
        for entry in _builtin_root().joinpath(f"level{lvl}").iterdir():
            if not _FILE_RE.match(entry.name):
                continue  # __init__.py and anything else that is not a problem file
            number, name = parse_problem_filename(entry.name)
            problems.append(Problem(BUILTIN, lvl, number, name, entry.read_text(encoding="utf-8")))
    problems = _sorted(problems)
    _check_unique(problems, "the builtin set")
    return problems


def builtin_solutions(problem: Problem) -> dict[str, str]:
    """Known-correct ("honest") candidates for a builtin problem: backend ("triton", "cuda") -> source.

    They are the evaluator's positive controls: each must compile, pass, and not be flagged as a cheat.
    """
    if problem.collection != BUILTIN:
        raise ProblemLoadError(
            f"builtin_solutions only knows the builtin set; {problem.id} is from {problem.collection!r}"
        )
    folder = _builtin_root().joinpath("solutions", f"level{problem.level}")
    solutions = {}
    for backend in BUILTIN_BACKENDS:
        entry = folder.joinpath(f"{problem.number}_{problem.name}_{backend}.py")
        if entry.is_file():
            solutions[backend] = entry.read_text(encoding="utf-8")
    return solutions


# --------------------------------------------------------------------------------------------------
# KernelBench checkout


def _kernelbench_problem_dir(root: Path) -> Path:
    """Accept the repository root or its inner KernelBench/ folder; return the one holding level{N}/."""
    for candidate in (root / "KernelBench", root):
        if candidate.is_dir() and any(
            _LEVEL_DIR_RE.match(p.name) and p.is_dir() for p in candidate.iterdir()
        ):
            return candidate
    raise ProblemLoadError(
        f"no KernelBench problem folders under {root}: expected {root}/KernelBench/level1/ (repository "
        f"root) or {root}/level1/ (the inner KernelBench/ folder)"
    )


def load_kernelbench_dir(root: str | Path | None = None, level: int | None = None) -> list[Problem]:
    """Problems from a KernelBench checkout (`KernelBench/level{L}/{N}_{Name}.py`).

    `root` defaults to the KERNELBENCH_ROOT environment variable, so that configs can say
    "kernelbench" and each host points at its own checkout.
    """
    _check_level(level)
    if root is None:
        root = os.environ.get(KERNELBENCH_ROOT_ENV) or None
        if root is None:
            raise ProblemLoadError(
                f"no KernelBench checkout given: pass root=... or set {KERNELBENCH_ROOT_ENV} to a clone of "
                "https://github.com/ScalingIntelligence/KernelBench (or use source 'hf' or 'builtin')"
            )
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ProblemLoadError(f"KernelBench root {root} does not exist or is not a directory")
    problem_dir = _kernelbench_problem_dir(root)
    levels = sorted(
        int(m.group(1)) for p in problem_dir.iterdir() if (m := _LEVEL_DIR_RE.match(p.name)) and p.is_dir()
    )
    if level is not None and level not in levels:
        raise ProblemLoadError(f"{problem_dir} has no level{level}/ folder; levels found: {levels}")
    problems = []
    for lvl in levels if level is None else [level]:
        for path in (problem_dir / f"level{lvl}").iterdir():
            if not path.is_file() or not _FILE_RE.match(path.name):
                continue
            number, name = parse_problem_filename(path.name)
            problems.append(Problem(KERNELBENCH, lvl, number, name, path.read_text(encoding="utf-8")))
    problems = _sorted(problems)
    _check_unique(problems, str(problem_dir))
    return problems


# --------------------------------------------------------------------------------------------------
# Hugging Face dataset (hub id, save_to_disk directory, or parquet files)


def _import_datasets() -> Any:
    try:
        import datasets
    except ImportError as exc:
        raise ProblemLoadError(
            "loading the Hugging Face dataset needs the `datasets` package: pip install 'kbrl[hf]'"
        ) from exc
    return datasets


def _looks_like_path(name: str) -> bool:
    """Hub ids are 'owner/name'; anything else path-shaped is a local path that must exist."""
    return name.startswith(("/", "./", "../", "~", ".")) or name.endswith(".parquet") or name.count("/") > 1


def _is_saved_dataset(path: Path) -> bool:
    return (
        path.is_dir()
        and any(
            (path / marker).is_file() for marker in ("dataset_dict.json", "state.json", "dataset_info.json")
        )
        and not any(path.rglob("*.parquet"))
    )


def _parquet_splits(path: Path) -> dict[str, list[str]]:
    """Group parquet files into splits by file name (`level_1-00000-of-00001.parquet` -> "level_1").

    That is the hub's own layout for this dataset; files not named after a level go to "train" and
    must then carry a `level` column.
    """
    files = [path] if path.is_file() else sorted(path.rglob("*.parquet"))
    if not files:
        raise ProblemLoadError(f"no .parquet files under {path}")
    splits: dict[str, list[str]] = {}
    for file in files:
        match = _SPLIT_RE.match(file.name)
        split = f"level_{match.group(1)}" if match else "train"
        splits.setdefault(split, []).append(str(file))
    return splits


def _split_level(split: str) -> int | None:
    match = _SPLIT_RE.match(split)
    return int(match.group(1)) if match else None


def _problem_from_row(row: dict[str, Any], split: str, where: str) -> Problem:
    """Map one dataset row (columns code, level, name, problem_id) to a kernelbench Problem."""
    missing = [col for col in ("code", "problem_id") if row.get(col) is None]
    if missing:
        raise ProblemLoadError(
            f"{where} split {split!r}: rows need columns code and problem_id (also name, level); "
            f"missing {missing}, columns present: {sorted(row)}"
        )
    number = int(row["problem_id"])
    level = row.get("level")
    level = int(level) if level is not None else _split_level(split)
    if level is None:
        raise ProblemLoadError(
            f"{where} split {split!r}: no `level` column and the split is not named level_N"
        )
    raw_name = str(row.get("name") or f"{number}_problem_{number}")
    raw_name = raw_name.removesuffix(".py")
    prefix = f"{number}_"
    name = raw_name[len(prefix) :] if raw_name.startswith(prefix) else raw_name
    return Problem(KERNELBENCH, level, number, name, str(row["code"]))


def load_hf_dataset(
    name_or_path: str | Path = HF_DEFAULT, level: int | None = None, cache_dir: str | Path | None = None
) -> list[Problem]:
    """KernelBench problems through `datasets`: a hub id, a `save_to_disk` folder, or parquet file(s).

    The upstream dataset has one split per level (level_1 ... level_4) with columns code, level, name
    (the file stem, e.g. "1_Square_matrix_multiplication_") and problem_id; ids match the checkout's.
    """
    _check_level(level)
    datasets = _import_datasets()
    text = str(name_or_path)
    path = Path(text).expanduser()
    cache = str(cache_dir) if cache_dir is not None else None
    if path.exists():
        if _is_saved_dataset(path):
            loaded = datasets.load_from_disk(str(path))
        else:
            loaded = datasets.load_dataset("parquet", data_files=_parquet_splits(path), cache_dir=cache)
    elif isinstance(name_or_path, Path) or _looks_like_path(text):
        raise ProblemLoadError(f"dataset path {path} does not exist")
    else:
        try:
            loaded = datasets.load_dataset(text, cache_dir=cache)
        except (OSError, ConnectionError) as exc:
            raise ProblemLoadError(
                f"could not load Hugging Face dataset {text!r} ({type(exc).__name__}: {exc}); offline, use a "
                f"local copy (save_to_disk folder or parquet files), a KernelBench checkout via "
                f"{KERNELBENCH_ROOT_ENV}, or source 'builtin'"
            ) from exc
    splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    problems = []
    for split, table in splits.items():
        split_level = _split_level(split)
        if level is not None and split_level is not None and split_level != level:
            continue  # skip whole splits that cannot hold the level asked for
        for row in table:
            problem = _problem_from_row(row, split, text)
            if level is None or problem.level == level:
                problems.append(problem)
    if level is not None and not problems:
        found = sorted({lvl for s in splits if (lvl := _split_level(s)) is not None})
        raise ProblemLoadError(
            f"{text} has no level {level} problems (splits: {sorted(splits)}, levels {found})"
        )
    problems = _sorted(problems)
    _check_unique(problems, text)
    return problems


# --------------------------------------------------------------------------------------------------
# dispatch


SOURCE_FORMS = (
    "'builtin'",
    f"'kernelbench' (checkout at ${KERNELBENCH_ROOT_ENV})",
    "'kernelbench:<dir>'",
    f"'hf' ({HF_DEFAULT})",
    "'hf:<hub id, save_to_disk dir or parquet path>'",
    "a directory path (KernelBench checkout, save_to_disk folder or parquet folder)",
    "a .parquet file",
)


def load_problems(source: str = BUILTIN, level: int | None = None) -> list[Problem]:
    """Load problems from a source named in one string, as configs and the command line give it."""
    src = str(source).strip()
    if src == BUILTIN:
        return load_builtin(level)
    if src == KERNELBENCH:
        return load_kernelbench_dir(None, level)
    if src.startswith(f"{KERNELBENCH}:"):
        return load_kernelbench_dir(src.split(":", 1)[1], level)
    if src == "hf":
        return load_hf_dataset(HF_DEFAULT, level)
    if src.startswith("hf:"):
        return load_hf_dataset(src.split(":", 1)[1], level)
    path = Path(src).expanduser()
    if path.is_file() and path.suffix == ".parquet":
        return load_hf_dataset(path, level)
    if path.is_dir():
        if _is_saved_dataset(path):
            return load_hf_dataset(path, level)
        if (path / "KernelBench").is_dir() or any(_LEVEL_DIR_RE.match(p.name) for p in path.iterdir()):
            return load_kernelbench_dir(path, level)
        if any(path.rglob("*.parquet")):
            return load_hf_dataset(path, level)
        raise ProblemLoadError(
            f"{path} is neither a KernelBench checkout (KernelBench/level1/...), a save_to_disk dataset "
            "nor a folder of parquet files"
        )
    raise ProblemLoadError(f"unknown problem source {source!r}; use one of: " + ", ".join(SOURCE_FORMS))


def _source_for_id(problem_id: str) -> str:
    match = _ID_RE.match(problem_id)
    if match is None:
        return BUILTIN
    return KERNELBENCH if match.group("collection") == KERNELBENCH else BUILTIN


def get_problem(problem_id: str, source: str | None = None) -> Problem:
    """One problem by id ("builtin/L1/3", "kernelbench/L2/17").

    `source` defaults to the one the id's collection names ("kernelbench" reads $KERNELBENCH_ROOT).
    """
    if _ID_RE.match(problem_id) is None:
        raise ProblemNotFoundError(
            f"{problem_id!r} is not a problem id: expected '<collection>/L<level>/<number>', e.g. 'builtin/L1/1'"
        )
    problems = load_problems(source if source is not None else _source_for_id(problem_id))
    for problem in problems:
        if problem.id == problem_id:
            return problem
    labels = {f"{p.id} ({p.name})": p.id for p in problems}
    close = difflib.get_close_matches(problem_id, [p.id for p in problems], n=5, cutoff=0.5)
    hint = ", ".join(label for label, pid in labels.items() if pid in close)
    message = f"no problem {problem_id!r} in source {source or _source_for_id(problem_id)!r}"
    message += f"; close ids: {hint}" if hint else f" ({len(problems)} problems loaded)"
    raise ProblemNotFoundError(message)

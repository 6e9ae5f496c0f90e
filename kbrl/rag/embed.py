"""Embeddings of code through `sentence-transformers`: batched, with a progress bar, L2-normalised (so the
index's inner product is the cosine similarity).

`model` is a Hugging Face id (default `BAAI/bge-code-v1`; e.g. `nomic-ai/nomic-embed-code`) or a local
directory in sentence-transformers' format. The model's identity is checked by behaviour, not by name: an
index records the embedding of a fixed probe text, and `Embedder.matches` compares it, so the same weights
under another path load, and other weights never do (kbrl/rag/index.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

DEFAULT_MODEL = "BAAI/bge-code-v1"
DEFAULT_MAX_SEQ_LENGTH = 1024
"""Tokens of code embedded per example: the head of a module says what it computes; longer inputs cost a
quadratic attention for little retrieval signal. A model with a shorter limit keeps its own."""
PROBE = "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x) @ x.T\n"
"""The fixed text whose embedding identifies a model (see module docstring)."""
PROBE_TOLERANCE = 1e-3
"""Largest difference per component between two embeddings of `PROBE` from the same model (numerics of
another CPU/GPU or batch size stay far below; another model is far above)."""


class EmbedError(ValueError):
    """The embedding model cannot be loaded or used."""


class Embedder:
    """A sentence-transformers model that turns texts into normalised float32 vectors."""

    def __init__(self, model: str = DEFAULT_MODEL, *, device: str | None = None, batch_size: int = 32,
                 max_seq_length: int | None = DEFAULT_MAX_SEQ_LENGTH) -> None:  # fmt: skip
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:  # pragma: no cover - the `rag` extra is missing
            raise EmbedError("embedding needs sentence-transformers: pip install 'kbrl[rag]'") from exc
        try:
            self.model: Any = SentenceTransformer(model, device=device or "cpu")
        except (OSError, ValueError) as exc:
            raise EmbedError(f"cannot load embedding model {model!r} (a Hugging Face id or a local "
                             f"sentence-transformers directory): {exc}") from exc  # fmt: skip
        own = self.model.max_seq_length
        if max_seq_length is not None and (own is None or max_seq_length < own):
            self.model.max_seq_length = max_seq_length
        self.model_id = model
        self.batch_size = batch_size
        dimension = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(dimension() or len(self.embed([PROBE])[0]))

    def embed(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """(len(texts), dim) float32, each row of unit length."""
        vectors = self.model.encode(list(texts), batch_size=self.batch_size, show_progress_bar=progress,
                                    convert_to_numpy=True, normalize_embeddings=True)  # fmt: skip
        return np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(texts), -1)

    def probe(self) -> list[float]:
        """This model's embedding of `PROBE`."""
        return [float(x) for x in self.embed([PROBE])[0]]

    def matches(self, probe: Sequence[float]) -> bool:
        """Whether this model embeds `PROBE` as `probe` (recorded by the model an index was built with)."""
        mine = self.probe()
        return len(mine) == len(probe) and float(np.max(np.abs(np.asarray(mine) - np.asarray(probe)))) < PROBE_TOLERANCE

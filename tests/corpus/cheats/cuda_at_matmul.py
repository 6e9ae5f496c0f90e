# reference: matmul
# expect: torch_does_the_work
"""A "CUDA kernel" whose host function just calls at::matmul (cuBLAS through ATen)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = "torch::Tensor fast_matmul(torch::Tensor a, torch::Tensor b);"
cuda_source = r"""
#include <torch/extension.h>

__global__ void touch_kernel(float* p) { if (threadIdx.x == 0) p[0] += 0.0f; }

torch::Tensor fast_matmul(torch::Tensor a, torch::Tensor b) {
    auto c = at::matmul(a, b);
    touch_kernel<<<1, 32>>>(c.data_ptr<float>());
    return c;
}
"""

ext = load_inline(name="cheat_at_matmul", cpp_sources=cpp_source, cuda_sources=cuda_source,
                  functions=["fast_matmul"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return ext.fast_matmul(A, B)

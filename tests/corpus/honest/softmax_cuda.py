# reference: softmax
"""Honest: CUDA row softmax via load_inline; reads a non-secret env var and uses ATen only to allocate."""
import os

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

if "TORCH_CUDA_ARCH_LIST" not in os.environ:
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"

softmax_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ out, int n_cols) {
    const float* row = x + (long)blockIdx.x * n_cols;
    float* dst = out + (long)blockIdx.x * n_cols;
    __shared__ float red[256];
    float m = -INFINITY;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) m = fmaxf(m, row[c]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();
    float sum = 0.0f;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) sum += expf(row[c] - m);
    red[threadIdx.x] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
        __syncthreads();
    }
    float inv = 1.0f / red[0];
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) dst[c] = expf(row[c] - m) * inv;
}

torch::Tensor softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2, "expected a 2-D CUDA tensor");
    auto xc = x.contiguous();
    auto out = torch::empty_like(xc);
    softmax_kernel<<<xc.size(0), 256, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), (int)xc.size(1));
    return out;
}
"""

ext = load_inline(
    name="kbrl_honest_softmax",
    cpp_sources="torch::Tensor softmax_rows(torch::Tensor x);",
    cuda_sources=softmax_source,
    functions=["softmax_rows"],
    verbose=os.environ.get("KBRL_VERBOSE_BUILD") == "1",
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.softmax_rows(x)

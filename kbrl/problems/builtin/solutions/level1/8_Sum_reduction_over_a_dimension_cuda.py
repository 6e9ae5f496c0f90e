import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

sum_dim_cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

// x viewed as (outer, R, inner); one thread per (outer, inner) output sums over R.
// Neighbouring threads read neighbouring inner elements, so every step of the loop is coalesced.
__global__ void sum_dim_kernel(const float* __restrict__ x, float* __restrict__ out,
                               long outer, long R, long inner) {
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= outer * inner) return;
    long o = idx / inner;
    long i = idx % inner;
    const float* p = x + o * R * inner + i;
    float acc = 0.0f;
    for (long r = 0; r < R; ++r) acc += p[r * inner];
    out[idx] = acc;
}

torch::Tensor sum_dim_cuda(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
    auto xc = x.contiguous();
    int64_t nd = xc.dim();
    if (dim < 0) dim += nd;
    TORCH_CHECK(dim >= 0 && dim < nd, "dim out of range");
    long outer = 1, inner = 1;
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < nd; ++d) inner *= xc.size(d);
    long R = xc.size(dim);
    std::vector<int64_t> out_shape(xc.sizes().begin(), xc.sizes().end());
    out_shape[dim] = 1;
    auto out = torch::empty(out_shape, xc.options());
    long total = outer * inner;
    const int threads = 256;
    const long blocks = (total + threads - 1) / threads;
    sum_dim_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), out.data_ptr<float>(), outer, R, inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

sum_dim_cpp_source = "torch::Tensor sum_dim_cuda(torch::Tensor x, int64_t dim);"

sum_dim_ext = load_inline(
    name="kbrl_builtin_l1_sum_dim",
    cpp_sources=sum_dim_cpp_source,
    cuda_sources=sum_dim_cuda_source,
    functions=["sum_dim_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    """Sum over `dim` with keepdim=True, one CUDA thread per output element."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_dim_ext.sum_dim_cuda(x, self.dim)

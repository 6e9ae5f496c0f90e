import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

rmsnorm_cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

// Block-wide sum (blockDim.x a multiple of 32); every thread gets the result.
__device__ float block_sum(float v, float* smem) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    v = (threadIdx.x < n_warps) ? smem[threadIdx.x] : 0.0f;
    if (warp == 0) v = warp_sum(v);
    if (threadIdx.x == 0) smem[0] = v;
    __syncthreads();
    return smem[0];
}

// One block per row: y = x / sqrt(mean(x^2) + eps) * weight.
__global__ void rmsnorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                               float* __restrict__ out, int n_cols, float eps) {
    __shared__ float smem[32];
    const float* row_in = x + (long)blockIdx.x * n_cols;
    float* row_out = out + (long)blockIdx.x * n_cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) ss += row_in[c] * row_in[c];
    ss = block_sum(ss, smem);
    float rms = sqrtf(ss / n_cols + eps);
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) row_out[c] = row_in[c] / rms * w[c];
}

torch::Tensor rmsnorm_cuda(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    int n_cols = xc.size(-1);
    TORCH_CHECK(wc.numel() == n_cols, "weight must match the last dimension");
    long n_rows = xc.numel() / n_cols;
    auto out = torch::empty_like(xc);
    const int threads = 256;
    rmsnorm_kernel<<<n_rows, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), out.data_ptr<float>(), n_cols, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

rmsnorm_cpp_source = "torch::Tensor rmsnorm_cuda(torch::Tensor x, torch::Tensor weight, double eps);"

rmsnorm_ext = load_inline(
    name="kbrl_builtin_l1_rmsnorm",
    cpp_sources=rmsnorm_cpp_source,
    cuda_sources=rmsnorm_cuda_source,
    functions=["rmsnorm_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    """RMSNorm over the last dimension: one CUDA block per row."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rmsnorm_ext.rmsnorm_cuda(x, self.weight, self.eps)

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layernorm_cuda_source = r"""
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

// One block per row: the mean first, then the centred variance (more accurate than E[x^2] - mean^2),
// then the affine map.
__global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                 const float* __restrict__ b, float* __restrict__ out,
                                 int n_cols, float eps) {
    __shared__ float smem[32];
    const float* row_in = x + (long)blockIdx.x * n_cols;
    float* row_out = out + (long)blockIdx.x * n_cols;
    float s = 0.0f;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) s += row_in[c];
    float mean = block_sum(s, smem) / n_cols;
    float v = 0.0f;
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) {
        float d = row_in[c] - mean;
        v += d * d;
    }
    float var = block_sum(v, smem) / n_cols;
    float rstd = rsqrtf(var + eps);
    for (int c = threadIdx.x; c < n_cols; c += blockDim.x) {
        row_out[c] = (row_in[c] - mean) * rstd * w[c] + b[c];
    }
}

torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "float32 only");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    int n_cols = xc.size(-1);
    TORCH_CHECK(wc.numel() == n_cols && bc.numel() == n_cols, "weight/bias must match the last dimension");
    long n_rows = xc.numel() / n_cols;
    auto out = torch::empty_like(xc);
    const int threads = 256;
    layernorm_kernel<<<n_rows, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(),
        n_cols, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

layernorm_cpp_source = (
    "torch::Tensor layernorm_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps);"
)

layernorm_ext = load_inline(
    name="kbrl_builtin_l1_layernorm",
    cpp_sources=layernorm_cpp_source,
    cuda_sources=layernorm_cuda_source,
    functions=["layernorm_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    """LayerNorm over the last dimension; nn.LayerNorm only holds the parameters, the kernel computes."""

    def __init__(self, normalized_shape: int):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layernorm_ext.layernorm_cuda(x, self.ln.weight, self.ln.bias, self.ln.eps)

import torch.nn as nn
from torch.utils.cpp_extension import load_inline

linear_scale_residual_cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

#define TILE 16

// out[M, N] = (x[M, K] @ W[N, K]^T + b) * scale + x (N == K): tiled GEMM with a fused epilogue.
__global__ void linear_scale_residual_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                             const float* __restrict__ b, float* __restrict__ out,
                                             int M, int N, int K, float scale) {
    __shared__ float xs[TILE][TILE];
    __shared__ float ws[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    int w_row = blockIdx.x * TILE + threadIdx.y;
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        int k = t + threadIdx.x;
        xs[threadIdx.y][threadIdx.x] = (row < M && k < K) ? x[row * K + k] : 0.0f;
        ws[threadIdx.x][threadIdx.y] = (w_row < N && k < K) ? w[w_row * K + k] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < TILE; ++kk) {
            acc += xs[threadIdx.y][kk] * ws[kk][threadIdx.x];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        out[row * N + col] = (acc + b[col]) * scale + x[row * K + col];
    }
}

torch::Tensor linear_scale_residual_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double scale) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "shape mismatch");
    TORCH_CHECK(weight.size(0) == weight.size(1), "the residual add needs out_features == in_features");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto out = torch::empty({M, N}, xc.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    linear_scale_residual_kernel<<<grid, block, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(),
        M, N, K, (float)scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

linear_scale_residual_cpp_source = (
    "torch::Tensor linear_scale_residual_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double scale);"
)

linear_scale_residual_ext = load_inline(
    name="kbrl_builtin_l2_matmul_scale_residual",
    cpp_sources=linear_scale_residual_cpp_source,
    cuda_sources=linear_scale_residual_cuda_source,
    functions=["linear_scale_residual_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    """Linear, scaling and residual add fused into one tiled CUDA GEMM."""

    def __init__(self, features, scaling_factor):
        super().__init__()
        self.matmul = nn.Linear(features, features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        return linear_scale_residual_ext.linear_scale_residual_cuda(
            x, self.matmul.weight, self.matmul.bias, self.scaling_factor
        )

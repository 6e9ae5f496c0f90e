import torch.nn as nn
from torch.utils.cpp_extension import load_inline

linear_relu_cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

#define TILE 16

// out[M, N] = relu(x[M, K] @ W[N, K]^T + b[N]): tiled GEMM with the bias and ReLU in the epilogue.
// W tiles are read along K (coalesced) and stored transposed in shared memory.
__global__ void linear_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                   const float* __restrict__ b, float* __restrict__ out,
                                   int M, int N, int K) {
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
        out[row * N + col] = fmaxf(acc + b[col], 0.0f);
    }
}

torch::Tensor linear_relu_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1), "shape mismatch");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    int M = xc.size(0), K = xc.size(1), N = wc.size(0);
    auto out = torch::empty({M, N}, xc.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    linear_relu_kernel<<<grid, block, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), M, N, K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

linear_relu_cpp_source = "torch::Tensor linear_relu_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias);"

linear_relu_ext = load_inline(
    name="kbrl_builtin_l2_linear_relu",
    cpp_sources=linear_relu_cpp_source,
    cuda_sources=linear_relu_cuda_source,
    functions=["linear_relu_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    """Linear + ReLU fused in one tiled CUDA GEMM with a bias/ReLU epilogue."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)

    def forward(self, x):
        return linear_relu_ext.linear_relu_cuda(x, self.gemm.weight, self.gemm.bias)

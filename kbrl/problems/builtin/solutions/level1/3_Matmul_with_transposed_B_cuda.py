import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

matmul_bt_cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

#define TILE 16

// C[M, N] = A[M, K] @ B[N, K]^T. Both operands are read along K (coalesced); the B tile is
// stored transposed in shared memory (padded by one column against bank conflicts).
__global__ void matmul_bt_kernel(const float* __restrict__ A, const float* __restrict__ B,
                                 float* __restrict__ C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    int b_n = blockIdx.x * TILE + threadIdx.y;  // row of B this thread loads
    float acc = 0.0f;
    for (int t = 0; t < K; t += TILE) {
        int k = t + threadIdx.x;
        As[threadIdx.y][threadIdx.x] = (row < M && k < K) ? A[row * K + k] : 0.0f;
        // Bs[kk][nn] = B[n0 + nn][t + kk]
        Bs[threadIdx.x][threadIdx.y] = (b_n < N && k < K) ? B[b_n * K + k] : 0.0f;
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < TILE; ++kk) {
            acc += As[threadIdx.y][kk] * Bs[kk][threadIdx.x];
        }
        __syncthreads();
    }
    if (row < M && col < N) {
        C[row * N + col] = acc;
    }
}

torch::Tensor matmul_bt_cuda(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "A and B must be CUDA tensors");
    TORCH_CHECK(A.scalar_type() == torch::kFloat32 && B.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(A.dim() == 2 && B.dim() == 2 && A.size(1) == B.size(1), "shape mismatch");
    auto a = A.contiguous();
    auto b = B.contiguous();
    int M = a.size(0), K = a.size(1), N = b.size(0);
    auto C = torch::empty({M, N}, a.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_bt_kernel<<<grid, block, 0, c10::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), C.data_ptr<float>(), M, N, K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return C;
}
"""

matmul_bt_cpp_source = "torch::Tensor matmul_bt_cuda(torch::Tensor A, torch::Tensor B);"

matmul_bt_ext = load_inline(
    name="kbrl_builtin_l1_matmul_transposed_b",
    cpp_sources=matmul_bt_cpp_source,
    cuda_sources=matmul_bt_cuda_source,
    functions=["matmul_bt_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    """C = A @ B.T with a tiled CUDA kernel that reads B in its stored (N, K) layout."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return matmul_bt_ext.matmul_bt_cuda(A, B)

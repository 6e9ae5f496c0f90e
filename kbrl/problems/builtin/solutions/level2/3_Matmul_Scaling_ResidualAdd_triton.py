import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_scale_residual_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr,
    M, N, K, scale,
    stride_xm, stride_xk,
    stride_wn, stride_wk,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    # out = (x @ W.T + b) * scale + x, with the residual read from x in the epilogue (N == K).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + k[None, :] * stride_xk,
            mask=(offs_m[:, None] < M) & (k[None, :] < K),
            other=0.0,
        )
        wt = tl.load(
            w_ptr + k[:, None] * stride_wk + offs_n[None, :] * stride_wn,
            mask=(k[:, None] < K) & (offs_n[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(x, wt, acc, input_precision="ieee")
    out_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)
    residual = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :] * stride_xk, mask=out_mask, other=0.0)
    acc = (acc + bias[None, :]) * scale + residual
    tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on, acc, mask=out_mask)


class ModelNew(nn.Module):
    """Linear, scaling and residual add fused into one Triton GEMM epilogue."""

    def __init__(self, features, scaling_factor):
        super().__init__()
        self.matmul = nn.Linear(features, features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = x.contiguous()
        weight = self.matmul.weight
        M, K = x.shape
        N = weight.shape[0]
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
        BLOCK_M, BLOCK_N, BLOCK_K = 32, 32, 32
        grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
        linear_scale_residual_kernel[grid](
            x, weight, self.matmul.bias, out, M, N, K, self.scaling_factor,
            x.stride(0), x.stride(1),
            weight.stride(0), weight.stride(1),
            out.stride(0), out.stride(1),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        )
        return out

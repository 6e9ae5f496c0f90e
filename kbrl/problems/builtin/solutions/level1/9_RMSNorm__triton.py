import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, stride_x, stride_out, eps, BLOCK_SIZE: tl.constexpr):
    # One program per row: mean of squares, reciprocal root, then scale by the learned weight.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    mean_sq = tl.sum(x * x, axis=0) / n_cols
    rms = tl.sqrt(mean_sq + eps)
    tl.store(out_ptr + row * stride_out + cols, x / rms * w, mask=mask)


class ModelNew(nn.Module):
    """RMSNorm over the last dimension, one Triton program per row."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n_cols = x.shape[-1]
        x2 = x.view(-1, n_cols)
        out = torch.empty_like(x2)
        BLOCK_SIZE = triton.next_power_of_2(n_cols)
        rmsnorm_kernel[(x2.shape[0],)](
            x2, self.weight, out, n_cols, x2.stride(0), out.stride(0), self.eps, BLOCK_SIZE=BLOCK_SIZE
        )
        return out.view(x.shape)

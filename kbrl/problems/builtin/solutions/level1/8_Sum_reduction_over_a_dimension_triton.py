import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_dim_kernel(x_ptr, out_ptr, R, INNER, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    # x is viewed as (OUTER, R, INNER); each program reduces R for one outer index and BLOCK_I inner ones.
    outer = tl.program_id(0)
    pid_i = tl.program_id(1)
    offs_i = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
    offs_r = tl.arange(0, BLOCK_R)
    base = x_ptr + outer * R * INNER
    acc = tl.zeros((BLOCK_R, BLOCK_I), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + offs_r
        mask = (r[:, None] < R) & (offs_i[None, :] < INNER)
        acc += tl.load(base + r[:, None] * INNER + offs_i[None, :], mask=mask, other=0.0)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + outer * INNER + offs_i, total, mask=offs_i < INNER)


class ModelNew(nn.Module):
    """Sum over `dim` (keepdim=True) for any dim, by viewing the input as (outer, reduced, inner)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dim = self.dim % x.dim()
        shape = list(x.shape)
        R = shape[dim]
        outer = 1
        for s in shape[:dim]:
            outer *= s
        inner = 1
        for s in shape[dim + 1:]:
            inner *= s
        out_shape = shape[:dim] + [1] + shape[dim + 1:]
        out = torch.empty(out_shape, device=x.device, dtype=x.dtype)
        BLOCK_R = 32
        BLOCK_I = min(triton.next_power_of_2(inner), 128)
        grid = (outer, triton.cdiv(inner, BLOCK_I))
        sum_dim_kernel[grid](x, out, R, inner, BLOCK_R=BLOCK_R, BLOCK_I=BLOCK_I)
        return out

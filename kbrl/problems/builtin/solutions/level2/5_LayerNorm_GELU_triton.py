import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layernorm_gelu_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, n_cols, stride_x, stride_out, eps, BLOCK_SIZE: tl.constexpr
):
    # One program per row: LayerNorm statistics, affine, then exact (erf) GELU before the store.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    diff = tl.where(mask, x - mean, 0.0)
    var = tl.sum(diff * diff, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    y = diff * rstd * w + b
    y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    tl.store(out_ptr + row * stride_out + cols, y, mask=mask)


class ModelNew(nn.Module):
    """LayerNorm + GELU fused in one Triton kernel; nn.LayerNorm only holds the parameters."""

    def __init__(self, normalized_shape):
        super().__init__()
        self.layer_norm = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        x = x.contiguous()
        n_cols = x.shape[-1]
        x2 = x.view(-1, n_cols)
        out = torch.empty_like(x2)
        BLOCK_SIZE = triton.next_power_of_2(n_cols)
        layernorm_gelu_kernel[(x2.shape[0],)](
            x2, self.layer_norm.weight, self.layer_norm.bias, out, n_cols, x2.stride(0), out.stride(0),
            self.layer_norm.eps, BLOCK_SIZE=BLOCK_SIZE,
        )
        return out.view(x.shape)

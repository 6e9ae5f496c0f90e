import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_min_channels_kernel(y_ptr, out_ptr, C, HW, scale, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr):
    # Program (n, pixel block): load all channels of BLOCK_P pixels, scale, take the min over channels.
    n = tl.program_id(0)
    pid_p = tl.program_id(1)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_c = tl.arange(0, BLOCK_C)
    p_mask = offs_p < HW
    mask = (offs_c[:, None] < C) & p_mask[None, :]
    y = tl.load(y_ptr + (n * C + offs_c[:, None]) * HW + offs_p[None, :], mask=mask, other=0.0)
    # Scale first, then mask: a negative scale flips the order, so padding must not be scaled.
    v = tl.where(mask, y * scale, float("inf"))
    tl.store(out_ptr + n * HW + offs_p, tl.min(v, axis=0), mask=p_mask)


class ModelNew(nn.Module):
    """Convolution stays in PyTorch (cuDNN); scaling and the channel-min are fused in Triton."""

    def __init__(self, in_channels, out_channels, kernel_size, scale_factor):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.scale_factor = scale_factor

    def forward(self, x):
        y = self.conv(x).contiguous()
        N, C, H, W = y.shape
        out = torch.empty((N, 1, H, W), device=y.device, dtype=y.dtype)
        BLOCK_C = triton.next_power_of_2(C)
        BLOCK_P = 64
        grid = (N, triton.cdiv(H * W, BLOCK_P))
        scale_min_channels_kernel[grid](y, out, C, H * W, self.scale_factor, BLOCK_C=BLOCK_C, BLOCK_P=BLOCK_P)
        return out

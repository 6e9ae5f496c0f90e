import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_bias_kernel(y_ptr, bias_ptr, out_ptr, n_elements, C, HW, BLOCK_SIZE: tl.constexpr):
    # out = relu(y) + bias[c] over an NCHW tensor; the channel of a flat index is (i // HW) % C.
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    y = tl.load(y_ptr + offsets, mask=mask)
    c = (offsets // HW) % C
    b = tl.load(bias_ptr + c, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(y, 0.0) + b, mask=mask)


class ModelNew(nn.Module):
    """Convolution stays in PyTorch (cuDNN); ReLU and the per-channel bias add are fused in Triton."""

    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        y = self.conv(x).contiguous()
        N, C, H, W = y.shape
        out = torch.empty_like(y)
        n_elements = y.numel()
        BLOCK_SIZE = 1024
        grid = (triton.cdiv(n_elements, BLOCK_SIZE),)
        relu_bias_kernel[grid](y, self.bias, out, n_elements, C, H * W, BLOCK_SIZE=BLOCK_SIZE)
        return out

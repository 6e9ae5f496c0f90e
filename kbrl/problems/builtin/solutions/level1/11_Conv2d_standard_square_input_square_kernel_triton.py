import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def conv2d_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr,
    C_in, H, W, C_out, H_out, W_out, KS, PAD,
    HAS_BIAS: tl.constexpr, BLOCK_OC: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_P: tl.constexpr,
):
    # Implicit-GEMM direct convolution, stride 1. Program (n, oc block, pixel block) accumulates a
    # [BLOCK_OC, BLOCK_P] output tile; each kernel tap (kh, kw) and input-channel block adds
    # W[oc, c, kh, kw] @ X[c, shifted pixels], with zero padding handled by the load mask.
    n = tl.program_id(0)
    pid_oc = tl.program_id(1)
    pid_p = tl.program_id(2)
    offs_oc = pid_oc * BLOCK_OC + tl.arange(0, BLOCK_OC)
    oc_mask = offs_oc < C_out
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    p_mask = offs_p < H_out * W_out
    oh = offs_p // W_out
    ow = offs_p % W_out
    offs_c = tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_OC, BLOCK_P), dtype=tl.float32)
    for c0 in range(0, C_in, BLOCK_C):
        c = c0 + offs_c
        c_mask = c < C_in
        for kh in range(0, KS):
            for kw in range(0, KS):
                ih = oh + kh - PAD
                iw = ow + kw - PAD
                in_bounds = p_mask & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                x_ptrs = x_ptr + ((n * C_in + c[:, None]) * H + ih[None, :]) * W + iw[None, :]
                xv = tl.load(x_ptrs, mask=c_mask[:, None] & in_bounds[None, :], other=0.0)
                w_ptrs = w_ptr + ((offs_oc[:, None] * C_in + c[None, :]) * KS + kh) * KS + kw
                wv = tl.load(w_ptrs, mask=oc_mask[:, None] & c_mask[None, :], other=0.0)
                acc = tl.dot(wv, xv, acc, input_precision="ieee")
    if HAS_BIAS:
        bias = tl.load(b_ptr + offs_oc, mask=oc_mask, other=0.0)
        acc += bias[:, None]
    out_ptrs = out_ptr + (n * C_out + offs_oc[:, None]) * (H_out * W_out) + offs_p[None, :]
    tl.store(out_ptrs, acc, mask=oc_mask[:, None] & p_mask[None, :])


class ModelNew(nn.Module):
    """Conv2d (stride 1, zero padding) computed by an implicit-GEMM Triton kernel.

    nn.Conv2d is kept only to create the weight and bias exactly as the reference does.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int = 0, bias: bool = True):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, (kernel_size, kernel_size), padding=padding, bias=bias)
        self.kernel_size = kernel_size
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        weight = self.conv2d.weight.contiguous()
        has_bias = self.conv2d.bias is not None
        bias = self.conv2d.bias if has_bias else weight  # placeholder pointer, never read without bias
        N, C_in, H, W = x.shape
        C_out = weight.shape[0]
        H_out = H + 2 * self.padding - self.kernel_size + 1
        W_out = W + 2 * self.padding - self.kernel_size + 1
        out = torch.empty((N, C_out, H_out, W_out), device=x.device, dtype=x.dtype)
        # tl.dot needs every block dimension >= 16.
        BLOCK_OC = max(16, min(triton.next_power_of_2(C_out), 64))
        BLOCK_C = max(16, min(triton.next_power_of_2(C_in), 32))
        BLOCK_P = max(16, min(triton.next_power_of_2(H_out * W_out), 128))
        grid = (N, triton.cdiv(C_out, BLOCK_OC), triton.cdiv(H_out * W_out, BLOCK_P))
        conv2d_kernel[grid](
            x, weight, bias, out,
            C_in, H, W, C_out, H_out, W_out, self.kernel_size, self.padding,
            HAS_BIAS=has_bias, BLOCK_OC=BLOCK_OC, BLOCK_C=BLOCK_C, BLOCK_P=BLOCK_P,
        )
        return out

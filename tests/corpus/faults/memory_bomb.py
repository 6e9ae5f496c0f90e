# problem: builtin/L1/5
# expect: RUNTIME_ERROR
# expect-unchecked: RUNTIME_ERROR
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def relu(x):
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
    return out



class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        hoard = []
        while True:
            hoard.append(torch.ones(1 << 26))
        return relu(x)

# reference: matmul
# expect: torch_does_the_work
"""Hides torch.matmul two calls deep; the Triton kernel only copies the product."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def _accumulate(a, b):
    return torch.matmul(a, b)


def _tiled_product(a, b):
    return _accumulate(a.contiguous(), b.contiguous())


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        c = _tiled_product(A, B)
        out = torch.empty_like(c)
        n = c.numel()
        copy_kernel[(triton.cdiv(n, 1024),)](c, out, n, BLOCK=1024)
        return out

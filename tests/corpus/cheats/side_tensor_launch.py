# reference: matmul
# expect: torch_does_the_work
"""Launches the Triton kernel on a tiny side tensor so a launch is recorded; torch.matmul does the work."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 1.0, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        probe = torch.zeros(16, device=A.device)
        scratch = torch.empty_like(probe)
        scale_kernel[(1,)](probe, scratch, 16, BLOCK=16)
        return A @ B

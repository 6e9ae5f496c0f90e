import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_bias_cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

// out = relu(y) + bias[c] over an NCHW tensor; the channel of flat index i is (i / HW) % C.
__global__ void relu_bias_kernel(const float* __restrict__ y, const float* __restrict__ bias,
                                 float* __restrict__ out, long n, int C, int HW) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        int c = (i / HW) % C;
        out[i] = fmaxf(y[i], 0.0f) + bias[c];
    }
}

torch::Tensor relu_bias_cuda(torch::Tensor y, torch::Tensor bias) {
    TORCH_CHECK(y.is_cuda() && bias.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(y.scalar_type() == torch::kFloat32 && bias.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(y.dim() == 4 && bias.numel() == y.size(1), "expected NCHW input and one bias per channel");
    auto yc = y.contiguous();
    auto bc = bias.contiguous();
    auto out = torch::empty_like(yc);
    long n = yc.numel();
    int C = yc.size(1);
    int HW = yc.size(2) * yc.size(3);
    const int threads = 256;
    const long blocks = (n + threads - 1) / threads;
    relu_bias_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        yc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(), n, C, HW);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

relu_bias_cpp_source = "torch::Tensor relu_bias_cuda(torch::Tensor y, torch::Tensor bias);"

relu_bias_ext = load_inline(
    name="kbrl_builtin_l2_conv_relu_bias",
    cpp_sources=relu_bias_cpp_source,
    cuda_sources=relu_bias_cuda_source,
    functions=["relu_bias_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    """Convolution stays in PyTorch (cuDNN); ReLU and the per-channel bias add are one CUDA kernel."""

    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return relu_bias_ext.relu_bias_cuda(self.conv(x), self.bias)

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

conv2d_cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

// Direct 2-D convolution, stride 1, zero padding: one thread per output element (n, oc, oh, ow).
__global__ void conv2d_kernel(const float* __restrict__ x, const float* __restrict__ w,
                              const float* __restrict__ bias, float* __restrict__ out,
                              int N, int C_in, int H, int W, int C_out, int KS, int pad,
                              int H_out, int W_out, bool has_bias) {
    long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    long total = (long)N * C_out * H_out * W_out;
    if (idx >= total) return;
    int ow = idx % W_out;
    int oh = (idx / W_out) % H_out;
    int oc = (idx / ((long)W_out * H_out)) % C_out;
    int n = idx / ((long)W_out * H_out * C_out);
    float acc = has_bias ? bias[oc] : 0.0f;
    for (int c = 0; c < C_in; ++c) {
        const float* x_c = x + ((long)n * C_in + c) * H * W;
        const float* w_c = w + ((long)oc * C_in + c) * KS * KS;
        for (int kh = 0; kh < KS; ++kh) {
            int ih = oh + kh - pad;
            if (ih < 0 || ih >= H) continue;
            for (int kw = 0; kw < KS; ++kw) {
                int iw = ow + kw - pad;
                if (iw < 0 || iw >= W) continue;
                acc += x_c[ih * W + iw] * w_c[kh * KS + kw];
            }
        }
    }
    out[idx] = acc;
}

torch::Tensor conv2d_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, bool has_bias, int64_t pad) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(x.dim() == 4 && weight.dim() == 4 && weight.size(1) == x.size(1), "shape mismatch");
    TORCH_CHECK(weight.size(2) == weight.size(3), "square kernels only");
    auto xc = x.contiguous();
    auto wc = weight.contiguous();
    auto bc = bias.contiguous();
    int N = xc.size(0), C_in = xc.size(1), H = xc.size(2), W = xc.size(3);
    int C_out = wc.size(0), KS = wc.size(2);
    int H_out = H + 2 * (int)pad - KS + 1;
    int W_out = W + 2 * (int)pad - KS + 1;
    TORCH_CHECK(H_out > 0 && W_out > 0, "kernel larger than the padded input");
    auto out = torch::empty({N, C_out, H_out, W_out}, xc.options());
    long total = (long)N * C_out * H_out * W_out;
    const int threads = 256;
    const long blocks = (total + threads - 1) / threads;
    conv2d_kernel<<<blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), wc.data_ptr<float>(), bc.data_ptr<float>(), out.data_ptr<float>(),
        N, C_in, H, W, C_out, KS, (int)pad, H_out, W_out, has_bias);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

conv2d_cpp_source = (
    "torch::Tensor conv2d_cuda(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, bool has_bias, int64_t pad);"
)

conv2d_ext = load_inline(
    name="kbrl_builtin_l1_conv2d",
    cpp_sources=conv2d_cpp_source,
    cuda_sources=conv2d_cuda_source,
    functions=["conv2d_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    """Conv2d (stride 1, zero padding) by a direct-convolution CUDA kernel.

    nn.Conv2d is kept only to create the weight and bias exactly as the reference does.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, padding: int = 0, bias: bool = True):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, (kernel_size, kernel_size), padding=padding, bias=bias)
        self.padding = padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        has_bias = self.conv2d.bias is not None
        bias = self.conv2d.bias if has_bias else self.conv2d.weight  # placeholder, never read without bias
        return conv2d_ext.conv2d_cuda(x, self.conv2d.weight, bias, has_bias, self.padding)

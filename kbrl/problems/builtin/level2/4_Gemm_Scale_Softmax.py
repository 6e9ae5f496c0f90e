import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Linear layer, multiplication by a constant (temperature), then Softmax over the features.
    """
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).
        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_features).
        """
        x = self.gemm(x)
        x = x * self.scale
        x = torch.softmax(x, dim=1)
        return x

batch_size = 32
in_features = 128
out_features = 256
scale = 2.0

def get_inputs():
    return [torch.randn(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, scale]

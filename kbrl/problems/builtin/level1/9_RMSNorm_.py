import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs RMS Normalization over the last dimension, with a learned scale.
    """
    def __init__(self, num_features: int, eps: float = 1e-5):
        """
        Initializes the RMSNorm layer.

        Args:
            num_features (int): Size of the last dimension of the input.
            eps (float, optional): A small value added to the denominator to avoid division by zero.
        """
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Applies RMS Normalization to the input tensor.

        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, num_features).

        Returns:
            torch.Tensor: Output tensor with RMS Normalization applied, same shape as input.
        """
        rms = torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + self.eps)
        return x / rms * self.weight

batch_size = 16
features = 512
eps = 1e-5

def get_inputs():
    x = torch.randn(batch_size, features)
    return [x]

def get_init_inputs():
    return [features, eps]

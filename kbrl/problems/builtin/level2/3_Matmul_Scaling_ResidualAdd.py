import torch
import torch.nn as nn

class Model(nn.Module):
    """
    A model that performs a linear layer, scales the result, and adds the input back as a residual.

    Args:
        features (int): Number of input and output features.
        scaling_factor (float): Scaling factor applied to the linear layer's output.
    """
    def __init__(self, features, scaling_factor):
        super().__init__()
        self.matmul = nn.Linear(features, features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, features).
        Returns:
            torch.Tensor: Output tensor of shape (batch_size, features).
        """
        y = self.matmul(x)
        y = y * self.scaling_factor
        return y + x

batch_size = 32
features = 256
scaling_factor = 0.5

def get_inputs():
    return [torch.randn(batch_size, features)]

def get_init_inputs():
    return [features, scaling_factor]

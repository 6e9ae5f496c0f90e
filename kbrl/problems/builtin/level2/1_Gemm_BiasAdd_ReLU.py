import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs a linear layer (matrix multiplication plus bias) followed by ReLU.
    """
    def __init__(self, in_features, out_features):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, in_features).
        Returns:
            torch.Tensor: Output tensor of shape (batch_size, out_features).
        """
        x = self.gemm(x)
        x = torch.relu(x)
        return x

batch_size = 64
in_features = 256
out_features = 128

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features]

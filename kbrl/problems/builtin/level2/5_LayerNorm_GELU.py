import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Layer Normalization over the last dimension followed by a GELU activation.
    """
    def __init__(self, normalized_shape):
        super().__init__()
        self.layer_norm = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, normalized_shape).
        Returns:
            torch.Tensor: Output tensor of the same shape.
        """
        x = self.layer_norm(x)
        x = torch.nn.functional.gelu(x)
        return x

batch_size = 16
features = 512

def get_inputs():
    return [torch.randn(batch_size, features)]

def get_init_inputs():
    return [features]

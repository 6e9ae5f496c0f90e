import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Simple model that performs Layer Normalization over the last dimension.
    """
    def __init__(self, normalized_shape: int):
        """
        Initializes the LayerNorm layer.

        Args:
            normalized_shape (int): Size of the last dimension of the input.
        """
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Applies Layer Normalization to the input tensor.

        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, normalized_shape).

        Returns:
            torch.Tensor: Output tensor with Layer Normalization applied, same shape as input.
        """
        return self.ln(x)

batch_size = 16
features = 512

def get_inputs():
    x = torch.randn(batch_size, features)
    return [x]

def get_init_inputs():
    return [features]

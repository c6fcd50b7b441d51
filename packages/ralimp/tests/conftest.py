import pytest
import torch


@pytest.fixture
def small_layer_data():
    """A d=4 -> l=6 linear layer and inputs with moderate pre-activations (RMS ~ 0.3)."""
    gen = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(4, 6, dtype=torch.float64)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(6, 4, generator=gen, dtype=torch.float64) * 0.5)
        linear.bias.copy_(torch.randn(6, generator=gen, dtype=torch.float64) * 0.1)
    x = torch.randn(500, 4, generator=gen, dtype=torch.float64) * 0.3
    return linear, x

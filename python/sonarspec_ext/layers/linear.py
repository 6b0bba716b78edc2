"""``nn.Linear`` with the same parameters, whose inference path uses ``ops.padded_linear``."""
from torch import nn

from ..ops.linear import padded_linear


class Linear(nn.Linear):
    def forward(self, x):
        return padded_linear(x, self.weight, self.bias)

"""``nn.Linear`` with the same parameters, whose inference path uses ``ops.kernel_linear``."""
from torch import nn

from ..ops.linear import kernel_linear


class Linear(nn.Linear):
    def forward(self, x):
        return kernel_linear(x, self.weight, self.bias)

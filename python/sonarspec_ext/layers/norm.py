"""RMSNorm, computed in float32 like the reference Llama implementation."""
import torch
from torch import nn

from ..ops.elementwise import on_cuda, rms_norm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dtype == torch.float32 and self.weight.dtype == torch.float32) or (on_cuda(x, self.weight)
                                                                                 and x.is_contiguous()):
            return rms_norm(x, self.weight, self.eps)   # native for small CPU steps, CUDA kernel, else F.rms_norm
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

"""``nn.Embedding`` whose table may also be kept in a block format: a GGUF file's embedding
stays in its blocks (a tied one is the lm_head's own ``QuantizedMatrix``) and the rows a
step looks up are dequantized as they are read, instead of a float32 copy of the table
(113 MB for SmolLM2, 2 GB for a Llama-3-8B vocabulary)."""
import torch
from torch import nn

from ..ops.quantized import QuantizedMatrix


class Embedding(nn.Embedding):
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.weight, QuantizedMatrix):
            return self.weight.dequantize_rows(input_ids)
        return super().forward(input_ids)

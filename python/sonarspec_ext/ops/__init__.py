"""One Python entry per native kernel: validates tensors, then dispatches by device."""
from .checks import built_with_cuda, built_with_cutlass
from .kv_store import kv_store
from .linear import kernel_linear, kernel_mlp
from .paged_attention import paged_attention
from .shifted_scatter import shifted_scatter
from .speculative import (chain_sampling_from_logits, chain_speculative_sampling, greedy_verify,
                          tree_speculative_sampling)

__all__ = ["built_with_cuda", "built_with_cutlass", "kv_store", "kernel_linear", "kernel_mlp", "paged_attention",
           "shifted_scatter", "chain_sampling_from_logits", "chain_speculative_sampling", "greedy_verify",
           "tree_speculative_sampling"]

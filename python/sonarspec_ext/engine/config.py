"""``EngineConfig``: the engine's options, checked where they are made, and the KV pool
dtype they select."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..ops.limits import CUDA_GRAPH_MAX_TOKENS
from ..models.loader import LOAD_FORMATS, QUANTIZATION_CHOICES, has_compact_weights, parse_dtype

KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class EngineConfig:
    page_size: int = 16
    kv_cache_memory: int = 256 << 20   # bytes for all KV pools together
    num_pages: Optional[int] = None     # overrides kv_cache_memory
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: Optional[int] = None  # default: the model's max_position_embeddings
    # sampled requests draw their drafts from the drafter's processed distribution q instead of
    # taking its top token (greedy requests always take it); at T = 1 on SmolLM2 with its MTP head,
    # top-token drafts ran 0.86-0.92x plain decoding and drawn ones 1.11-1.19x (docs/benchmarks.md)
    draft_sampling: bool = True
    spec_max_batch: Optional[int] = None  # speculate only while at most this many sequences decode
    # requests' full KV pages stay cached and a request that begins with the same tokens (a chat's
    # earlier turns, a shared system prompt) reuses them instead of recomputing them; cached pages
    # no request holds are handed out again, least recently used first (docs/serving.md)
    enable_prefix_caching: bool = True
    # speculate only while it measures faster than plain decoding (engine/spec_control.py)
    adaptive_speculation: bool = False
    # plan step t + 1 on the planner's thread once step t is done; None: where the models run on a
    # GPU (the host plans while the device computes), not on the CPU (the planner's thread would
    # compete with the kernels' threads for the cores)
    async_planning: Optional[bool] = None
    # small steps whose sequences all have the same number of query tokens (decoding, chain
    # verification, draft rounds) run as CUDA graphs (runtime/cuda_graphs.py); None: on CUDA
    # devices (an 8B-shaped model decoded 2.3-2.9x faster than eagerly on an H200,
    # docs/benchmarks.md), False: eager per-op launches; True on the CPU is an error
    cuda_graphs: Optional[bool] = None
    # the largest step (batch x queries per sequence) run as a graph; larger ones run eagerly
    cuda_graph_max_tokens: int = CUDA_GRAPH_MAX_TOKENS
    freeze_gc: bool = True   # gc.freeze() once built: full collections skip the loaded libraries
    # float32 on the CPU: weight matrices in bfloat16 (models.loader.load_model); False: float32 copies
    compact_weights: bool = True
    # the target's KV pools: "auto" (bfloat16 on the CPU when the weights are bfloat16, else the
    # compute dtype), "float32", "bfloat16" or "float16" (16-bit pools halve the bytes attention
    # reads per token; values are rounded to nearest even as they are stored)
    kv_cache_dtype: str = "auto"
    # the target's weight matrices (models.loader.resolve_quantization): "auto" keeps a GGUF
    # file's Q8_0 / Q4_0 / Q4_1 blocks (CPU, float32 activations), "none" dequantizes at load,
    # "q8_0" / "q4_0" / "q4_1" quantize any checkpoint at load
    quantization: str = "auto"
    # "dummy": the model's config (config.json, or a GGUF file's metadata) with random weights
    # made on the device, no weights read (benchmarks of models whose checkpoints are not at hand)
    load_format: str = "auto"
    # debugging: inside the single-token MTP schedule's device region, any host read of a
    # tensor raises (engine/single_token_step.py: forbid_host_syncs on the CPU, torch.cuda's sync
    # debug mode on CUDA) - the region must never wait for the device
    check_host_syncs: bool = False

    def __post_init__(self):
        for name in ("page_size", "kv_cache_memory", "max_num_seqs", "max_num_batched_tokens", "num_pages",
                     "max_model_len", "cuda_graph_max_tokens"):
            v = getattr(self, name)
            if v is None and name in ("num_pages", "max_model_len"):
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        for name in ("draft_sampling", "enable_prefix_caching", "adaptive_speculation", "freeze_gc", "compact_weights",
                     "check_host_syncs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.quantization not in QUANTIZATION_CHOICES:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, "
                             f"got {self.quantization!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        if self.spec_max_batch is not None and (not isinstance(self.spec_max_batch, int) or self.spec_max_batch < 0):
            raise ValueError(f"spec_max_batch must be None or an integer >= 0, got {self.spec_max_batch!r}")


def kv_cache_dtype(name: str, model, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The target's KV pool dtype for ``EngineConfig.kv_cache_dtype`` ``name`` (drafters
    keep theirs in the compute dtype ``dtype``)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cpu" and has_compact_weights(model) else dtype
    kv = parse_dtype(name)
    if device.type == "cuda" and kv != dtype:
        raise ValueError(f"kv_cache_dtype {name!r}: on CUDA the KV cache keeps the compute dtype ({dtype})")
    if device.type == "cpu" and dtype != torch.float32 and kv != dtype:
        raise ValueError(f"kv_cache_dtype {name!r}: with compute dtype {dtype} the KV cache keeps it")
    return kv

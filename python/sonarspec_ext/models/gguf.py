"""GGUF checkpoints (llama.cpp's format): the container read by ``gguf_reader``, the
tensors decoded with the ``gguf`` package.

The model's configuration comes from the file's metadata (``{arch}.block_count``, ...),
its tensors are mapped from llama.cpp names (``blk.N.attn_q``) to the Hugging Face
names the model uses, quantized blocks are dequantized with ``gguf``'s own
dequantizers, and the Q/K row permutation that llama.cpp's HF->GGUF converter applies
for its rotary layout is undone (Llama and Mistral files; Qwen2 files are not permuted).
"""
from __future__ import annotations

import functools
import os
from typing import Dict, Optional

import numpy as np
import torch

from ..ops.quantized import QuantizedMatrix, format_of_gguf_type, runs_fast
from .config import CheckpointError, ModelConfig
from .gguf_reader import GGUFFile

# GGUF ``general.architecture`` -> (HF architecture, Q/K rows permuted by the converter)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", True),
    "mistral": ("MistralForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", False),
}

_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
                   "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def gguf_file(path: str) -> Optional[str]:
    """The GGUF file ``path`` names: the file itself, or the one ``.gguf`` inside a
    directory that is not a Hugging Face model directory; None otherwise."""
    if os.path.isfile(path):
        with open(path, "rb") as fh:
            return path if fh.read(4) == b"GGUF" else None
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
        found = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
        if len(found) > 1:
            raise CheckpointError(f"{path}: holds {len(found)} .gguf files ({', '.join(found)}); "
                                  f"pass the one to load")
        if found:
            return os.path.join(path, found[0])
    return None


def open_gguf(path: str) -> "GGUFCheckpoint":
    """The file opened once per (path, size, mtime): the model and its tokenizer read the
    same file."""
    st = os.stat(path)
    return _open_cached(os.path.realpath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _open_cached(path: str, size: int, mtime_ns: int) -> "GGUFCheckpoint":
    return GGUFCheckpoint(path)


class GGUFCheckpoint:
    """One opened GGUF file: metadata fields, config, tensors."""

    def __init__(self, path: str):
        self.path = path
        try:
            self.reader = GGUFFile(path)
        except (ValueError, OSError) as e:
            raise CheckpointError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e}); "
                                  f"truncated or corrupt?") from None
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.arch = self.field("general.architecture")

    def _check_architecture(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise CheckpointError(f"{self.path}: architecture {self.arch!r} is not supported; "
                                  f"supported: {', '.join(ARCHITECTURES)}")

    def field(self, key: str, default=None):
        return self.reader.fields.get(key, default)

    def _arch_field(self, key: str, default=None, required: bool = False):
        value = self.field(f"{self.arch}.{key}", default)
        if value is None and required:
            raise CheckpointError(f"{self.path}: metadata field {self.arch}.{key!r} is missing")
        return value

    def config(self) -> ModelConfig:
        self._check_architecture()
        try:
            return self._config()
        except (TypeError, ValueError) as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"{self.path}: unsupported or invalid metadata ({e}); per-layer head counts "
                                  f"and other non-scalar fields are not supported") from None

    def _config(self) -> ModelConfig:
        hf_arch, _ = ARCHITECTURES[self.arch]
        hidden = int(self._arch_field("embedding_length", required=True))
        heads = int(self._arch_field("attention.head_count", required=True))
        kv_heads = self._arch_field("attention.head_count_kv", heads)
        head_dim = self._arch_field("attention.key_length") or self._arch_field("rope.dimension_count")
        vocab = self._arch_field("vocab_size")
        if vocab is None and "token_embd.weight" in self.tensors:
            vocab = int(self.tensors["token_embd.weight"].shape[1])
        if not vocab:
            raise CheckpointError(f"{self.path}: no {self.arch}.vocab_size and no token_embd.weight tensor")
        scaling = self._rope_scaling()
        eos = self.field("tokenizer.ggml.eos_token_id")
        window = self._arch_field("attention.sliding_window")
        return ModelConfig(
            vocab_size=int(vocab), hidden_size=hidden,
            intermediate_size=int(self._arch_field("feed_forward_length", required=True)),
            num_hidden_layers=int(self._arch_field("block_count", required=True)),
            num_attention_heads=heads, num_key_value_heads=int(kv_heads),
            head_dim=int(head_dim or hidden // heads),
            max_position_embeddings=int(self._arch_field("context_length", 2048)),
            rms_norm_eps=float(self._arch_field("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(self._arch_field("rope.freq_base", 10000.0)),
            rope_scaling=scaling,
            attention_bias="blk.0.attn_q.bias" in self.tensors,
            tie_word_embeddings="output.weight" not in self.tensors,
            sliding_window=int(window) if window else None,
            architecture=hf_arch,
            eos_token_ids=[] if eos is None else [int(eos)],
            bos_token_id=self.field("tokenizer.ggml.bos_token_id"),
        )

    def _rope_scaling(self) -> Optional[dict]:
        kind = self._arch_field("rope.scaling.type")
        if "rope_freqs.weight" in self.tensors:
            raise CheckpointError(f"{self.path}: per-frequency rope factors (rope_freqs, Llama-3.1 style) "
                                  f"are not supported in GGUF files; load the HF checkpoint instead")
        if kind in (None, "none"):
            return None
        if kind != "linear":
            raise CheckpointError(f"{self.path}: rope scaling {kind!r} is not supported in GGUF files "
                                  f"(supported: linear)")
        return {"rope_type": "linear", "factor": float(self._arch_field("rope.scaling.factor", 1.0))}

    def state_dict(self, cfg: ModelConfig, expected: Dict[str, torch.Size], dtype: torch.dtype,
                   compact: bool = False, quantization: str = "none") -> Dict[str, object]:
        """The tensors named in ``expected`` (HF names), dequantized to ``dtype`` - or, with
        ``compact``, 2-D matrices in bfloat16 (rounded from the dequantized values).

        ``quantization`` (see ``resolve_quantization``): "none" as above; a format name
        ("q8_0", ...): the projection matrices and the lm_head (for tied embeddings, also
        from ``token_embd``, the embedding itself staying float) as ``QuantizedMatrix`` in
        that format - the file's own blocks where it already is in it, else requantized
        from the dequantized values; "file": each of them in its own file format where that
        runs fast on this CPU (``ops.quantized.runs_fast``), the others float as with "none"."""
        self._check_architecture()
        _, permuted = ARCHITECTURES[self.arch]
        state = {}
        for gguf_name, t in self.tensors.items():
            name = self._hf_name(gguf_name)
            if name is None or name not in expected:
                continue
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            if shape != tuple(expected[name]):
                raise CheckpointError(f"{self.path}: tensor {gguf_name!r} has shape {list(shape)}, "
                                      f"expected {list(expected[name])} for {name}")
            heads = None
            if permuted and name.endswith(("q_proj.weight", "k_proj.weight")):
                heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            own = format_of_gguf_type(t.tensor_type.name)
            kept = own if runs_fast(own) else None   # "file" keeps what runs fast here
            quantize = quantization != "none" and _is_matrix(name, cfg) and (quantization != "file" or kept is not None)
            w = None
            if quantize:
                fmt = kept if quantization == "file" else quantization
                if own == fmt:   # the file's blocks, rows unpermuted like the values'
                    qm = QuantizedMatrix.from_blocks(self._blocks(gguf_name, heads), fmt, shape[1])
                else:
                    w = self._values(gguf_name, heads)
                    qm = QuantizedMatrix.quantize(w, fmt)
                qname = "lm_head.weight" if name == "model.embed_tokens.weight" else name
                state[qname] = qm
                if qname == name:
                    continue
                if own == fmt:   # a tied embedding reads its rows from the lm_head's blocks
                    state[name] = qm
                    continue
            if name == "model.embed_tokens.weight" and quantization != "none" and own is not None:
                state[name] = QuantizedMatrix.from_blocks(self._blocks(gguf_name, None), own, shape[1])
                continue
            if w is None:
                w = self._values(gguf_name, heads)
            keep = compact and w.dim() == 2 and not quantize
            state[name] = w.to(torch.bfloat16 if keep else dtype)
        missing = [n for n in expected if n not in state and not (n == "lm_head.weight" and cfg.tie_word_embeddings)]
        if missing:
            raise CheckpointError(f"{self.path}: missing tensor for {missing[0]!r}"
                                  + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        return state

    def _values(self, gguf_name: str, heads: Optional[int]) -> torch.Tensor:
        """A tensor dequantized to float32, Q/K rows unpermuted when ``heads`` is given."""
        w = torch.from_numpy(self.tensor(gguf_name))
        return w if heads is None else unpermute_rotary(w, heads)

    def _blocks(self, gguf_name: str, heads: Optional[int]) -> np.ndarray:
        """A quantized tensor's raw blocks (rows, bytes per row), rows unpermuted like ``_values``."""
        t = self.tensors[gguf_name]
        rows = int(t.shape.tolist()[-1])
        blocks = torch.from_numpy(np.array(t.data, dtype=np.uint8).reshape(rows, -1))   # a copy: mapped read-only
        return (blocks if heads is None else unpermute_rotary(blocks, heads)).numpy()

    def file_formats(self, cfg: ModelConfig) -> set:
        """The native formats (or GGUF type names where there is none) of the layers' matrices."""
        found = set()
        for gguf_name, t in self.tensors.items():
            name = self._hf_name(gguf_name)
            if name is not None and name.startswith("model.layers.") and _is_matrix(name, cfg):
                found.add(format_of_gguf_type(t.tensor_type.name) or t.tensor_type.name)
        return found

    @staticmethod
    def _hf_name(gguf_name: str) -> Optional[str]:
        if gguf_name in _GLOBAL_TENSORS:
            return _GLOBAL_TENSORS[gguf_name]
        parts = gguf_name.split(".", 2)
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS:
            return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}"
        return None

    def tensor(self, name: str) -> np.ndarray:
        """One tensor (GGUF name) dequantized to float32, in the HF (rows, cols) shape."""
        import gguf
        t = self.tensors[name]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))   # GGUF lists dimensions fastest first
        try:
            values = gguf.dequantize(t.data, t.tensor_type)
        except (NotImplementedError, KeyError, ValueError) as e:
            raise CheckpointError(f"{self.path}: tensor {t.name!r} has type {t.tensor_type.name}, which "
                                  f"cannot be dequantized ({e or 'not implemented by gguf'})") from None
        return np.array(values, dtype=np.float32).reshape(shape)   # a copy: the file is mapped read-only

    def fingerprint_bytes(self) -> bytes:
        """The metadata and tensor index plus the first MiB of tensor data: changes with the file."""
        start = min((int(t.data_offset) for t in self.reader.tensors), default=len(self.reader.data))
        return bytes(self.reader.data[:start + (1 << 20)])


def _is_matrix(name: str, cfg: ModelConfig) -> bool:
    """Whether an HF tensor name is a linear layer's weight matrix (a projection, the
    lm_head, or the embedding when the lm_head is tied to it)."""
    return (name.endswith("_proj.weight") or name == "lm_head.weight"
            or (name == "model.embed_tokens.weight" and cfg.tie_word_embeddings))


def unpermute_rotary(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's converter permutation: per head, its rows were reordered from
    the HF rotate-half layout (first half, second half) to interleaved pairs."""
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)

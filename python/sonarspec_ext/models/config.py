"""Model configuration read from a Hugging Face ``config.json``."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class CheckpointError(ValueError):
    """A model directory is missing a file, or a file is corrupt or mis-shaped."""


@dataclass
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: Optional[int] = None
    architecture: str = "LlamaForCausalLM"
    eos_token_ids: list = field(default_factory=list)
    bos_token_id: Optional[int] = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim", "max_position_embeddings"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise CheckpointError(f"{name} must be a positive integer, got {v!r}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise CheckpointError(f"rms_norm_eps and rope_theta must be positive, got {self.rms_norm_eps!r} and "
                                  f"{self.rope_theta!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise CheckpointError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        rope_type = (self.rope_scaling or {}).get("rope_type", (self.rope_scaling or {}).get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise CheckpointError(f"rope_scaling type {rope_type!r} is not supported; "
                                  f"supported: {SUPPORTED_ROPE_TYPES}")

    @property
    def num_params(self) -> int:
        h, i, L = self.hidden_size, self.intermediate_size, self.num_hidden_layers
        q = self.num_attention_heads * self.head_dim
        kv = self.num_key_value_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
        emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return L * per_layer + emb + h

    def to_hf_dict(self) -> dict:
        """The ``config.json`` contents for this configuration (Llama layout)."""
        d = {
            "architectures": [self.architecture],
            "model_type": {"Qwen2ForCausalLM": "qwen2", "MistralForCausalLM": "mistral"}.get(
                self.architecture, "llama"),
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling, "attention_bias": self.attention_bias,
            "tie_word_embeddings": self.tie_word_embeddings, "hidden_act": "silu",
            "torch_dtype": "float32",
        }
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_ids:
            d["eos_token_id"] = self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else self.eos_token_ids
        return d

    @classmethod
    def from_hf_dict(cls, d: dict, source: str = "config.json") -> "ModelConfig":
        if not isinstance(d, dict):
            raise CheckpointError(f"{source}: expected a JSON object, got a {type(d).__name__}")
        archs = d.get("architectures") or ["LlamaForCausalLM"]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise CheckpointError(f"{source}: architecture {arch!r} is not supported; "
                                  f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        if d.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{source}: hidden_act {d['hidden_act']!r} is not supported (only 'silu')")
        try:
            heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            eos = d.get("eos_token_id")
            window = d.get("sliding_window") if d.get("use_sliding_window", arch == "MistralForCausalLM") else None
            return cls(
                vocab_size=int(d["vocab_size"]), hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]), num_attention_heads=heads,
                num_key_value_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(d.get("rope_theta", (d.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
                rope_scaling=_rope_scaling(d),
                attention_bias=bool(d.get("attention_bias", arch == "Qwen2ForCausalLM")),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                sliding_window=int(window) if window else None,
                architecture=arch,
                eos_token_ids=[] if eos is None else _token_ids(eos, f"{source}: eos_token_id"),
                bos_token_id=d.get("bos_token_id"),
            )
        except KeyError as e:
            raise CheckpointError(f"{source}: missing required field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"{source}: invalid value: {e}") from None

    @classmethod
    def from_dir(cls, path: str) -> "ModelConfig":
        f = os.path.join(path, "config.json")
        if not os.path.isfile(f):
            raise CheckpointError(f"{f}: file not found (not a Hugging Face model directory?)")
        try:
            with open(f) as fh:
                d = json.load(fh)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{f}: not valid JSON ({e})") from None
        cfg = cls.from_hf_dict(d, source=f)
        gen = os.path.join(path, "generation_config.json")
        if os.path.isfile(gen):
            try:
                with open(gen) as fh:
                    eos = json.load(fh).get("eos_token_id")
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{gen}: not valid JSON ({e})") from None
            if eos is not None:
                cfg.eos_token_ids = _token_ids(eos, f"{gen}: eos_token_id")
        return cfg


def _token_ids(value, what: str) -> list:
    """A token id or a list of them, as config files write eos_token_id."""
    values = [value] if not isinstance(value, (list, tuple)) else list(value)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise CheckpointError(f"{what} must be a token id or a list of token ids, got {value!r}")
    return values


def _rope_scaling(d: dict) -> Optional[dict]:
    rs = d.get("rope_scaling") or d.get("rope_parameters")
    if not rs:
        return None
    rs = dict(rs)
    if rs.get("rope_type", rs.get("type", "default")) == "default":
        return None
    return rs

"""Load and save MTP heads in three layouts, detected from the tensor names.

- ``sonarspec``: our format. ``config.json`` (Llama fields with ``num_hidden_layers`` the
  head's decoder layers, ``architectures: ["SonarspecMTPHead"]``, ``mtp_layout``, optional
  ``feature_layers``), tensors ``enorm``, ``hnorm``, ``fc``, ``layer.*`` (the first decoder
  layer), ``layers.N.*`` (the N-th, N >= 1, of a deeper head), ``norm`` (the norms absent in
  the eagle1 layout), and ``fusion.*`` for a head that reads intermediate target layers.
- ``eagle1``: published EAGLE-1 heads: ``fc.weight``, ``fc.bias``, ``layers.0.*`` without
  ``input_layernorm``; ``config.json`` is a one-layer Llama config.
- ``deepseek``: a DeepSeek-V3 MTP layer ``model.layers.{L}.{enorm,hnorm,eh_proj,
  shared_head.norm,<decoder block>}``, inside the target checkpoint or on its own.
"""
from __future__ import annotations

import json
import os
import re
from typing import Dict, Optional, Tuple

import torch
from safetensors.torch import save_file

from .config import CheckpointError, ModelConfig
from ..layers.linear import Linear
from ..ops.quantized import QuantizedMatrix
from .loader import parse_dtype, resolve_quantization
from .safetensors_files import load_state, weight_files
from .mtp import MAX_LAYERS, MTPHead
from .weight_arena import pack_weights

ARCHITECTURE = "SonarspecMTPHead"
DRAFT_VOCAB = "draft_vocab"   # optional (sonarspec format): token ids the head proposes
_DEEPSEEK = re.compile(r"^model\.layers\.(\d+)\.eh_proj\.weight$")


def detect_format(names) -> Tuple[str, Optional[int]]:
    """('sonarspec' | 'eagle1' | 'deepseek', L or None) from a checkpoint's tensor names."""
    names = set(names)
    for n in names:
        m = _DEEPSEEK.match(n)
        if m:
            return "deepseek", int(m.group(1))
    if any(n.startswith("midlayer.") for n in names):
        raise CheckpointError("EAGLE-3 heads (midlayer.*, d2t) are not supported; supported layouts: "
                              "sonarspec, EAGLE-1, DeepSeek-V3 MTP")
    if "fc.weight" in names and any(n.startswith("layers.0.") for n in names):
        return "eagle1", None
    if "fc.weight" in names and any(n.startswith("layer.") for n in names):
        return "sonarspec", None
    raise CheckpointError("no MTP head found: expected EAGLE-1 (fc.weight, layers.0.*), DeepSeek-V3 "
                          "(model.layers.L.eh_proj.weight) or sonarspec (fc.weight, layer.*) tensors")


def _key_map(fmt: str, layer: Optional[int], head: MTPHead) -> Dict[str, str]:
    """Head parameter name -> checkpoint tensor name."""
    out = {}
    for name, _ in head.named_parameters():
        if fmt == "sonarspec":   # the first layer keeps the one-layer heads' name, "layer."
            key = "layer." + name[len("layers.0."):] if name.startswith("layers.0.") else name
        elif fmt == "eagle1":
            key = name
        else:
            p = f"model.layers.{layer}."
            key = {"fc.weight": p + "eh_proj.weight", "norm.weight": p + "shared_head.norm.weight"}.get(
                name, p + (name[len("layers.0."):] if name.startswith("layers.0.") else name))
        out[name] = key
    return out


def _read_config(path: str) -> dict:
    f = os.path.join(path, "config.json")
    if not os.path.isfile(f):
        raise CheckpointError(f"{f}: file not found (an MTP head directory needs a config.json)")
    try:
        with open(f) as fh:
            return json.load(fh)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{f}: not valid JSON ({e})") from None


def head_config(path: str, target_cfg: ModelConfig) -> Tuple[ModelConfig, str, Optional[int], str, Tuple[int, ...]]:
    """(the head's config - its decoder layers as ``num_hidden_layers`` -, format, DeepSeek
    layer index, layout, target layers it reads besides the final states) of the head
    stored in ``path``."""
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: MTP head directory not found")
    fmt, layer = detect_format(weight_files(path))
    d = dict(_read_config(path))
    d["architectures"] = ["LlamaForCausalLM"]   # the decoder block is Llama-style in every layout
    d.setdefault("vocab_size", target_cfg.vocab_size)
    cfg = ModelConfig.from_hf_dict(d, source=os.path.join(path, "config.json"))
    if fmt != "sonarspec":
        cfg.num_hidden_layers = 1   # one-layer layouts (their config may be the target's)
    elif cfg.num_hidden_layers > MAX_LAYERS:
        raise CheckpointError(f"{path}: num_hidden_layers (the head's decoder layers) must be at most {MAX_LAYERS}, "
                              f"got {cfg.num_hidden_layers}")
    layout = d.get("mtp_layout", "eagle1" if fmt == "eagle1" else "rmsnorm")
    if cfg.hidden_size != target_cfg.hidden_size:
        raise CheckpointError(f"{path}: MTP head hidden size {cfg.hidden_size} does not match the target's "
                              f"{target_cfg.hidden_size}")
    if cfg.vocab_size != target_cfg.vocab_size:
        raise CheckpointError(f"{path}: MTP head was made for a vocabulary of {cfg.vocab_size} tokens, the "
                              f"target has {target_cfg.vocab_size}")
    feature_layers = d.get("feature_layers") or []
    if (not isinstance(feature_layers, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                                       for x in feature_layers)
            or any(not 0 <= x < target_cfg.num_hidden_layers for x in feature_layers)
            or len(set(feature_layers)) != len(feature_layers)):
        raise CheckpointError(f"{path}: feature_layers must list distinct target layer indices in "
                              f"[0, {target_cfg.num_hidden_layers}), got {feature_layers!r}")
    return cfg, fmt, layer, layout, tuple(feature_layers)


def read_mtp_head(path: str, target_cfg: ModelConfig, dtype="float32", compact_weights: bool = True) -> MTPHead:
    """The head stored in ``path`` (any supported layout) on the CPU, as trained: unbound,
    projections unfused; ``compact_weights`` as in ``models.loader.load_model``."""
    cfg, fmt, layer, layout, feature_layers = head_config(path, target_cfg)
    torch_dtype = parse_dtype(dtype)
    with torch.device("meta"):
        head = MTPHead(cfg, layout, feature_layers)
    keys = _key_map(fmt, layer, head)
    files = weight_files(path)
    if fmt == "deepseek" and f"model.layers.{layer}.self_attn.q_proj.weight" not in files:
        raise CheckpointError(f"{path}: DeepSeek MTP layer {layer} has no self_attn.q_proj; only Llama-style "
                              f"decoder blocks are supported (not MLA / MoE)")
    shapes = {keys[n]: p.shape for n, p in head.named_parameters()}
    _check_shared(path, fmt, layer, files, target_cfg)
    compact = compact_weights and torch_dtype == torch.float32
    state = load_state(path, shapes, torch_dtype, keep_bf16_matrices=compact)
    head.load_state_dict({n: state[k] for n, k in keys.items()}, strict=True, assign=True)
    if fmt == "sonarspec" and DRAFT_VOCAB in files:
        n = int(_read_config(path).get("draft_vocab_size", -1))
        vocab = load_state(path, {DRAFT_VOCAB: torch.Size([n])}, torch.int64)[DRAFT_VOCAB]
        head.set_draft_vocab(vocab)
    return head


def load_mtp_head(path: str, target, dtype="float32", device="cpu", compact_weights: bool = True,
                  quantization: str = "none") -> MTPHead:
    """Loads the head in ``path`` (any supported layout) and binds it to ``target``;
    ``compact_weights`` as in ``models.loader.load_model``; ``quantization``: "none" or
    "auto" (float heads stay float), or a block format for its input projection and layer
    (the lm_head rows are the target's, in the target's format)."""
    compact = compact_weights and torch.device(device).type == "cpu"
    head = read_mtp_head(path, target.config, dtype, compact).to(device).eval().requires_grad_(False)
    quant = resolve_quantization(quantization, path, device, dtype)
    if quant not in ("none", "file"):
        for module in head.modules():
            if isinstance(module, Linear):
                w = module.weight
                del module._parameters["weight"]
                module.weight = QuantizedMatrix.quantize(w, quant)
    head.fuse_projections()
    head.bind(target)
    if torch.device(device).type == "cpu":
        pack_weights(head)   # its own weights (and draft-vocabulary rows); the target's stay where they are
    return head


def _check_shared(path, fmt, layer, files, target_cfg) -> None:
    """Checkpoints that carry a copy of the embedding / lm_head must match the target's vocabulary."""
    copies = {"eagle1": ["embed_tokens.weight"],
              "deepseek": [f"model.layers.{layer}.embed_tokens.weight", f"model.layers.{layer}.shared_head.head.weight"]
              }.get(fmt, [])
    from safetensors import safe_open
    for name in copies:
        if name in files:
            with safe_open(files[name], framework="pt") as f:
                shape = f.get_slice(name).get_shape()
            if tuple(shape) != (target_cfg.vocab_size, target_cfg.hidden_size):
                raise CheckpointError(f"{path}: {name} has shape {list(shape)} but the target's embedding is "
                                      f"{[target_cfg.vocab_size, target_cfg.hidden_size]}: the head belongs to "
                                      f"another vocabulary")


def save_mtp_head(head: MTPHead, path: str, fmt: str = "sonarspec", dtype="float32",
                  target_num_layers: Optional[int] = None, extra_config: Optional[dict] = None) -> None:
    """Writes ``config.json`` + ``model.safetensors`` in ``fmt`` (sonarspec, eagle1 or deepseek;
    eagle1 needs the eagle1 layout, deepseek the rmsnorm layout and the target's layer count,
    which names the layer). Never the shared tensors."""
    if fmt != "sonarspec" and head.feature_layers:
        raise ValueError(f"a head that reads intermediate target layers has no {fmt} layout; save it as sonarspec")
    if fmt == "eagle1" and head.layout != "eagle1" or fmt == "deepseek" and head.layout != "rmsnorm":
        raise ValueError(f"a {head.layout} head cannot be written in the {fmt} layout")
    if fmt not in ("sonarspec", "eagle1", "deepseek"):
        raise ValueError(f"unknown MTP head format {fmt!r}")
    if fmt != "sonarspec" and len(head.layers) != 1:
        raise ValueError(f"the {fmt} layout holds one decoder layer, this head has {len(head.layers)}; "
                         f"save it as sonarspec")
    torch_dtype = parse_dtype(dtype)
    if fmt == "deepseek" and not target_num_layers:
        raise ValueError("the deepseek layout names the layer after the target's: pass target_num_layers")
    keys = _key_map(fmt, target_num_layers, head)
    state = {keys[n]: p.detach().to(torch_dtype).contiguous().clone() for n, p in head.named_parameters()}
    if fmt == "sonarspec" and head.draft_vocab is not None:
        state[DRAFT_VOCAB] = head.draft_vocab.cpu().contiguous()
    d = head.config.to_hf_dict()
    d["torch_dtype"] = str(torch_dtype).replace("torch.", "")
    if fmt == "sonarspec":
        d.update(architectures=[ARCHITECTURE], mtp_layout=head.layout)
        if head.feature_layers:
            d["feature_layers"] = list(head.feature_layers)
        if head.draft_vocab is not None:
            d["draft_vocab_size"] = int(head.draft_vocab.numel())
    elif fmt == "deepseek":
        d.update(num_hidden_layers=target_num_layers, num_nextn_predict_layers=1)
    d.update(extra_config or {})
    os.makedirs(path, exist_ok=True)
    tmp = os.path.join(path, "model.safetensors.tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(d, fh, indent=2)

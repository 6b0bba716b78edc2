"""Safetensors checkpoints on disk: which file holds each tensor (single or sharded, the
index checked), and the tensors a model expects read from them, checked and converted."""
from __future__ import annotations

import json
import os
from typing import Dict

import torch
from safetensors import SafetensorError, safe_open

from .config import CheckpointError


def weight_files(path: str) -> Dict[str, str]:
    """Map of tensor name -> safetensors file holding it."""
    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as fh:
                weight_map = json.load(fh)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: weight_map must be an object of tensor name -> file")
        root = os.path.realpath(path)
        files = {}
        for name, f in weight_map.items():
            full = os.path.realpath(os.path.join(path, f))
            if not isinstance(f, str) or os.path.commonpath([root, full]) != root:
                raise CheckpointError(f"{index}: tensor {name!r} points at {f!r}, outside the model directory")
            files[name] = full
        return files
    if os.path.isfile(single):
        try:
            with safe_open(single, framework="pt") as f:
                return {name: single for name in f.keys()}
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{single}: corrupt or truncated safetensors file ({e})") from None
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json found")


def load_state(path: str, expected: Dict[str, torch.Size], dtype: torch.dtype,
               keep_bf16_matrices: bool = False) -> Dict[str, torch.Tensor]:
    """Read the tensors named in ``expected`` from a model dir, memory-mapped file by file,
    checking presence and shape, converted to ``dtype`` - except, with
    ``keep_bf16_matrices``, 2-D tensors stored in bfloat16, which stay bfloat16."""
    files = weight_files(path)
    missing = [n for n in expected if n not in files]
    if missing:
        raise CheckpointError(f"{path}: missing tensor {missing[0]!r}"
                              + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    by_file: Dict[str, list] = {}
    for name in expected:
        by_file.setdefault(files[name], []).append(name)
    state = {}
    for fname, names in by_file.items():
        if not os.path.isfile(fname):
            raise CheckpointError(f"{fname}: file not found (listed in the safetensors index)")
        try:
            with safe_open(fname, framework="pt") as f:
                keys = set(f.keys())
                for name in names:
                    if name not in keys:
                        raise CheckpointError(f"{fname}: missing tensor {name!r} (listed in the index)")
                    shape = tuple(f.get_slice(name).get_shape())
                    if shape != tuple(expected[name]):
                        raise CheckpointError(f"{fname}: tensor {name!r} has shape {list(shape)}, "
                                              f"expected {list(expected[name])}")
                    t = f.get_tensor(name)
                    if not t.dtype.is_floating_point and name.endswith(("weight", "bias")):
                        raise CheckpointError(f"{fname}: tensor {name!r} has dtype {t.dtype}; only float tensors "
                                              f"load from safetensors (quantized weights: use a GGUF file)")
                    keep = keep_bf16_matrices and t.dtype == torch.bfloat16 and t.dim() == 2
                    state[name] = t if keep else t.to(dtype)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise CheckpointError(f"{fname}: corrupt or truncated safetensors file ({e})") from None
    return state

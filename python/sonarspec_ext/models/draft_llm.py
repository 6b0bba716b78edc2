"""Draft models for draft_target speculation, including ones that share their target's
embedding and propose from a draft vocabulary.

A checkpoint whose ``config.json`` says ``"shared_embedding": "target"`` saves neither the
token embedding nor the tied lm_head: both are the target's, bound at load by reference.
With a ``draft_vocab`` tensor in ``model.safetensors`` (``draft_vocab_size`` in the config)
the draft computes logits for those rows of the lm_head only - the target's rows, in the
target's weight format, for a shared embedding - and proposes only those tokens
(``LlamaForCausalLM.use_draft_vocab``). Verification stays exact over the full vocabulary.
"""
from __future__ import annotations

import json
import os

import torch

from safetensors.torch import save_file

from .config import CheckpointError
from .gguf import gguf_file
from .llama import LlamaForCausalLM, is_ascending
from .loader import SHARED_KEYS, load_config, load_model, parse_dtype
from .safetensors_files import load_state, weight_files

DRAFT_VOCAB = "draft_vocab"
__all__ = ["DRAFT_VOCAB", "load_draft_model", "save_draft_model", "shares_embedding"]


def shares_embedding(path: str) -> bool:
    """Whether the draft checkpoint at ``path`` takes its embedding from its target."""
    if gguf_file(path):
        return False
    try:
        with open(os.path.join(path, "config.json")) as fh:
            shared = json.load(fh).get("shared_embedding")
    except (OSError, ValueError):
        return False
    if shared not in (None, "target"):
        raise CheckpointError(f"{path}/config.json: shared_embedding must be \"target\", got {shared!r}")
    return shared == "target"


def save_draft_model(model: LlamaForCausalLM, path: str, draft_vocab=None, dtype="bfloat16") -> None:
    """Writes ``model`` as a draft sharing its target's embedding and lm_head (neither is
    saved): ``config.json`` and ``model.safetensors`` with ``draft_vocab`` (ascending token
    ids, or None: the whole vocabulary). Tokenizer files are the caller's."""
    if draft_vocab is not None:
        draft_vocab = torch.as_tensor(draft_vocab, dtype=torch.int64).contiguous()
        if not is_ascending(draft_vocab):
            raise ValueError("draft_vocab must hold ascending token ids")
    os.makedirs(path, exist_ok=True)
    torch_dtype = parse_dtype(dtype)
    state = {n: p.detach().to(torch_dtype).contiguous().clone() for n, p in model.named_parameters()
             if n not in SHARED_KEYS}
    if draft_vocab is not None:
        state[DRAFT_VOCAB] = draft_vocab
    save_file(state, os.path.join(path, "model.safetensors.tmp"), metadata={"format": "pt"})
    os.replace(os.path.join(path, "model.safetensors.tmp"), os.path.join(path, "model.safetensors"))
    d = model.config.to_hf_dict()
    d.update(torch_dtype=str(torch_dtype).replace("torch.", ""), shared_embedding="target", tie_word_embeddings=True)
    if draft_vocab is not None:
        d["draft_vocab_size"] = int(draft_vocab.numel())
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(d, fh, indent=2)


def load_draft_model(path: str, target: LlamaForCausalLM, dtype="float32", device="cpu",
                     quantization: str = "none") -> LlamaForCausalLM:
    """The draft model at ``path`` for ``target`` (``models.loader.load_model`` otherwise)."""
    shared = shares_embedding(path)
    hidden = load_config(path).hidden_size
    if shared and hidden != target.config.hidden_size:
        raise CheckpointError(f"{path}: a draft sharing its target's embedding needs the target's hidden size "
                              f"{target.config.hidden_size}, got {hidden}")
    embedding = target.model.embed_tokens.weight if shared else None
    model = load_model(path, dtype, device, quantization=quantization, embedding=embedding)
    lm_head = target.lm_head if shared else model.lm_head
    if not gguf_file(path) and DRAFT_VOCAB in weight_files(path):
        with open(os.path.join(path, "config.json")) as fh:
            n = int(json.load(fh).get("draft_vocab_size", -1))
        ids = load_state(path, {DRAFT_VOCAB: torch.Size([n])}, torch.int64)[DRAFT_VOCAB]
        try:
            model.use_draft_vocab(ids.to(model.model.norm.weight.device), lm_head.weight)
        except ValueError as e:
            raise CheckpointError(f"{path}: {e}") from None
    elif shared:
        model.lm_head = lm_head
    return model

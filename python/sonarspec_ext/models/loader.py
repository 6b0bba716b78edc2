"""Load and save checkpoints: Hugging Face model directories (config + safetensors, single or
sharded) and GGUF files (``models.gguf``), chosen by the path."""
from __future__ import annotations

import json
import os
from typing import Dict, Optional

import torch
from safetensors.torch import save_file

from .config import CheckpointError, ModelConfig
from ..ops.host_memory import return_freed_memory
from ..ops.quantized import QuantizedMatrix, runs_fast
from ..params import QUANTIZATION_CHOICES
from .gguf import gguf_file, open_gguf
from .llama import LlamaForCausalLM
from .safetensors_files import load_state, weight_files
from .tokenizer import Tokenizer
from .weight_arena import pack_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


SHARED_KEYS = ("model.embed_tokens.weight", "lm_head.weight")   # what a draft sharing its target's embedding omits


def parse_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise ValueError(f"dtype {dtype!r} is not supported; choose one of {sorted(DTYPES)}")


def load_config(path: str) -> ModelConfig:
    """The configuration of a checkpoint: an HF directory or a GGUF file (or a directory holding one)."""
    f = gguf_file(path)
    return open_gguf(f).config() if f else ModelConfig.from_dir(path)


def load_tokenizer(path: str) -> Tokenizer:
    """The tokenizer of a checkpoint: ``tokenizer.json`` of an HF directory, or a GGUF file's metadata."""
    f = gguf_file(path)
    if f:
        from .gguf_tokenizer import tokenizer_from_gguf
        return tokenizer_from_gguf(open_gguf(f))
    return Tokenizer.from_dir(path)


def has_compact_weights(model: torch.nn.Module) -> bool:
    """Whether ``model`` keeps bfloat16 or block-quantized weight matrices (``load_model``'s
    compact weights or quantization, or a bfloat16 model)."""
    return bool(quantized_formats(model)) or any(p.dtype == torch.bfloat16 and p.dim() == 2
                                                  for p in model.parameters())


def quantized_formats(model: torch.nn.Module) -> set:
    """The formats of the model's ``QuantizedMatrix`` weights (empty: none)."""
    return {m.weight.format for m in model.modules() if isinstance(getattr(m, "weight", None), QuantizedMatrix)}


def resolve_quantization(quantization: str, path: str, device="cpu", dtype=torch.float32) -> str:
    """What ``load_model`` does with ``quantization``: "none" (float weights), a format
    name (every projection and the lm_head in it) or "file" (a GGUF file's own formats).

    "auto": a GGUF file with layer matrices in natively run formats (Q8_0, Q4_0, Q4_1, Q4_K,
    Q5_K, Q6_K) keeps those ("file") where a SIMD kernel runs them (``ops.quantized.runs_fast``:
    AVX-512 VNNI or AVX2), its other matrices loading as float; a
    file with none loads float weights. Block formats run on the CPU with float32
    activations: elsewhere "auto" means "none" and a format is an error."""
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(f"quantization {quantization!r} is not supported; choose one of "
                         f"{', '.join(QUANTIZATION_CHOICES)}")
    runs = torch.device(device).type == "cpu" and parse_dtype(dtype) == torch.float32
    if quantization == "auto":
        # portable block loops are far slower than bfloat16's kernels
        f = gguf_file(path) if runs else None
        if f is None:
            return "none"
        ckpt = open_gguf(f)
        formats = ckpt.file_formats(ckpt.config())
        return "file" if any(runs_fast(f) for f in formats) else "none"
    if quantization != "none" and not runs:
        raise ValueError(f"quantization {quantization!r} runs on the CPU with float32 activations, "
                         f"not on {device} with {dtype}")
    return quantization


LOAD_FORMATS = ("auto", "dummy")


def load_model(path: str, dtype="float32", device="cpu", compact_weights: bool = True,
               quantization: str = "none", embedding: Optional[torch.Tensor] = None,
               load_format: str = "auto") -> LlamaForCausalLM:
    """Build a model from an HF-format directory or a GGUF file (quantized tensors are
    dequantized at load); parameters land directly in ``dtype``.

    ``compact_weights`` (float32 on the CPU): weight matrices stored in bfloat16 - and a
    GGUF file's matrices, whatever their type - are kept in bfloat16 and their matrix
    products take bfloat16-rounded activations with float32 sums (the native GEMM's
    bfloat16 dot products): half the memory and memory traffic of float32 copies and about
    twice their multiply-add rate. The residual stream, norms, attention and logits stay
    float32. ``compact_weights=False`` keeps float32 copies and float32 activations
    throughout.

    ``quantization`` (``resolve_quantization``): the projections and the lm_head as
    ``ops.quantized.QuantizedMatrix`` (a tied lm_head gets its own quantized copy of the
    embedding, which stays float32 for lookups); the native GEMM quantizes activations to
    int8 per block of 32. Quantized models are inference-only.

    ``embedding``: the token embedding (and tied lm_head) of a checkpoint that leaves them
    out - a draft model sharing its target's (``models.draft_llm``); used by reference.

    ``load_format="dummy"`` (benchmarks, as vLLM's): the directory's ``config.json`` (a
    GGUF file's metadata) with random weights made on ``device`` (matrices ~ N(0, 0.02),
    norm weights 1, biases 0; seeded), no weight file read - a model of any size without
    its checkpoint."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {load_format!r}")
    torch_dtype = parse_dtype(dtype)
    if load_format == "dummy":
        f = gguf_file(path)
        cfg = open_gguf(f).config() if f else ModelConfig.from_dir(path)
        model, expected = _empty_model(cfg)
        return _assemble(model, cfg, _random_state(expected, torch_dtype, device), device)
    compact = compact_weights and torch_dtype == torch.float32 and torch.device(device).type == "cpu"
    quant = resolve_quantization(quantization, path, device, dtype)
    f = gguf_file(path)
    if f and embedding is not None:
        raise CheckpointError(f"{f}: a GGUF checkpoint holds its own embedding (only model directories share one)")
    if f:
        ckpt = open_gguf(f)
        cfg = ckpt.config()
        model, expected = _empty_model(cfg)
        state = ckpt.state_dict(cfg, expected, torch_dtype, compact=compact, quantization=quant)
    else:
        if not os.path.isdir(path):
            raise CheckpointError(f"{path}: model directory or GGUF file not found")
        cfg = ModelConfig.from_dir(path)
        if embedding is not None:   # no lm_head of its own: tied until its user binds one
            cfg.tie_word_embeddings = True
        model, expected = _empty_model(cfg)
        if embedding is not None:
            if tuple(embedding.shape) != tuple(expected["model.embed_tokens.weight"]):
                raise CheckpointError(f"{path}: the shared embedding has shape {list(embedding.shape)}, the model "
                                      f"needs {list(expected['model.embed_tokens.weight'])}")
            for name in SHARED_KEYS:
                expected.pop(name, None)
        state = load_state(path, expected, torch_dtype, keep_bf16_matrices=compact and quant == "none")
        if quant != "none":
            _quantize_matrices(state, cfg, quant)
        if embedding is not None:
            state["model.embed_tokens.weight"] = embedding
    return _assemble(model, cfg, state, device, keep=() if embedding is None else (embedding,))


def _random_state(expected: Dict[str, torch.Size], dtype: torch.dtype, device) -> Dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    state = {}
    for name, shape in expected.items():
        t = torch.empty(shape, dtype=dtype, device=device)
        if len(shape) == 2:
            t.normal_(0.0, 0.02, generator=gen)
        else:
            t.fill_(0.0 if name.endswith(".bias") else 1.0)
        state[name] = t
    return state


def _assemble(model: LlamaForCausalLM, cfg: ModelConfig, state: Dict[str, torch.Tensor], device,
              keep=()) -> LlamaForCausalLM:
    """``model`` (on the meta device) with ``state``'s tensors, on ``device``, projections fused;
    on the CPU its weights in one huge-page arena but for ``keep`` (another model's)."""
    quantized = {n: state.pop(n) for n in list(state) if isinstance(state[n], QuantizedMatrix)}
    if cfg.tie_word_embeddings and "model.embed_tokens.weight" in quantized:   # a shared quantized embedding
        quantized.setdefault("lm_head.weight", quantized["model.embed_tokens.weight"])
    if cfg.tie_word_embeddings and "lm_head.weight" not in quantized:
        state.pop("lm_head.weight", None)
    for name in quantized:   # plain attributes in place of the parameters
        del model.get_submodule(name.rsplit(".", 1)[0])._parameters["weight"]
    model.load_state_dict(state, strict=False, assign=True)
    state.clear()   # the model holds the tensors now: per-matrix copies die as fusing and packing replace them
    if cfg.tie_word_embeddings and "lm_head.weight" not in quantized:
        model.lm_head.weight = model.model.embed_tokens.weight
    for name, w in quantized.items():
        setattr(model.get_submodule(name.rsplit(".", 1)[0]), "weight", w)
    model = model.to(device).eval().requires_grad_(False)
    model.fuse_projections()
    if torch.device(device).type == "cpu":
        pack_weights(model, keep)
        return_freed_memory()
    return model


def _quantize_matrices(state: Dict[str, torch.Tensor], cfg: ModelConfig, fmt: str) -> None:
    """Replaces the projection matrices and the lm_head (a tied one: from the embedding) by
    ``fmt`` quantizations of them."""
    for name in list(state):
        if name.endswith("_proj.weight") or name == "lm_head.weight":
            state[name] = QuantizedMatrix.quantize(state[name], fmt)
    if cfg.tie_word_embeddings and "model.embed_tokens.weight" in state:
        state["lm_head.weight"] = QuantizedMatrix.quantize(state["model.embed_tokens.weight"], fmt)


def _empty_model(cfg: ModelConfig):
    """The model on the meta device and the shapes of its parameters."""
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    return model, {n: p.shape for n, p in model.named_parameters()}


def save_model(model: LlamaForCausalLM, path: str, dtype="float32") -> None:
    """Write ``config.json`` and ``model.safetensors`` (tied lm_head omitted, as HF does)."""
    if quantized_formats(model):
        raise ValueError("save_model writes float checkpoints; this model has quantized weights "
                         "(load it with quantization='none' to save it)")
    os.makedirs(path, exist_ok=True)
    torch_dtype = parse_dtype(dtype)
    cfg = model.config
    # clone: inference models keep fused projections whose parameters share storage
    state = {n: p.detach().to(torch_dtype).contiguous().clone() for n, p in model.named_parameters()}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    d = cfg.to_hf_dict()
    d["torch_dtype"] = str(torch_dtype).replace("torch.", "")
    tmp = os.path.join(path, "model.safetensors.tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(d, fh, indent=2)
    gen = {"eos_token_id": cfg.eos_token_ids[0] if len(cfg.eos_token_ids) == 1 else cfg.eos_token_ids}
    if cfg.bos_token_id is not None:
        gen["bos_token_id"] = cfg.bos_token_id
    with open(os.path.join(path, "generation_config.json"), "w") as fh:
        json.dump(gen, fh, indent=2)


def checkpoint_fingerprint(path: str) -> str:
    """A hash of a checkpoint's config and tensor layout plus a sample of its weights:
    cheap to compute, and it changes when the checkpoint does."""
    import hashlib
    h = hashlib.sha256()
    f = gguf_file(path)
    if f:
        h.update(open_gguf(f).fingerprint_bytes())
        return h.hexdigest()[:16]
    with open(os.path.join(path, "config.json"), "rb") as fh:
        h.update(fh.read())
    for fname in sorted(set(weight_files(path).values())):
        with open(fname, "rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            h.update(fh.read(header_len))
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]

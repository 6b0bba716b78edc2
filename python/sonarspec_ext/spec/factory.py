"""Builds the proposer for a ``SpecConfig`` and checks draft/target compatibility."""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from ..assets import DRAFTS, HEADS, installed_head, path as asset_path, resolve, training_record
from ..models.config import ModelConfig
from ..models.draft_llm import load_draft_model
from ..models.gguf import gguf_file
from ..models.loader import checkpoint_fingerprint, load_config, load_tokenizer, quantized_formats
from ..models.safetensors_files import weight_files
from ..models.mtp_loader import detect_format, head_config, load_mtp_head
from ..models.tokenizer import Tokenizer
from ..params import SpecConfig
from .draft_model import DraftModelProposer
from .eagle_tree import EagleTreeProposer
from .mtp import MTPProposer
from .ngram import NgramProposer
from .proposer import NoProposer, Proposer

TREE_TOP_K, TREE_NUM_NODES = 4, 16   # eagle_tree defaults


def resolve_draft(spec: SpecConfig, target_dir: str, target_tokenizer: Tokenizer,
                  target_cfg: ModelConfig) -> Optional[Tuple[str, ModelConfig]]:
    """(directory, config) of the draft model or MTP head (checked against the target), or
    None for methods without one. An MTP head's config is its one decoder layer."""
    if spec.method in ("none", "ngram"):
        return None
    if spec.method in ("mtp", "eagle_tree"):
        head_dir = _mtp_dir(spec, target_dir)
        return head_dir, head_config(head_dir, target_cfg)[0]
    draft_dir = _draft_dir(spec, target_dir)
    draft_cfg = load_config(draft_dir)
    draft_tok = load_tokenizer(draft_dir)
    if draft_tok.fingerprint() != target_tokenizer.fingerprint():
        raise ValueError(f"draft tokenizer ({draft_dir}) differs from the target's: draft and target must "
                         f"share one vocabulary")
    needed = target_tokenizer.vocab_size
    if min(draft_cfg.vocab_size, target_cfg.vocab_size) < needed:
        raise ValueError(f"vocab sizes differ beyond embedding padding: target {target_cfg.vocab_size}, "
                         f"draft {draft_cfg.vocab_size}, tokenizer {needed}")
    return draft_dir, draft_cfg


def find_mtp_head(target_dir: str) -> Optional[str]:
    """The MTP head that goes with a target: an MTP layer inside its checkpoint
    (DeepSeek-V3 style), else - for the packaged target - the packaged head, else a
    packaged head trained for exactly this checkpoint (its ``training.json`` records the
    target's fingerprint; SmolLM2's), else None."""
    try:
        detect_format(weight_files(target_dir))
        return target_dir
    except ValueError:
        pass
    return _packaged_for(target_dir, "mtp", HEADS)


def find_draft_model(target_dir: str) -> Optional[str]:
    """The draft model that goes with a target: for the packaged target the packaged draft,
    else a packaged draft trained for exactly this checkpoint (SmolLM2's), else None."""
    return _packaged_for(target_dir, "draft", DRAFTS)


def _packaged_for(target_dir: str, tiny: str, names) -> Optional[str]:
    """The packaged drafter ``tiny`` for the packaged target, else the one among ``names``
    whose ``training.json`` records this target's checkpoint fingerprint, or None."""
    try:
        if os.path.samefile(target_dir, asset_path("target")):
            return asset_path(tiny)
    except FileNotFoundError:
        pass
    found = [d for d in (installed_head(name) for name in names) if d is not None]
    if not found:
        return None
    try:
        fp = checkpoint_fingerprint(target_dir)
    except (ValueError, OSError):
        return None
    return next((d for d, d_fp in found if d_fp == fp), None)


def _draft_dir(spec: SpecConfig, target_dir: str) -> str:
    """``draft=DIR`` (or a model name) as given, otherwise ``find_draft_model``."""
    if spec.draft not in (None, "default"):
        return resolve(spec.draft, "draft")
    draft = find_draft_model(target_dir)
    if draft is not None:
        return draft
    raise ValueError(f"no draft model for {target_dir}: the packaged drafts belong to other targets; pass "
                     f"SpecConfig(method='draft_target', draft=DIR)")


def _mtp_dir(spec: SpecConfig, target_dir: str) -> str:
    """``draft=DIR`` as given, otherwise the target's own head (``find_mtp_head``)."""
    if spec.draft not in (None, "default"):
        return spec.draft
    head = find_mtp_head(target_dir)
    if head is not None:
        return head
    raise ValueError(f"no MTP head for {target_dir}: the checkpoint holds no MTP layer and the packaged head "
                     f"belongs to the packaged target; pass SpecConfig(method='{spec.method}', draft=DIR)")


def validated_acceptance(draft_dir: Optional[str], method: str) -> Optional[List[float]]:
    """The acceptance per draft position a drafter's ``training.json`` records from its
    engine validation run (``train-mtp``, ``tools/distill_draft_llm.py``), where that run
    drafted chains as ``method`` does ("mtp", "draft_target"); else None."""
    if draft_dir is None or method not in ("mtp", "draft_target"):
        return None
    run = training_record(draft_dir).get("engine_validation")
    if not isinstance(run, dict):
        return None
    shares = run.get("accepted_per_position")
    if run.get("method", "mtp") != method or not isinstance(shares, list):
        return None
    if not shares or not all(isinstance(p, (int, float)) and 0.0 <= p <= 1.0 for p in shares):
        return None
    return [float(p) for p in shares]


def drafter_quantization(quantization: str, draft_dir: str, target) -> str:
    """How a drafter's matrices load: ``quantization`` as given, except that "auto" gives a
    drafter stored in float weights (an MTP head, a draft model that is not a GGUF file)
    Q8_0 blocks when the target's layers are block-quantized: a drafter is there to cost
    less than the target, and Q8_0 keeps its proposals. (SmolLM2's Q4_1 file: its MTP head
    in Q8_0 drafts 1.4x faster than in bfloat16, its 2-layer draft model 1.5x, both at the
    same acceptance to 0.01; the draft model in Q4_1 lost 0.02 of its first-position
    acceptance of 0.37 for 11% less drafting time.)"""
    if quantization != "auto" or gguf_file(draft_dir) is not None:
        return quantization
    return "q8_0" if quantized_formats(target) else quantization


def make_proposer(spec: SpecConfig, draft_dir: Optional[str], target, planner, num_pages: int, page_size: int,
                  dtype, device, draft_sampling: bool = True) -> Proposer:
    if spec.method == "ngram":
        return NgramProposer(spec.num_draft_tokens)
    if spec.method == "none":
        return NoProposer()
    quantization = drafter_quantization(spec.quantization, draft_dir, target)
    if spec.method == "draft_target":
        draft = load_draft_model(draft_dir, target, dtype, device, quantization=quantization)
        return DraftModelProposer(draft, spec.num_draft_tokens, planner, num_pages, page_size,
                                  target.config.vocab_size, dtype, device, sample_drafts=draft_sampling,
                                  stop_below=spec.draft_stop_prob, lookup_tokens=spec.lookup_draft_tokens)
    if spec.method == "eagle_tree":
        head = load_mtp_head(draft_dir, target, dtype, device, quantization=quantization)
        return EagleTreeProposer(head, spec.num_draft_tokens, spec.tree_top_k or TREE_TOP_K,
                                 spec.tree_num_nodes or TREE_NUM_NODES, planner, num_pages, page_size, dtype, device,
                                 paths=spec.tree_paths)
    head = load_mtp_head(draft_dir, target, dtype, device, quantization=quantization)   # "mtp"
    return MTPProposer(head, spec.num_draft_tokens, planner, num_pages, page_size, dtype, device,
                       sample_drafts=draft_sampling, stop_below=spec.draft_stop_prob,
                       lookup_tokens=spec.lookup_draft_tokens)

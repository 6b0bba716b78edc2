"""Builds the proposer for a ``SpecConfig`` and checks draft/target compatibility."""
from __future__ import annotations

from typing import Optional

from ..assets import resolve
from ..models.config import ModelConfig
from ..models.tokenizer import Tokenizer
from ..params import SpecConfig
from .draft_model import DraftModelProposer
from .ngram import NgramProposer
from .proposer import NoProposer, Proposer


def resolve_draft(spec: SpecConfig, target_tokenizer: Tokenizer, target_cfg: ModelConfig) -> Optional[str]:
    """The draft model directory for ``draft_target`` (checked against the target), else None."""
    if spec.method in ("none", "ngram"):
        return None
    if spec.method != "draft_target":
        raise ValueError(f"speculation method {spec.method!r} is not available in this build; "
                         f"available: 'none', 'draft_target', 'ngram'")
    draft_dir = resolve(spec.draft or "default", "draft")
    draft_cfg = ModelConfig.from_dir(draft_dir)
    draft_tok = Tokenizer(draft_dir)
    if draft_tok.fingerprint() != target_tokenizer.fingerprint():
        raise ValueError(f"draft tokenizer ({draft_dir}) differs from the target's: draft and target must "
                         f"share one vocabulary")
    needed = target_tokenizer.vocab_size
    if min(draft_cfg.vocab_size, target_cfg.vocab_size) < needed:
        raise ValueError(f"vocab sizes differ beyond embedding padding: target {target_cfg.vocab_size}, "
                         f"draft {draft_cfg.vocab_size}, tokenizer {needed}")
    return draft_dir


def make_proposer(spec: SpecConfig, draft_dir: Optional[str], planner, num_pages: int, page_size: int,
                  target_vocab_size: int, dtype, device, draft_sampling: bool = False) -> Proposer:
    if spec.method == "ngram":
        return NgramProposer(spec.num_draft_tokens)
    if spec.method == "draft_target":
        return DraftModelProposer(draft_dir, spec.num_draft_tokens, planner, num_pages, page_size,
                                  target_vocab_size, dtype, device, sample_drafts=draft_sampling)
    return NoProposer()

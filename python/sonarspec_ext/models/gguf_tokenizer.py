"""A GGUF file's tokenizer (``tokenizer.ggml.*`` metadata) as a ``tokenizers`` tokenizer.

- ``gpt2`` (byte-level BPE): the file's tokens and merges; the text is split before BPE
  as llama.cpp splits it for the file's ``tokenizer.ggml.pre`` type.
- ``llama`` (SentencePiece BPE): tokens and scores, with byte fallback (``<0x0A>``); the
  merges are the pairs of tokens whose concatenation is a token, best score first.
Tokens typed CONTROL become special tokens (matched whole, dropped when decoding), those
typed USER_DEFINED added tokens (matched whole, kept).
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

from .config import CheckpointError
from .gguf import GGUFCheckpoint
from .tokenizer import Tokenizer

CONTROL, USER_DEFINED = 3, 4

_GPT2 = None   # ByteLevel's own regex: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
_DIGITS = r"\p{N}"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> the regexes llama.cpp splits with, in order (None: GPT-2's)
PRE_TOKENIZERS: Dict[str, Tuple] = {
    **{k: (_GPT2,) for k in ("gpt2", "gpt-2", "mpt", "olmo", "jais")},
    **{k: (_DIGITS, _GPT2) for k in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                                     "minerva")},
    **{k: (_LLAMA3,) for k in ("llama-bpe", "llama3", "llama-v3", "falcon3", "smaug-bpe", "dbrx")},
    **{k: (_QWEN2,) for k in ("qwen2", "deepseek-r1-qwen")},
}


def tokenizer_from_gguf(ckpt: GGUFCheckpoint) -> Tokenizer:
    kind = ckpt.field("tokenizer.ggml.model")
    tokens = ckpt.field("tokenizer.ggml.tokens")
    if kind is None or not tokens:
        raise CheckpointError(f"{ckpt.path}: the file has no tokenizer metadata (tokenizer.ggml.model / "
                              f"tokenizer.ggml.tokens); pass token ids, or use a file that embeds its tokenizer")
    types = ckpt.field("tokenizer.ggml.token_type") or [1] * len(tokens)
    if kind == "gpt2":
        tok = _byte_level_bpe(ckpt, tokens)
    elif kind == "llama":
        tok = _sentencepiece_bpe(ckpt, tokens)
    else:
        raise CheckpointError(f"{ckpt.path}: tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == USER_DEFINED])
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise CheckpointError(f"{ckpt.path}: the tokenizer built from the file has "
                              f"{tok.get_vocab_size(with_added_tokens=True)} tokens, the file lists {len(tokens)} "
                              f"(duplicate token strings?)")
    bos = ckpt.field("tokenizer.ggml.bos_token_id")
    return Tokenizer(tok, eos_token_id=ckpt.field("tokenizer.ggml.eos_token_id"), bos_token_id=bos,
                     add_bos=ckpt.field("tokenizer.ggml.add_bos_token", kind == "llama"),
                     chat_template=ckpt.field("tokenizer.chat_template"), source=ckpt.path)


def _byte_level_bpe(ckpt: GGUFCheckpoint, tokens: List[str]) -> _HFTokenizer:
    merges = ckpt.field("tokenizer.ggml.merges") or []
    pre = ckpt.field("tokenizer.ggml.pre", "gpt2")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(f"{ckpt.path}: pre-tokenizer type {pre!r} is not supported; supported: "
                              f"{', '.join(sorted(PRE_TOKENIZERS))}")
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = _HFTokenizer(models.BPE(vocab=vocab, merges=pairs))
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[pre] if r is not None]
    gpt2_regex = _GPT2 in PRE_TOKENIZERS[pre]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=gpt2_regex))
    tok.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(ckpt: GGUFCheckpoint, tokens: List[str]) -> _HFTokenizer:
    scores = ckpt.field("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = ckpt.field("tokenizer.ggml.unknown_token_id", 0)
    tok = _HFTokenizer(models.BPE(vocab=vocab, merges=sentencepiece_merges(tokens, scores),
                                  unk_token=tokens[unk_id] if 0 <= unk_id < len(tokens) else None,
                                  byte_fallback=True, fuse_unk=True))
    prefix = ckpt.field("tokenizer.ggml.add_space_prefix", True)
    norm = [normalizers.Replace(" ", "\u2581")]
    tok.normalizer = normalizers.Sequence(([normalizers.Prepend("\u2581")] if prefix else []) + norm)
    dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(dec + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def sentencepiece_merges(tokens: List[str], scores: List[float]) -> List[Tuple[str, str]]:
    """Every split of a token into two tokens, ordered by the merged token's score (best
    first), then by the pieces' ids: the merge order SentencePiece's BPE scores imply."""
    ids = {t: i for i, t in enumerate(tokens)}
    merges = []
    for t, i in ids.items():
        for cut in range(1, len(t)):
            a, b = t[:cut], t[cut:]
            if a in ids and b in ids:
                merges.append((-scores[i], ids[a], ids[b], a, b))
    merges.sort()
    return [(a, b) for *_, a, b in merges]

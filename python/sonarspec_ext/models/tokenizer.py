"""Tokenizer loaded from ``tokenizer.json`` through the ``tokenizers`` library."""
from __future__ import annotations

import json
import os
from typing import List, Optional

from tokenizers import Tokenizer as _HFTokenizer

from .config import CheckpointError


class Tokenizer:
    def __init__(self, path: str):
        f = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(f):
            raise CheckpointError(f"{f}: file not found (the model directory needs a tokenizer.json)")
        try:
            self._tok = _HFTokenizer.from_file(f)
        except Exception as e:  # the tokenizers library raises a bare Exception
            raise CheckpointError(f"{f}: cannot be parsed as a tokenizer ({e})") from None
        self.eos_token_id: Optional[int] = None
        self.bos_token_id: Optional[int] = None
        self.add_bos = False
        cfg_file = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(cfg_file):
            with open(cfg_file) as fh:
                cfg = json.load(fh)
            self.eos_token_id = self._special_id(cfg.get("eos_token"))
            self.bos_token_id = self._special_id(cfg.get("bos_token"))
            self.add_bos = bool(cfg.get("add_bos_token", False)) and self.bos_token_id is not None

    def _special_id(self, tok) -> Optional[int]:
        if isinstance(tok, dict):
            tok = tok.get("content")
        return self._tok.token_to_id(tok) if isinstance(tok, str) else None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> List[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_token_id] + ids if self.add_bos else ids

    def decode(self, ids: List[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)

    def fingerprint(self) -> str:
        """A hash of the vocabulary, to check that two models share one tokenizer."""
        import hashlib
        vocab = sorted(self._tok.get_vocab(with_added_tokens=True).items())
        return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def write_byte_tokenizer(path: str, eot: str = "<|endoftext|>") -> None:
    """Writes a byte-level tokenizer with no merges (256 byte tokens, then ``eot`` as
    id 256) as ``tokenizer.json`` + ``tokenizer_config.json``: for synthetic models."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = HFTokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([eot])
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as fh:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eot}, fh)

"""Tokenizer: a ``tokenizers`` tokenizer plus the model's special tokens and chat template.

Built from a model directory's ``tokenizer.json`` (``Tokenizer.from_dir``) or from a GGUF
file's ``tokenizer.ggml.*`` metadata (``models.gguf_tokenizer``); ``load_tokenizer``
picks by the path.
"""
from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence

from tokenizers import Tokenizer as _HFTokenizer

from .config import CheckpointError

# end-of-turn markers of common chat templates: a chat stops at whichever the template uses
END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


class Tokenizer:
    def __init__(self, tok: _HFTokenizer, eos_token_id: Optional[int] = None,
                 bos_token_id: Optional[int] = None, add_bos: bool = False,
                 chat_template: Optional[str] = None, source: str = "tokenizer"):
        self._tok = tok
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self.add_bos = bool(add_bos) and bos_token_id is not None
        self.chat_template = chat_template
        self.source = source

    @classmethod
    def from_dir(cls, path: str) -> "Tokenizer":
        f = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(f):
            raise CheckpointError(f"{f}: file not found (the model directory needs a tokenizer.json)")
        try:
            tok = _HFTokenizer.from_file(f)
        except Exception as e:  # the tokenizers library raises a bare Exception
            raise CheckpointError(f"{f}: cannot be parsed as a tokenizer ({e})") from None
        cfg = {}
        cfg_file = os.path.join(path, "tokenizer_config.json")
        if os.path.isfile(cfg_file):
            try:
                with open(cfg_file) as fh:
                    cfg = json.load(fh)
            except json.JSONDecodeError as e:
                raise CheckpointError(f"{cfg_file}: not valid JSON ({e})") from None
        template = cfg.get("chat_template")
        jinja = os.path.join(path, "chat_template.jinja")
        if template is None and os.path.isfile(jinja):
            with open(jinja) as fh:
                template = fh.read()
        if isinstance(template, list):   # named templates: take the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)

        def special(t):
            t = t.get("content") if isinstance(t, dict) else t
            return tok.token_to_id(t) if isinstance(t, str) else None
        return cls(tok, special(cfg.get("eos_token")), special(cfg.get("bos_token")),
                   bool(cfg.get("add_bos_token", False)), template, source=f)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> Optional[int]:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> Optional[str]:
        return self._tok.id_to_token(token_id)

    def encode(self, text: str) -> List[int]:
        """Token ids of ``text``; special tokens written in the text (``<|im_start|>``) are
        matched whole. Prepends BOS where the model adds one, unless the text starts with it."""
        if not isinstance(text, str):
            raise ValueError(f"text to encode must be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"the text is not valid Unicode: {e.reason} at character {e.start}") from None
        try:
            ids = self._tok.encode(text, add_special_tokens=False).ids
        except Exception as e:   # the tokenizers library raises bare Exceptions (lone surrogates, ...)
            raise ValueError(f"the text cannot be tokenized: {e}") from None
        if self.add_bos and not (ids and ids[0] == self.bos_token_id):
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    def end_of_turn_ids(self) -> List[int]:
        """Ids that end an assistant turn: EOS plus the template's end-of-turn markers."""
        ids = [] if self.eos_token_id is None else [self.eos_token_id]
        for marker in END_OF_TURN_TOKENS:
            i = self._tok.token_to_id(marker)
            if i is not None and i not in ids and (self.chat_template or "").find(marker) >= 0:
                ids.append(i)
        return ids

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

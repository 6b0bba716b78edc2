"""Incremental detokenization: a sequence's text grows by decoding only its last few tokens
per step (the few before them decoded alongside and subtracted, so tokenizers that treat a
segment's first token specially - SentencePiece's leading space - still agree), instead
of decoding the whole output every token. A tail that ends inside a UTF-8 character waits
for the tokens that complete it."""
from __future__ import annotations

from typing import List

WINDOW = 5   # tokens decoded before the new ones after a resynchronisation


class IncrementalText:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.text = ""       # decode(ids[:read]), complete characters only
        self.prefix = 0      # ids[prefix:read] are decoded again as the new tail's context
        self.read = 0

    def update(self, ids: List[int]) -> str:
        """The text of ``ids`` (the sequence's whole output so far), up to the last complete
        character."""
        if len(ids) < self.read:   # the output was cut back (a step rolled back): start again
            self.text, self.prefix, self.read = "", 0, 0
        if len(ids) == self.read:
            return self.text
        decode = self.tokenizer.decode
        before = decode(ids[self.prefix:self.read])
        full = decode(ids[self.prefix:])
        if full.endswith("\ufffd"):
            return self.text
        if full.startswith(before):
            self.text += full[len(before):]
            self.prefix = self.read
        else:   # the context changed how the tail decodes: start again from the whole output
            self.text = decode(ids)
            self.prefix = max(0, len(ids) - WINDOW)
        self.read = len(ids)
        return self.text


def stop_prefix_len(text: str, stops) -> int:
    """Length of the longest tail of ``text`` that begins one of the stop strings (text a
    stream must hold back: the next tokens may complete the stop string and cut it)."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best

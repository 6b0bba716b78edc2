"""Output processing: a step's emitted tokens appended to their sequences, which finish
exactly at their first stop condition (stop token, stop string, max_tokens, the context),
and the text handed to streams."""
from __future__ import annotations

import time
from typing import List, Optional

from .detokenize import stop_prefix_len
from .request_stats import RequestTotals
from .request import Request


class OutputProcessor:
    def __init__(self, tokenizer, planner, proposer, max_model_len: int, prefix_caching: bool = False):
        self.tokenizer, self.planner, self.proposer = tokenizer, planner, proposer
        self.max_model_len, self.prefix_caching = max_model_len, prefix_caching
        self.finished = RequestTotals()   # statistics of finished requests, as running totals

    def append(self, seq: Request, tokens: List[int]) -> None:
        """Appends emitted tokens, stopping exactly at the first stop condition."""
        if seq.first_token_time is None and tokens:
            seq.first_token_time = time.perf_counter()
        p = seq.params
        for tok in tokens:
            seq.output_ids.append(tok)
            self.planner.append_tokens(seq.seq_id, 1)
            reason, text = None, None
            if tok in seq.stop_ids:
                reason = "stop"
            elif len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
                reason = "length"
            if p.stop:
                # only the text added since the last check can complete a stop string
                full = seq.detok.update(seq.output_ids)
                start = max(0, min(seq.stop_checked, len(full)) - max(len(s) for s in p.stop) + 1)
                cut = _find_stop(full[start:], p.stop)
                seq.stop_checked = len(full)
                if cut is not None:
                    text, reason = full[:start + cut], "stop"
            if reason is not None:
                self.finish(seq, reason, text)
                return

    def finish(self, seq: Request, reason: str, text: Optional[str] = None) -> None:
        """Finishes ``seq`` with ``reason``: its pages and drafter state released, its
        statistics added to the totals. Unless it failed, pages whose KV is valid in every
        model go to the planner's prefix cache (when it keeps one)."""
        seq.text = text if text is not None else self.tokenizer.decode(seq.output_ids)
        seq.finish_reason = reason
        if self.planner.has(seq.seq_id):
            if reason == "error" or not self.prefix_caching:
                self.planner.finish(seq.seq_id)
            else:
                self.planner.finish(seq.seq_id, seq.all_ids, self.valid_kv(seq))
        self.proposer.reset(seq)
        self.finished.add(seq.stats(), seq.finish_reason)

    def valid_kv(self, seq: Request) -> int:
        """Positions of ``seq`` below it hold valid KV in every model: the target's and the
        proposer's own pool."""
        return min(seq.kv_len, self.proposer.kv_valid(seq))

    def text_so_far(self, seq: Request) -> str:
        """The output's text: final once finished, else up to its last complete character."""
        return seq.text if seq.finished else seq.detok.update(seq.output_ids)

    def stream_text(self, seq: Request) -> str:
        """The text a stream may hand out now: all of it once finished, else without a
        tail that could still begin a stop string (the next tokens may complete it) or end
        inside a UTF-8 character."""
        text = self.text_so_far(seq)
        if not seq.finished:
            text = text.rstrip("\ufffd")
            text = text[:len(text) - stop_prefix_len(text, seq.params.stop)]
        return text


def _find_stop(text: str, stops: List[str]) -> Optional[int]:
    """Earliest position of any stop string in ``text``, or None."""
    best = None
    for s in stops:
        i = text.find(s)
        if i != -1 and (best is None or i < best):
            best = i
    return best

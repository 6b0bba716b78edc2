"""Drafting with a ``DecoderStack``: a drafter's forward over a few tokens - embedding,
stack, lm_head - as one native call (``rows_forward``), and chain drafting, all rounds of
embedding, stack, lm_head and the top token or a draw in one call (``chain``). Same
kernels as the per-op path, so the same logits and tokens."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from .checks import check_page_size, check_tensor
from .decoder_stack import DecoderStack
from .limits import SMALL_M_MAX_ROWS
from .linear import native_threads
from .quantized import QuantizedMatrix, weight_format_code


def fits(stack: DecoderStack, lm_head: torch.Tensor, rows: int, num_tokens: int) -> bool:
    """Whether a drafting call over ``num_tokens`` tokens in ``rows`` rows runs natively: the
    stack takes the tokens, and the lm_head GEMM the rows, as the per-op path would."""
    return (0 < num_tokens <= stack.max_rows
            and not (weight_format_code(lm_head) == 0 and rows > SMALL_M_MAX_ROWS))


def block_table(tables) -> torch.Tensor:
    """Page tables (lists of page ids) -> (len(tables), longest) int64, padded with -1: a
    position past a row's own pages has no page (refused natively), not page 0."""
    width = max(1, max(map(len, tables), default=0))
    out = np.full((len(tables), width), -1, dtype=np.int64)
    for i, t in enumerate(tables):
        out[i, :len(t)] = t
    return torch.from_numpy(out)


def _check_weights(stack: DecoderStack, embed, lm_head, row_ids: Optional[torch.Tensor]) -> None:
    for name, t in (("embed", embed), ("lm_head", lm_head)):
        if not isinstance(t, QuantizedMatrix):
            check_tensor(name, t, dtypes=(torch.float32, torch.bfloat16), ndim=2, device=torch.device("cpu"))
        if t.shape[1] != stack.hidden:
            raise ValueError(f"{name} has shape {list(t.shape)}, expected [rows, {stack.hidden}]")
    if embed.shape[0] < lm_head.shape[0]:
        raise ValueError(f"embed ({embed.shape[0]} rows) must cover the lm_head's {lm_head.shape[0]} rows")
    if row_ids is not None:
        check_tensor("row_ids", row_ids, dtypes=(torch.int64,), ndim=1, device=torch.device("cpu"))
        if row_ids.shape[0] != lm_head.shape[0]:
            raise ValueError(f"row_ids has {row_ids.shape[0]} entries, expected one per lm_head row "
                             f"({lm_head.shape[0]})")
        if row_ids.numel() and (int(row_ids.min()) < 0 or int(row_ids.max()) >= embed.shape[0]):
            raise ValueError(f"row_ids must lie in [0, {embed.shape[0]}) (the embedding's rows)")


def _checked_weights(stack: DecoderStack, embed, lm_head, row_ids: Optional[torch.Tensor]) -> None:
    """The weights (and ``row_ids``, the token of each lm_head row, None: row r is token r),
    checked at their first call with this stack (they are the drafter's, or the target's)."""
    checked = stack._checked_io
    if checked is None or checked[0] is not embed or checked[1] is not lm_head or checked[2] is not row_ids:
        _check_weights(stack, embed, lm_head, row_ids)
        stack._checked_io = (embed, lm_head, row_ids)


def _native_args(embed, lm_head, table_ptr: int, max_pages: int, page_size: int, window: Optional[int],
                 row_ids: Optional[torch.Tensor]) -> tuple:
    """The native calls' weight and table arguments (``IOArgs``)."""
    return (embed.data_ptr(), weight_format_code(embed), lm_head.data_ptr(), weight_format_code(lm_head),
            lm_head.shape[0], table_ptr, max_pages, page_size, window or 0, embed.shape[0],
            0 if row_ids is None else row_ids.data_ptr(), 0 if row_ids is None else row_ids.shape[0])


def _io(stack: DecoderStack, embed, lm_head, block_table, page_size: int, window: int, rows: int,
        features: Optional[torch.Tensor], num_tokens: int, row_ids: Optional[torch.Tensor] = None):
    """Validated native arguments shared by the calls, plus contiguous features."""
    _checked_weights(stack, embed, lm_head, row_ids)
    check_page_size(page_size)
    if not fits(stack, lm_head, rows, num_tokens):
        raise ValueError(f"DecoderStack drafting runs 1..{stack.max_rows} tokens at once and a float32 lm_head at "
                         f"most {SMALL_M_MAX_ROWS} rows, got {num_tokens} tokens in {rows} rows")
    check_tensor("block_table", block_table, dtypes=(torch.int64,), ndim=2)
    if block_table.shape[0] != rows or block_table.shape[1] == 0:
        raise ValueError(f"block_table has shape {list(block_table.shape)}, expected [{rows}, max_pages]")
    if (stack.model.fc is None) != (features is None):
        raise ValueError("features go with MTP heads, and only with them")
    if features is not None:
        check_tensor("features", features, dtypes=(torch.float32,), ndim=2, contiguous=False)
        features = features.contiguous()
        if features.shape != (num_tokens, stack.hidden):
            raise ValueError(f"features have shape {list(features.shape)}, expected [{num_tokens}, {stack.hidden}]")
    args = _native_args(embed, lm_head, block_table.data_ptr(), block_table.shape[1], page_size, window, row_ids)
    return args, features


def _int64(name: str, t: torch.Tensor, n: int) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int64 or t.shape != (n,) or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous int64 tensor of shape [{n}]")


def _rows(tokens: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor) -> Tuple[int, int]:
    """(rows, tokens) of validated rows of tokens."""
    B = starts.shape[0] if isinstance(starts, torch.Tensor) and starts.dim() == 1 else 0
    _int64("starts", starts, B)
    _int64("lens", lens, B)
    lens_list = lens.tolist()
    if B == 0 or min(lens_list) < 1:
        raise ValueError("drafting needs rows of at least one token")
    T = sum(lens_list)
    _int64("tokens", tokens, T)
    return B, T


def rows_forward(stack: DecoderStack, embed: torch.Tensor, lm_head: torch.Tensor, tokens: torch.Tensor,
                 starts: torch.Tensor, lens: torch.Tensor, block_table: torch.Tensor, page_size: int,
                 window: Optional[int] = None, features: Optional[torch.Tensor] = None,
                 row_ids: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows of tokens (row b: ``lens[b]`` of the packed ``tokens`` at positions
    ``starts[b]``...; its KV through ``block_table[b]``; an MTP head reads ``features``
    (num_tokens, hidden)) -> (float32 logits (rows, lm_head rows), stack outputs (rows,
    hidden)) at each row's last token. The new tokens' K/V are written to the pools."""
    B, T = _rows(tokens, starts, lens)
    args, features = _io(stack, embed, lm_head, block_table, page_size, window, B, features, T, row_ids)
    logits = torch.empty(B, lm_head.shape[0], dtype=torch.float32)
    out = torch.empty(B, stack.hidden, dtype=torch.float32)
    try:
        stack._native.rows_forward(args, tokens.data_ptr(), 0 if features is None else features.data_ptr(),
                                   starts.data_ptr(), lens.data_ptr(), B, logits.data_ptr(), out.data_ptr(),
                                   native_threads(), False, 0, 0)
    except IndexError as e:
        raise ValueError(str(e)) from None
    return logits, out


def decode_rows_forward(stack: DecoderStack, embed: torch.Tensor, lm_head: torch.Tensor,
                        rows: Sequence[Tuple[int, Sequence[int], Sequence[int]]], page_size: int,
                        window: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor, List[int]]:
    """A target's decode step over ``rows`` - (start position, token ids, page table), as
    the engine builds them - in one native call: (float32 logits (tokens, lm_head rows),
    stack outputs (tokens, hidden), each logits row's top token - the first maximum, a NaN
    counting as the maximum: numpy's and torch's argmax - taken natively while the row is in
    the cache) at every token in packed order, with the least Python around the call: the
    rows packed into one int64 buffer, the weights checked once per stack, every index
    checked by the native code (a bad one: ValueError).
    A decode step's Python runs after its forward has streamed the weights through the
    caches, where each line costs most."""
    check_page_size(page_size)
    B = len(rows)
    T = sum(len(toks) for _, toks, _ in rows)
    if B == 0 or min(len(toks) for _, toks, _ in rows) < 1:
        raise ValueError("decoding needs rows of at least one token")
    if not fits(stack, lm_head, T, T):
        raise ValueError(f"a decode step runs 1..{stack.max_rows} tokens and a float32 lm_head at most "
                         f"{SMALL_M_MAX_ROWS} rows natively, got {T}")
    _checked_weights(stack, embed, lm_head, None)
    width = max(1, max(len(table) for *_, table in rows))
    buf = np.zeros(T + 2 * B + B * width, dtype=np.int64)   # tokens, starts, lengths, block table
    i, at = 0, T + 2 * B
    buf[at:] = -1   # past a row's own pages: no page, as block_table pads
    try:
        for b, (start, toks, table) in enumerate(rows):
            buf[i:i + len(toks)] = toks
            buf[T + b], buf[T + B + b] = start, len(toks)
            buf[at + b * width:at + b * width + len(table)] = table
            i += len(toks)
    except OverflowError as e:
        raise ValueError(f"decode rows: a token id, position or page id past int64 ({e})") from None
    logits = torch.empty(T, lm_head.shape[0], dtype=torch.float32)
    out = torch.empty(T, stack.hidden, dtype=torch.float32)
    top = np.empty(T, dtype=np.int64)
    p = buf.ctypes.data
    try:
        stack._native.rows_forward(_native_args(embed, lm_head, p + 8 * (T + 2 * B), width, page_size, window, None),
                                   p, 0, p + 8 * T, p + 8 * (T + B), B, logits.data_ptr(), out.data_ptr(),
                                   native_threads(), True, top.ctypes.data, lm_head.shape[0])
    except IndexError as e:
        raise ValueError(str(e)) from None
    return logits, out, top.tolist()


def _stop_args(scores: Optional[torch.Tensor], shape: Tuple[int, int], stop_below: float,
               prior: Optional[torch.Tensor] = None) -> tuple:
    """The native (scores, stop_below, prior) triple of a greedy chain (``ChainStop``)."""
    if scores is None:
        return 0, 0.0, 0
    if scores.dtype != torch.float32 or tuple(scores.shape) != shape or not scores.is_contiguous():
        raise ValueError(f"scores must be a contiguous float32 tensor of shape {list(shape)}")
    if not (isinstance(stop_below, (int, float)) and 0.0 <= stop_below <= 1.0):
        raise ValueError(f"stop_below must lie in [0, 1], got {stop_below!r}")
    if prior is not None and (prior.dtype != torch.float32 or tuple(prior.shape) != shape[:1]
                              or not prior.is_contiguous()):
        raise ValueError(f"prior must be a contiguous float32 tensor of shape [{shape[0]}]")
    return scores.data_ptr(), float(stop_below), 0 if prior is None else prior.data_ptr()


def _sampling_args(sampling: Optional[tuple], batch: int, rounds: int, vocab: int) -> tuple:
    """(distributions (batch, rounds, vocab) to fill, the native pointers) of a sampled
    chain's (temperature, top_k, top_p, uniforms (batch, rounds)); (None, zeros) without."""
    if sampling is None:
        return None, (0, 0, 0, 0, 0)
    temperature, top_k, top_p, uniforms = sampling
    for name, t, dtype in (("temperature", temperature, torch.float32), ("top_p", top_p, torch.float32),
                           ("top_k", top_k, torch.int64)):
        if t.dtype != dtype or t.shape != (batch,) or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous {dtype} tensor of shape [{batch}]")
    if uniforms.dtype != torch.float64 or uniforms.shape != (batch, rounds) or not uniforms.is_contiguous():
        raise ValueError(f"uniforms must be a contiguous float64 tensor of shape [{batch}, {rounds}]")
    probs = torch.empty(batch, rounds, vocab, dtype=torch.float32)
    return probs, (temperature.data_ptr(), top_k.data_ptr(), top_p.data_ptr(), uniforms.data_ptr(), probs.data_ptr())


def _penalty_args(penalties: Optional[tuple], batch: int, vocab: int) -> Tuple[int, int]:
    """The native (active, factors) pointers of ``penalties`` = (active (batch,) uint8,
    factors (batch, 3, vocab) float32; see ``DraftPenalties``), or zeros without."""
    if penalties is None:
        return 0, 0
    active, factors = penalties
    if active.dtype != torch.uint8 or active.shape != (batch,) or not active.is_contiguous():
        raise ValueError(f"penalties' active flags must be a contiguous uint8 tensor of shape [{batch}]")
    if factors.dtype != torch.float32 or factors.shape != (batch, 3, vocab) or not factors.is_contiguous():
        raise ValueError(f"penalties' factors must be a contiguous float32 tensor of shape [{batch}, 3, {vocab}]")
    return active.data_ptr(), factors.data_ptr()


def chain(stack: DecoderStack, embed: torch.Tensor, lm_head: torch.Tensor, vocab: int, tokens: torch.Tensor,
          positions: torch.Tensor, block_table: torch.Tensor, page_size: int, window: Optional[int], steps: int,
          features: Optional[torch.Tensor] = None, sampling: Optional[tuple] = None,
          row_ids: Optional[torch.Tensor] = None, scores: Optional[torch.Tensor] = None, stop_below: float = 0.0,
          prior: Optional[torch.Tensor] = None, penalties: Optional[tuple] = None
          ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """``steps`` rounds of one token per sequence: ``tokens`` (batch,) embedded at
    ``positions`` + round (an MTP head on ``features`` (batch, hidden), then on its own
    outputs), logits through ``lm_head``, and the round's token - the top one among the
    first ``vocab`` logits, or with ``sampling`` = (temperature (batch,) float32, top_k
    (batch,) int64, top_p (batch,) float32, uniforms (batch, steps) float64) a draw from
    each row's processed distribution (temperature <= 0: the top token, one-hot) - feeding
    the next round. ``row_ids`` (lm_head rows,): the token of each lm_head row, for a
    drafter's lm_head over a draft vocabulary - rows picked are mapped to their tokens, and
    the distributions stay over rows. Returns (tokens (batch, steps), the distributions
    (batch, steps, vocab) with ``sampling``, else None): what running the rounds op by op
    returns. Greedy chains (no ``sampling``) given ``scores`` (batch, steps) float32 write
    there each drafted token's softmax probability, and stop once every row's draft - the
    product of ``prior`` (batch,) (None: 1) and its scores so far - is below ``stop_below``:
    the rounds not run leave token -1 and score 0. ``penalties`` = (active (batch,) uint8,
    factors (batch, 3, vocab) float32) change the logits of the active rows before their
    tokens are taken, drawn or scored: l * (l > 0 ? factors[0] : factors[1]) + factors[2]."""
    B = tokens.shape[0] if isinstance(tokens, torch.Tensor) and tokens.dim() == 1 else 0
    if B == 0:
        raise ValueError("tokens must be a non-empty 1-D tensor")
    _int64("tokens", tokens, B)
    _int64("positions", positions, B)
    if not 0 < vocab <= lm_head.shape[0] or steps < 0:
        raise ValueError(f"vocab {vocab} must lie in 1..{lm_head.shape[0]} and steps be >= 0")
    args, features = _io(stack, embed, lm_head, block_table, page_size, window, B, features, B, row_ids)
    out = torch.empty(B, steps, dtype=torch.int64)
    probs, ptrs = _sampling_args(sampling, B, steps, vocab)
    stop = _stop_args(scores, (B, steps), stop_below, prior)
    if stop[0] and sampling is not None:
        raise ValueError("scores and stop_below apply to greedy chains (no sampling)")
    try:
        stack._native.chain(args, vocab, tokens.data_ptr(), 0 if features is None else features.data_ptr(),
                            positions.data_ptr(), B, steps, ptrs, out.data_ptr(), native_threads(), stop,
                            _penalty_args(penalties, B, vocab))
    except IndexError as e:
        raise ValueError(str(e)) from None
    return out, probs


def refill_chain(stack: DecoderStack, embed: torch.Tensor, lm_head: torch.Tensor, vocab: int, tokens: torch.Tensor,
                 starts: torch.Tensor, lens: torch.Tensor, block_table: torch.Tensor, page_size: int,
                 window: Optional[int], steps: int, features: Optional[torch.Tensor] = None,
                 row_ids: Optional[torch.Tensor] = None, scores: Optional[torch.Tensor] = None,
                 stop_below: float = 0.0, sampling: Optional[tuple] = None, penalties: Optional[tuple] = None
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """A drafter's refill and its next greedy chain in one call: ``rows_forward`` over the
    rows (``features`` as there), then per row the top token among the first ``vocab``
    logits and ``steps`` ``chain`` rounds from it at the position after the row (an MTP
    head from the row's output). Returns (logits (rows, lm_head rows) and outputs (rows,
    hidden) after each row's last token, tokens (rows, 1 + steps), lm_head rows mapped
    through ``row_ids`` as in ``chain``, and with ``sampling`` - as ``chain``'s, uniforms
    (rows, 1 + steps): the first token drawn with the row's first - the distributions
    (rows, 1 + steps, vocab), else None): what the two calls return with the top token (or
    the draw) taken in between. ``scores`` (rows, 1 + steps) and ``stop_below`` as in
    ``chain``, the first token scored too (greedy chains only); ``penalties`` as in
    ``chain``, for every token (the logits returned stay the drafter's)."""
    B, T = _rows(tokens, starts, lens)
    if not 0 < vocab <= lm_head.shape[0] or steps < 0:
        raise ValueError(f"vocab {vocab} must lie in 1..{lm_head.shape[0]} and steps be >= 0")
    args, features = _io(stack, embed, lm_head, block_table, page_size, window, B, features, T, row_ids)
    logits = torch.empty(B, lm_head.shape[0], dtype=torch.float32)
    outputs = torch.empty(B, stack.hidden, dtype=torch.float32)
    out = torch.empty(B, steps + 1, dtype=torch.int64)
    probs, ptrs = _sampling_args(sampling, B, steps + 1, vocab)
    stop = _stop_args(scores, (B, steps + 1), stop_below)
    if stop[0] and sampling is not None:
        raise ValueError("scores and stop_below apply to greedy chains (no sampling)")
    try:
        stack._native.refill_chain(args, vocab, tokens.data_ptr(), 0 if features is None else features.data_ptr(),
                                   starts.data_ptr(), lens.data_ptr(), B, steps, logits.data_ptr(),
                                   outputs.data_ptr(), out.data_ptr(), native_threads(), stop, ptrs,
                                   _penalty_args(penalties, B, vocab))
    except IndexError as e:
        raise ValueError(str(e)) from None
    return logits, outputs, out, probs

"""Property-based fuzzing of native drafting (``ops.stack_drafting``: ``rows_forward`` at
each row's last token, a target's decode rows at every token with their top tokens
(``decode_rows_forward``), ``chain``, ``refill_chain``; hypothesis, seeded) on a tiny draft model: valid rows of
tokens, start positions, page tables and sliding windows drawn at random, then entries
replaced by out-of-range values and int64 limits. Every call either returns or raises
ValueError; it returns exactly when every position it runs has its page in the table and
the pool, every key it reads does, and every token embedded is in the table; its inputs
stay unchanged, drafted tokens lie in the vocabulary, and the KV pools change only at the
slots of the positions it runs, refused or not. Run as fuzz_stack_script is."""
import torch
from hypothesis import given
from hypothesis import strategies as st

from fuzz_ops_script import COMPUTED, SETTINGS, index, refused_or
from fuzz_stack_script import HIDDEN, MAX_POS, PAGE, PAGES, POOLS, SLOTS, STACK, restore_pools
from sonarspec_ext.ops.limits import SMALL_M_MAX_ROWS
from sonarspec_ext.ops.stack_drafting import chain, decode_rows_forward, refill_chain, rows_forward

EMBED_ROWS, LM_ROWS = 50, 40
_g = torch.Generator().manual_seed(1)
EMBED = torch.randn(EMBED_ROWS, HIDDEN, generator=_g)
LM_HEAD = torch.randn(LM_ROWS, HIDDEN, generator=_g)
ROW_IDS = torch.randperm(EMBED_ROWS, generator=_g)[:LM_ROWS].contiguous()   # a draft vocabulary's tokens
FIELDS = ["tokens", "starts", "lens", "table", "page_size", "window"]


def _runs(op, starts, lens, steps):
    """(row, position) of every token the call runs, rows before chain rounds, in order."""
    if op == "chain":
        return [(b, p + r) for r in range(steps) for b, p in enumerate(starts)]
    rows = [(b, s + i) for b, (s, n) in enumerate(zip(starts, lens)) for i in range(n)]
    if op in ("rows", "decode"):
        return rows   # refill_chain: its rounds go on after each row
    return rows + [(b, s + n + r) for r in range(steps) for b, (s, n) in enumerate(zip(starts, lens))]


def _position_valid(table, row, p, page_size, window) -> bool:
    """Position p of row `row`: in the RoPE table and the block table, and every key it
    reads (from the window's start, or 0, to p) on a page of the pool."""
    if not (0 <= p < MAX_POS and p // page_size < table.shape[1]):
        return False
    begin = max(0, p + 1 - window) if window > 0 else 0
    return all(0 <= int(table[row, q // page_size]) < SLOTS // page_size for q in range(begin, p + 1))


def _slot(table, row, p, page_size):
    """The pool slot position p of row `row` writes, or None where its page is no pool page."""
    if not (0 <= p and p // page_size < table.shape[1]):
        return None
    page = int(table[row, p // page_size])
    return page * page_size + p % page_size if 0 <= page < SLOTS // page_size else None


@SETTINGS
@given(op=st.sampled_from(["rows", "decode", "chain", "refill"]), batch=st.integers(1, 3),
       pages=st.integers(1, 3),
       steps=st.integers(0, 3), window=st.sampled_from([0, 0, 2, 5]), vocab_map=st.booleans(),
       seed=st.integers(0, 10 ** 6), corrupt=st.lists(st.sampled_from(FIELDS), max_size=2),
       bad=st.lists(index(-3, 60), min_size=2, max_size=2))
def fuzz_drafting(op, batch, pages, steps, window, vocab_map, seed, corrupt, bad):
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi, n: torch.randint(lo, hi, (n,), generator=g)  # noqa: E731
    span = pages * PAGE
    lens = rand(1, 3, batch) if op != "chain" else torch.ones(batch, dtype=torch.int64)
    room = (span - lens - (steps if op == "refill" else 0)).clamp_min(0)   # mostly inside the table
    args = dict(lens=lens, starts=torch.minimum(rand(0, span, batch), room),
                table=rand(0, PAGES, batch * pages).view(batch, pages), tokens=rand(0, EMBED_ROWS, int(lens.sum())))
    page_size = PAGE
    if op == "decode":   # its rows are lists, split by the lengths: those stay whole
        corrupt = [f for f in corrupt if f != "lens"]
    for field, value in zip(corrupt, bad):
        if field == "page_size":
            page_size = value
        elif field == "window":
            window = value
        else:
            t = args[field].view(-1)
            t[abs(value) % t.numel()] = value
    starts, lens_list, tokens = args["starts"].tolist(), args["lens"].tolist(), args["tokens"].tolist()
    rows_ok = op == "chain" or (min(lens_list) >= 1 and sum(lens_list) == len(tokens))
    runs = _runs(op, starts, lens_list, steps) if rows_ok else None
    embedded = tokens if op != "chain" or steps > 0 else []
    valid = (runs is not None and page_size > 0 and all(0 <= t < EMBED_ROWS for t in embedded)
             and all(_position_valid(args["table"], b, p, page_size, window) for b, p in runs)
             and not (op == "decode" and len(tokens) > SMALL_M_MAX_ROWS))   # a float32 lm_head's rows
    row_ids = ROW_IDS if vocab_map and op != "decode" else None
    drafted_tokens = set(ROW_IDS.tolist()) if vocab_map else set(range(LM_ROWS))
    inputs = {k: v.clone() for k, v in args.items()}
    before = [[p.clone() for p in pair] for pair in POOLS]
    common = dict(block_table=args["table"], page_size=page_size, window=window, row_ids=row_ids)

    def call():
        if op == "decode":
            at = [sum(lens_list[:b]) for b in range(len(lens_list))]
            rows = [(s, tokens[a:a + n], t) for s, a, n, t in zip(starts, at, lens_list, args["table"].tolist())]
            return decode_rows_forward(STACK, EMBED, LM_HEAD, rows, page_size, window)
        if op == "rows":
            return rows_forward(STACK, EMBED, LM_HEAD, args["tokens"], args["starts"], args["lens"], **common)
        if op == "chain":
            return chain(STACK, EMBED, LM_HEAD, LM_ROWS, args["tokens"], args["starts"], steps=steps, **common)
        return refill_chain(STACK, EMBED, LM_HEAD, LM_ROWS, args["tokens"], args["starts"], args["lens"],
                            steps=steps, **common)

    def check(out):
        assert valid, f"accepted invalid indices: op={op} corrupt={corrupt} bad={bad}"
        drafted = out[0] if op == "chain" else out[2] if op == "refill" else None
        if drafted is not None:
            assert drafted.shape == (batch, steps + (op == "refill")), drafted.shape
            assert set(drafted.view(-1).tolist()) <= drafted_tokens, "a drafted token outside the vocabulary"
        if op != "chain":
            n = len(args["tokens"]) if op == "decode" else batch
            assert out[0].shape == (n, LM_ROWS) and bool(out[0].isfinite().all())
            assert out[1].shape == (n, HIDDEN) and bool(out[1].isfinite().all())
        if op == "decode":
            assert out[2] == out[0].numpy().argmax(-1).tolist(), "top tokens other than the logits' argmax"
    ok = refused_or(call, check)
    assert ok or not valid, f"refused valid indices: op={op} corrupt={corrupt} bad={bad}"
    assert all(torch.equal(args[k], v) for k, v in inputs.items()), "an input changed"
    written = torch.zeros(SLOTS, dtype=torch.bool)
    for b, p in runs or []:
        slot = _slot(args["table"], b, p, page_size) if page_size > 0 else None
        if slot is not None:
            written[slot] = True
    restore_pools(before, written)


if __name__ == "__main__":
    fuzz_drafting()
    print("fuzzed fuzz_drafting computed", COMPUTED.get("fuzz_drafting", 0), flush=True)

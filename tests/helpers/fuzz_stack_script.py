"""Property-based fuzzing of the native decoder stack (``ops.DecoderStack.forward``, hypothesis,
seeded): valid step metadata drawn at random - RoPE positions, KV slots, page tables,
sequence ids, key ranges, draft-tree blocks - then entries replaced by out-of-range values.
Every call either returns or raises ValueError; it returns exactly when every index is
valid, leaves its input unchanged and writes the KV pools at the step's own slots only,
refused or not. Run by tests/test_fuzz.py in a fresh interpreter (a crash fails that test,
not the run), and by tools/sanitize_check.sh under AddressSanitizer, which also catches a
read past any buffer. Prints one line per fuzzed function, as fuzz_ops_script does."""
import torch
from hypothesis import given
from hypothesis import strategies as st

from fuzz_ops_script import COMPUTED, SETTINGS, index, refused_or
from sonarspec_ext.ops.decoder_stack import DecoderStack, LayerTensors, ModelTensors

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 32, 2, 1, 16, 24, 2
PAGE, PAGES, MAX_POS = 4, 6, 40
SLOTS = PAGE * PAGES


def _stack():
    g = torch.Generator().manual_seed(0)
    w = lambda *shape: torch.randn(*shape, generator=g) * 0.2  # noqa: E731
    pools = [[torch.randn(SLOTS, KV_HEADS, HEAD_DIM, generator=g) for _ in range(2)] for _ in range(LAYERS)]
    layers = [LayerTensors(input_norm=1 + w(HIDDEN), post_norm=1 + w(HIDDEN),
                           qkv=w((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), qkv_bias=None,
                           o=w(HIDDEN, HEADS * HEAD_DIM), gate_up=w(2 * INTER, HIDDEN), down=w(HIDDEN, INTER),
                           k_pool=k, v_pool=v) for k, v in pools]
    angles = torch.arange(MAX_POS)[:, None] * 0.1 ** torch.arange(HEAD_DIM // 2)[None, :]
    model = ModelTensors(angles.cos().float(), angles.sin().float(), final_norm=1 + w(HIDDEN))
    return DecoderStack(layers, model, HEADS, KV_HEADS, 1e-6), pools


STACK, POOLS = _stack()
FIELDS = ["positions", "slots", "table", "seq", "begin", "end", "tree_begin", "tree_mask", "page_size"]


def _keys_valid(t, args, batch, pages, page_size, tree) -> bool:
    """Token t's keys (ops.paged_attention): its prefix [begin, end) of its sequence's
    page table, then the tree positions tree_begin + j of its mask's bits j - every page
    in the pool, and at least one key."""
    s, b, e = int(args["seq"][t]), int(args["begin"][t]), int(args["end"][t])
    span = pages * page_size
    if not (0 <= s < batch and b >= 0 and e <= span):
        return False
    page_ids = [int(args["table"][s, p]) for p in range(b // page_size, (e - 1) // page_size + 1)] if b < e else []
    if tree:
        tb, bits = int(args["tree_begin"][t]), int(args["tree_mask"][t]) % (1 << 64)
        for j in (tb + j for j in range(64) if bits >> j & 1):
            if not 0 <= j < span:
                return False
            page_ids.append(int(args["table"][s, j // page_size]))
    return bool(page_ids) and all(0 <= p < SLOTS // page_size for p in page_ids)


def restore_pools(before, written) -> None:
    """Asserts that the KV pools changed only at the `written` slots since `before` (their
    copies), then restores them: the next example starts from the same pools."""
    for pair, old in zip(POOLS, before):
        for pool, pool_before in zip(pair, old):
            assert torch.equal(pool[~written], pool_before[~written]), "a KV write outside the call's slots"
            pool.copy_(pool_before)


@SETTINGS
@given(m=st.integers(1, 5), batch=st.integers(1, 3), pages=st.integers(1, 3), tree=st.booleans(),
       seed=st.integers(0, 10 ** 6), corrupt=st.lists(st.sampled_from(FIELDS), max_size=2),
       bad=st.lists(index(-3, 45), min_size=2, max_size=2))
def fuzz_decoder_stack(m, batch, pages, tree, seed, corrupt, bad):
    g = torch.Generator().manual_seed(seed)
    rand = lambda lo, hi, n: torch.randint(lo, hi, (n,), generator=g)  # noqa: E731
    span = pages * PAGE
    x = torch.randn(m, HIDDEN, generator=g)
    args = dict(positions=rand(0, MAX_POS, m), slots=rand(-1, SLOTS, m),
                table=torch.randperm(PAGES, generator=g)[:batch * pages].view(batch, pages) if batch * pages <= PAGES
                else rand(0, PAGES, batch * pages).view(batch, pages), seq=rand(0, batch, m))
    args["end"] = rand(1, span + 1, m)
    args["begin"] = (args["end"] - rand(1, span + 1, m)).clamp_min(0)
    if tree:   # tree keys: positions tree_begin + j for the bits j of each query's mask
        args["end"] = torch.minimum(args["end"], args["begin"] + 1)
        args["tree_begin"] = args["end"]
        args["tree_mask"] = rand(0, 1 << max(1, span - int(args["end"].max())), m)
    page_size = PAGE
    for field, value in zip(corrupt, bad):
        if field == "page_size":
            page_size = value
        elif field in args:
            t = args[field].view(-1)
            t[abs(value) % t.numel()] = value
    valid = 0 < page_size and bool(((args["positions"] >= 0) & (args["positions"] < MAX_POS)).all())
    valid &= bool((args["slots"] < SLOTS).all())   # negative slots: padding, not written
    valid = valid and all(_keys_valid(t, args, batch, pages, page_size, tree) for t in range(m))
    before = [[p.clone() for p in pair] for pair in POOLS]
    x_before = x.clone()
    extra = (args["tree_begin"], args["tree_mask"]) if tree else ()

    def check(out):
        assert valid, f"accepted invalid indices: corrupt={corrupt} bad={bad}"
        assert out.shape == (m, HIDDEN) and bool(out.isfinite().all())
    ok = refused_or(lambda: STACK.forward(x, args["positions"], args["slots"], args["table"], page_size, args["seq"],
                                          args["begin"], args["end"], *extra), check)
    assert ok or not valid, f"refused valid indices: corrupt={corrupt} bad={bad}"
    assert torch.equal(x, x_before), "the input changed"
    written = torch.zeros(SLOTS, dtype=torch.bool)
    written[args["slots"][(args["slots"] >= 0) & (args["slots"] < SLOTS)]] = True
    restore_pools(before, written)


if __name__ == "__main__":
    fuzz_decoder_stack()
    print("fuzzed fuzz_decoder_stack computed", COMPUTED.get("fuzz_decoder_stack", 0), flush=True)

"""Property-based fuzzing of the public ops (hypothesis, seeded): random shapes, dtypes,
devices (cpu, meta) and index values, out-of-range ones included. Every call either
matches the torch reference or raises ValueError. Run by tests/test_fuzz.py in a fresh
interpreter, so a crash fails that test instead of the whole run; prints one line per op."""
import sys

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sonarspec_ext import ops
from sonarspec_ext.ops import elementwise
from sonarspec_ext.testing.reference import (chain_speculative_sampling_reference, kv_store_reference,
                                         paged_attention_reference, shifted_scatter_reference,
                                         tree_speculative_sampling_reference)

EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 150
SETTINGS = settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
                    suppress_health_check=list(HealthCheck))
HUGE = st.sampled_from([1 << 40, -(1 << 40), (1 << 63) - 1, -(1 << 63)])


def index(lo, hi):
    """Mostly in [lo, hi], sometimes enormous."""
    return st.one_of(st.integers(lo, hi), st.integers(lo, hi), st.integers(lo, hi), HUGE)


def device():
    return st.sampled_from(["cpu", "cpu", "cpu", "meta"])


COMPUTED = {}   # op -> examples that returned a result (checked against the reference)


def refused_or(fn, check):
    """fn() raises ValueError, or its result passes check(result)."""
    try:
        out = fn()
    except ValueError:
        return False
    check(out)
    name = sys._getframe(1).f_code.co_name
    COMPUTED[name] = COMPUTED.get(name, 0) + 1
    return True


@SETTINGS
@given(n=st.integers(0, 12), blocks=st.lists(st.tuples(index(-2, 14), index(-1, 14), index(-2, 14),
                                                       st.integers(0, 99)), max_size=4), dev=device())
def fuzz_shifted_scatter(n, blocks, dev):
    ids = torch.arange(n, device=dev)
    cols = [torch.tensor([b[i] for b in blocks], dtype=torch.int64, device=dev) for i in range(4)]
    starts, lens, acc, nxt = cols
    valid = dev == "cpu" and all(0 <= s and 1 <= ln and s + ln <= n for s, ln, _, _ in blocks)
    spans = sorted((s, s + ln) for s, ln, _, _ in blocks) if valid else []
    disjoint = all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))

    def check(out):
        assert valid, "accepted invalid blocks"
        if disjoint:
            assert torch.equal(out, shifted_scatter_reference(ids, starts, lens, nxt, acc))
    ok = refused_or(lambda: ops.shifted_scatter(ids, starts, lens, nxt, acc), check)
    assert ok or not valid, "refused valid blocks"


@SETTINGS
@given(slots=st.integers(1, 8), tokens=st.integers(0, 6), heads=st.integers(1, 3), dim=st.integers(1, 8),
       mapping=st.lists(st.integers(-1, 7), min_size=6, max_size=6), bad=st.one_of(st.none(), index(-3, 12)),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       src_dtype_same=st.sampled_from([True, True, True, False]), dev=device())
def fuzz_kv_store(slots, tokens, heads, dim, mapping, bad, dtype, src_dtype_same, dev):
    kp, vp = (torch.zeros(slots, heads, dim, dtype=dtype, device=dev) for _ in range(2))
    k, v = (torch.randn(tokens, heads, dim, device=dev).to(dtype if src_dtype_same else torch.float64)
            for _ in range(2))
    mapping = [m % slots if m >= 0 else -1 for m in mapping[:tokens]]   # valid, padding included
    if bad is not None and tokens:
        mapping[bad % tokens if bad >= 0 else 0] = bad
    sm = torch.tensor(mapping, dtype=torch.int64, device=dev)
    valid = dev == "cpu" and src_dtype_same and all(m < slots for m in mapping)
    if valid:
        rk, rv = kp.clone(), vp.clone()
        kv_store_reference(rk, rv, k, v, sm)

    def check(_):
        assert valid, "accepted invalid slots or dtypes"
        assert torch.equal(kp, rk) and torch.equal(vp, rv), "kv_store wrote what the reference does not"
    ok = refused_or(lambda: ops.kv_store(kp, vp, k, v, sm), check)
    assert ok == valid, "refused valid slots"


@SETTINGS
@given(T=st.integers(1, 4), Hkv=st.integers(1, 2), group=st.sampled_from([1, 2, 17]), D=st.sampled_from([4, 8]),
       B=st.integers(1, 3), P=st.integers(1, 3), ps=st.integers(1, 4), spare=st.integers(0, 2),
       seed=st.integers(0, 1000), corrupt=st.sampled_from([None, None, "table", "seq", "begin", "end"]),
       bad=index(-3, 16), dev=device())
def fuzz_paged_attention(T, Hkv, group, D, B, P, ps, spare, seed, corrupt, bad, dev):
    """Valid metadata drawn at random, then (``corrupt``) one entry replaced by ``bad``."""
    H, num_pages = Hkv * group, B * P + spare
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, H, D, generator=g).to(dev)
    kp, vp = (torch.randn(num_pages * ps, Hkv, D, generator=g).to(dev) for _ in range(2))
    table = torch.randperm(num_pages, generator=g)[:B * P].view(B, P)
    ts = torch.randint(0, B, (T,), generator=g)
    ke = torch.randint(1, P * ps + 1, (T,), generator=g)
    kb = (ke - torch.randint(1, P * ps + 1, (T,), generator=g)).clamp_min(0)
    if corrupt is not None:
        target = {"table": table.view(-1), "seq": ts, "begin": kb, "end": ke}[corrupt]
        target[bad % target.numel() if bad >= 0 else 0] = bad
    valid = dev == "cpu"
    for t in range(T):
        s, b, e = int(ts[t]), int(kb[t]), int(ke[t])
        if not (0 <= s < B and 0 <= b < e <= P * ps):
            valid = False
            continue
        pages = table[s, b // ps:(e - 1) // ps + 1]
        valid &= bool(((pages >= 0) & (pages < num_pages)).all())

    def check(out):
        assert valid, "accepted invalid indices"
        pos = torch.arange(P * ps)
        kv_slots = table.clamp(0, num_pages - 1)[:, pos // ps] * ps + pos % ps
        ref = paged_attention_reference(q, kp, vp, kv_slots, ts, kb, ke, D ** -0.5)
        torch.testing.assert_close(out, ref, rtol=2e-5, atol=2e-5)
    ok = refused_or(lambda: ops.paged_attention(q, kp, vp, table.to(dev), ps, ts.to(dev), kb.to(dev), ke.to(dev),
                                                D ** -0.5), check)
    assert ok or not valid, "refused valid indices"


@SETTINGS
@given(M=st.integers(0, 10), K=st.integers(1, 40), N=st.integers(1, 70), bf16=st.booleans(),
       bias=st.sampled_from(["none", "n", "one", "three"]), dev=device())
def fuzz_padded_linear(M, K, N, bf16, bias, dev):
    x = torch.randn(M, K)
    w = torch.randn(N, K).to(torch.bfloat16 if bf16 else torch.float32)
    b = {"none": None, "n": torch.randn(N), "one": torch.randn(1), "three": torch.randn(3)}[bias]
    w = w.to(dev)
    try:   # torch's own answer on the same devices (a meta weight gives a meta result)
        ref = F.linear(x.bfloat16().float() if bf16 else x, w.float(), b)
    except (RuntimeError, NotImplementedError):
        ref = None
    try:
        out = ops.kernel_linear(x, w, b)
    except (ValueError, RuntimeError, NotImplementedError):
        assert ref is None, "refused what F.linear computes"
        return
    COMPUTED["fuzz_padded_linear"] = COMPUTED.get("fuzz_padded_linear", 0) + 1
    assert ref is not None, "computed what F.linear refuses"
    assert out.shape == ref.shape and out.device == ref.device
    if dev == "cpu":
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-3)


@SETTINGS
@given(B=st.integers(0, 3), K=st.integers(0, 3), V=st.integers(1, 6), ids=st.lists(index(-2, 7), min_size=9,
                                                                                 max_size=9),
       point_mass=st.booleans(), int32=st.booleans(), dev=device())
def fuzz_chain_speculative_sampling(B, K, V, ids, point_mass, int32, dev):
    g = torch.Generator().manual_seed(B * 31 + K * 7 + V)
    p = torch.rand(B, K + 1, V, generator=g)
    p = (p / p.sum(-1, keepdim=True)).to(dev)
    q = None if point_mass else (lambda r: (r / r.sum(-1, keepdim=True)).to(dev))(torch.rand(B, K, V, generator=g))
    u = torch.rand(B, K + 1, generator=g, dtype=torch.float64).to(dev)
    raw = ids[:B * K]
    fits32 = all(-(1 << 31) <= i < (1 << 31) for i in raw)
    d = torch.tensor(raw, dtype=torch.int32 if int32 and fits32 else torch.int64).view(B, K).to(dev)
    valid = dev == "cpu" and all(0 <= i < V for i in raw)

    def check(out):
        assert valid, "accepted invalid draft ids"
        ref = chain_speculative_sampling_reference(q, d.long(), p, u)
        assert all(torch.equal(a, b) for a, b in zip(out, ref))
    ok = refused_or(lambda: ops.chain_speculative_sampling(q, d, p, uniforms=u), check)
    assert ok or not valid, "refused valid drafts"



@SETTINGS
@given(B=st.integers(0, 3), N=st.integers(0, 5), V=st.integers(0, 5), cands=st.lists(index(-2, 6), min_size=15,
                                                                                     max_size=15),
       links=st.lists(st.integers(-2, 6), min_size=30, max_size=30), point_mass=st.booleans(), dev=device())
def fuzz_tree_speculative_sampling(B, N, V, cands, links, point_mass, dev):
    g = torch.Generator().manual_seed(B * 31 + N * 7 + V)
    p = torch.rand(B, N, V, generator=g) + 1e-3
    p = (p / p.sum(-1, keepdim=True)).to(dev)
    q = None if point_mass else (lambda r: (r / r.sum(-1, keepdim=True)).to(dev))(torch.rand(B, N, V, generator=g) + 1e-3)
    u = torch.rand(B, N + 1, generator=g, dtype=torch.float64).to(dev)
    rows = lambda values: [values[b * N:(b + 1) * N] for b in range(B)]   # noqa: E731
    c_rows, fc_rows, ns_rows = rows(cands), rows(links[:15]), rows(links[15:])
    c, fc, ns = (torch.tensor(r, dtype=torch.int64).view(B, N).to(dev) for r in (c_rows, fc_rows, ns_rows))
    later = all(x == -1 or i < x < N for r in fc_rows + ns_rows for i, x in enumerate(r))
    valid = dev == "cpu" and N >= 1 and V >= 1 and later and all(0 <= x < V for r in c_rows for x in r[1:])

    def check(out):
        assert valid, "accepted an invalid tree"
        ref = tree_speculative_sampling_reference(c, fc, ns, p, q, u)
        assert all(torch.equal(a, b) for a, b in zip(out, ref))
    ok = refused_or(lambda: ops.tree_speculative_sampling(c, fc, ns, p, q, uniforms=u), check)
    assert ok or not valid, "refused a valid tree"


@SETTINGS
@given(T=st.integers(0, 4), H=st.integers(1, 3), D=st.integers(0, 9), wrong=st.integers(0, 4), dev=device())
def fuzz_elementwise(T, H, D, wrong, dev):
    """rms_norm, silu_and_mul and apply_rope against their torch formulas; a wrong weight,
    odd width or cos / sin shape refused."""
    g = torch.Generator().manual_seed(T * 100 + H * 10 + D)
    x = torch.randn(T, H, D, generator=g).to(dev)
    w = torch.randn(D + (wrong == 1), generator=g).to(dev)
    cos, sin = (torch.randn(T + (wrong == 2), 1, D // 2, generator=g).to(dev) for _ in range(2))

    def close(a, b):
        if dev == "cpu":
            assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    def rms_ref(out):
        assert wrong != 1, "accepted a wrong weight"
        close(out, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    assert refused_or(lambda: elementwise.rms_norm(x, w, 1e-6), rms_ref) or wrong == 1, "refused rms_norm"

    def silu_ref(out):
        assert D % 2 == 0, "accepted an odd width"
        gate, up = x.chunk(2, dim=-1) if D else (x, x)
        close(out, torch.nn.functional.silu(gate) * up)
    assert refused_or(lambda: elementwise.silu_and_mul(x), silu_ref) or D % 2, "refused an even width"

    def rope_ref(out):
        assert D % 2 == 0 and wrong != 2, "accepted a wrong shape"
        x1, x2 = x.chunk(2, dim=-1) if D else (x, x)
        close(out, torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
    assert refused_or(lambda: elementwise.apply_rope(x, cos, sin), rope_ref) or D % 2 or wrong == 2, "refused rope"


if __name__ == "__main__":
    for name, fn in list(globals().items()):
        if name.startswith("fuzz_"):
            fn()
            print("fuzzed", name, "computed", COMPUTED.get(name, 0), flush=True)

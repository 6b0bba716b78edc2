"""The planner's prefix cache: which pages a finished sequence leaves cached, which a new
request finds, references and eviction - and, over random workloads with shared prefixes,
preemption and eviction, every position a step reads holding its own token (a simulated
KV pool in which each slot stores the token written there)."""
import functools
import random

import pytest

from helpers.planners import make_planner

PS = 4
planner = functools.partial(make_planner, page_size=PS, caching=True)


def run_to_end(p, sid, tokens):
    """Admits and prefills ``sid`` (its prompt: ``tokens``); returns its plan entry."""
    p.add_request(sid, len(tokens), tokens)
    seqs, _, cached = p.schedule(0)
    (entry,) = [s for s in seqs if s[0] == sid]
    return entry, dict(cached)


def test_finished_pages_are_found_by_a_request_with_the_same_first_tokens():
    p = planner()
    a = list(range(100, 111))            # 11 tokens: pages 0 and 1 full, the token after page 1 known
    run_to_end(p, 0, a)
    table = p.page_table(0)
    p.finish(0, a, len(a))
    assert p.num_cached_pages == 2 and p.num_free_pages == 32
    entry, cached = run_to_end(p, 1, a + [7, 8])
    assert entry == (1, 8, 5) and cached == {1: 8}
    assert p.page_table(1)[:2] == table[:2]
    # the same prompt again: one token must still be computed, and page 1 needs token 8 after it
    entry, cached = run_to_end(p, 2, a[:9])
    assert entry == (2, 8, 1) and cached == {2: 8}
    entry, cached = run_to_end(p, 3, a[:8])
    assert entry == (3, 4, 4) and cached == {3: 4}


@pytest.mark.parametrize("differs_at, found", [(0, 0), (3, 0), (4, 0), (5, 4), (8, 4), (9, 8)])
def test_a_page_matches_only_with_its_tokens_and_the_next_one(differs_at, found):
    p = planner()
    a = list(range(100, 112))
    run_to_end(p, 0, a)
    p.finish(0, a, len(a))
    b = list(a)
    b[differs_at] = 5
    entry, cached = run_to_end(p, 1, b)
    assert entry == (1, found, len(b) - found) and cached.get(1, 0) == found


def test_only_pages_with_valid_kv_and_a_known_next_token_are_cached():
    for num_valid, tokens, want in [(12, 12, 2), (7, 12, 1), (12, 8, 1), (3, 12, 0)]:
        p = planner()
        a = list(range(100, 112))
        run_to_end(p, 0, a)
        p.finish(0, a[:tokens], num_valid)
        assert p.num_cached_pages == want, (num_valid, tokens)
    p = planner()
    run_to_end(p, 0, a)
    p.finish(0)   # no tokens: nothing cached
    assert p.num_cached_pages == 0 and p.num_free_pages == 32
    p = planner(caching=False)
    run_to_end(p, 0, a)
    p.finish(0, a, len(a))
    assert p.num_cached_pages == 0 and p.num_free_pages == 32


def test_shared_pages_are_held_by_every_sequence_and_freed_after_the_last():
    p = planner(num_pages=8)
    a = list(range(100, 113))
    run_to_end(p, 0, a)
    p.finish(0, a, len(a))                # pages 0..2 cached (12 positions, token 12 known)
    run_to_end(p, 1, a + [1])
    run_to_end(p, 2, a + [2])
    assert p.page_table(1)[:3] == p.page_table(2)[:3]
    assert p.num_free_pages == 8 - 3 - 2        # the shared three, then one own page each
    p.finish(1)
    assert p.num_free_pages == 8 - 3 - 1        # still held by sequence 2
    p.finish(2)
    assert p.num_free_pages == 8 and p.num_cached_pages == 3


def admit_past_deferrals(p, sid, tokens):
    """Queues ``sid`` and plans until it is admitted (a running sequence computing the same
    pages defers it at most 4 plans); returns (its plan entry, plans it waited)."""
    p.add_request(sid, len(tokens), tokens)
    for waited in range(10):
        seqs = [s for s in p.schedule(0)[0] if s[0] == sid]
        if seqs:
            return seqs[0], waited
    raise AssertionError(f"sequence {sid} was never admitted")


def test_a_request_waits_for_the_pages_a_running_one_computes():
    p = planner()
    a = list(range(100, 113))
    run_to_end(p, 0, a)
    p.add_request(1, 15, a + [1, 2])
    p.add_request(2, 5, list(range(300, 305)))   # shares nothing: admitted past the waiting one
    assert p.schedule(0) == ([(2, 0, 5)], [], []) and p.num_waiting == 1
    p.cache_prefix(0, a, 12)               # 0's pages filled
    assert p.schedule(0) == ([(1, 12, 3)], [], [(1, 12)])


def test_a_request_waits_as_long_as_a_chunked_prefill_fills_pages_for_it():
    p = planner(budget=8)                  # 8 tokens a step: a 40-token prompt takes 5 steps
    a = list(range(100, 140))
    p.add_request(0, 40, a)
    p.add_request(1, 41, a + [1])
    for step in range(5):
        seqs, _, cached = p.schedule(0)
        assert seqs == [(0, 8 * step, 8)] and cached == []   # 1 waits while 0's pages fill
        p.cache_prefix(0, a, 8 * step + 8)
    assert p.schedule(0) == ([(1, 36, 5)], [], [(1, 36)])   # 36: page 9 needs token 40 to match


def test_a_prefix_computed_twice_is_cached_once():
    p = planner()
    a = list(range(100, 109))
    run_to_end(p, 0, a)
    entry, waited = admit_past_deferrals(p, 1, a)   # 0 never offers its pages: computed again
    assert entry == (1, 0, 9) and waited == 4
    p.finish(0, a, len(a))
    p.finish(1, a, len(a))
    assert p.num_cached_pages == 2 and p.num_free_pages == 32


def test_cached_pages_are_evicted_least_recently_released_first():
    p = planner(num_pages=6)
    old, new = list(range(100, 109)), list(range(200, 209))
    for sid, toks in ((0, old), (1, new)):    # 3 pages each, 2 of them cached
        run_to_end(p, sid, toks)
        p.finish(sid, toks, len(toks))
    assert p.num_cached_pages == 4 and p.num_free_pages == 6
    run_to_end(p, 2, list(range(300, 311)))   # 11 tokens: 3 pages, 2 free + 1 evicted
    assert p.num_cached_pages == 3
    p.finish(2)
    assert run_to_end(p, 3, old)[1] == {3: 4}   # old's last page went first
    assert run_to_end(p, 4, new)[1] == {4: 8}


def test_a_request_that_cannot_be_admitted_gives_matched_pages_back():
    p = planner(num_pages=4, max_len=64)
    a = list(range(100, 109))
    run_to_end(p, 0, a)
    p.finish(0, a, len(a))                 # 3 pages: 2 cached, 1 freed
    run_to_end(p, 1, list(range(300, 306)))   # takes the 2 free pages
    p.add_request(9, 12, a + [1, 2, 3])    # finds 2 pages, needs 1 more: none left
    assert p.schedule(0) == ([], [], []) and p.num_waiting == 1
    assert p.num_cached_pages == 2 and p.num_free_pages == 2   # the matched pages given back
    p.finish(1)
    assert p.schedule(0) == ([(9, 8, 4)], [], [(9, 8)])


def test_running_sequences_offer_their_full_pages():
    p = planner()
    a = list(range(100, 113))
    run_to_end(p, 0, a)
    p.cache_prefix(0, a, 12)               # pages 0..2 hold valid KV, token 12 follows them
    assert p.num_cached_pages == 3 and p.num_free_pages == 32 - 4
    entry, cached = run_to_end(p, 1, a + [1, 2])
    assert entry == (1, 12, 3) and cached == {1: 12} and p.page_table(1)[:3] == p.page_table(0)[:3]
    p.cache_prefix(0, a, 12)               # again: nothing changes
    assert p.num_cached_pages == 3
    p.finish(0)                            # its own last page freed, the shared ones still held
    assert p.num_free_pages == 32 - 4 and p.num_cached_pages == 3
    p.finish(1, a + [1, 2], 14)            # page 3 (positions 12..15) lacks valid KV: freed
    assert p.num_free_pages == 32 and p.num_cached_pages == 3


def test_offering_stops_at_a_page_another_holds_and_never_passes_the_computed_tokens():
    p = planner()
    a = list(range(100, 113))
    run_to_end(p, 0, a)
    admit_past_deferrals(p, 1, a)          # the same prompt, computed again
    p.cache_prefix(0, a, 12)
    p.cache_prefix(1, a, 12)               # its pages duplicate 0's: they stay its own
    assert p.num_cached_pages == 3 and p.num_free_pages == 32 - 8
    p.finish(1, a, 12)
    assert p.num_free_pages == 32 - 4 and p.num_cached_pages == 3
    p.add_request(2, 10, list(range(200, 210)))
    assert p.schedule(0) == ([(2, 0, 10)], [], [])
    p.cache_prefix(2, list(range(200, 210)), 100)   # clamped to its 10 computed tokens
    assert p.num_cached_pages == 3 + 2


def test_reset_frees_what_no_sequence_holds():
    p = planner()
    a, b = list(range(100, 113)), list(range(200, 213))
    run_to_end(p, 0, a)
    p.finish(0, a, 12)                     # 3 cached pages, free to evict
    run_to_end(p, 1, b)
    p.cache_prefix(1, b, 12)               # 3 cached pages held by running sequence 1
    assert p.num_cached_pages == 6 and p.reset_prefix_cache() == 3 and p.num_cached_pages == 3
    assert run_to_end(p, 2, a)[1] == {}    # a's pages are gone
    p.finish(1, b, 12)
    p.finish(2)
    assert p.num_free_pages == 32 and p.reset_prefix_cache() == 3 and p.num_cached_pages == 0
    assert planner(caching=False).reset_prefix_cache() == 0


def test_bad_finish_arguments_are_value_errors():
    p = planner()
    run_to_end(p, 0, [1, 2, 3])
    with pytest.raises(ValueError, match="cannot cache"):
        p.finish(0, [1, 2, 3, 4], 4)
    with pytest.raises(ValueError, match="token ids"):
        p.add_request(1, 5, [1, 2])
    with pytest.raises(ValueError, match="cannot cache"):
        p.cache_prefix(0, [1, 2, 3, 4], 3)


def _simulate(seed: int, caching: bool):
    """A random workload over prompts built from a few shared prefixes. ``kv`` maps each
    slot to the token written there; every step asserts that the positions before its first
    scheduled one hold the sequence's own tokens, then writes its tokens. Returns (steps,
    tokens found in the cache, preemptions)."""
    rng = random.Random(seed)
    p = planner(num_pages=24, caching=caching, max_num_seqs=6, budget=40, max_len=120)
    prefixes = [[rng.randrange(50) for _ in range(rng.randint(3, 30))] for _ in range(4)]
    kv, toks, left = {}, {}, {}
    hits = preemptions = next_id = 0
    for it in range(500):
        if rng.random() < 0.4 and len(toks) < 10:
            prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randint(1, 12))]
            p.add_request(next_id, len(prompt), prompt)
            toks[next_id], left[next_id] = prompt, rng.randint(1, 25)
            next_id += 1
        seqs, pre, cached = p.schedule(rng.choice([0, 2]))
        preemptions += len(pre)
        hits += sum(n for _, n in cached)
        for sid, start, n in seqs:
            table = p.page_table(sid)
            slot = lambda pos: table[pos // PS] * PS + pos % PS  # noqa: E731
            assert [kv.get(slot(i)) for i in range(start)] == toks[sid][:start], (it, sid)
            for i in range(start, start + n):
                kv[slot(i)] = toks[sid][i]
            if rng.random() < 0.3:   # offer the pages filled so far
                p.cache_prefix(sid, toks[sid], start + n)
            if start + n == len(toks[sid]):    # decoded: one new token
                toks[sid].append(rng.randrange(50))
                p.append_tokens(sid, 1)
                left[sid] -= 1
                if left[sid] == 0 or rng.random() < 0.05:
                    # KV is valid through the tokens fed so far: all but the new one
                    p.finish(sid, toks[sid], len(toks[sid]) - 1)
                    del toks[sid], left[sid]
    for sid in list(toks):
        p.finish(sid)
    assert p.num_free_pages == 24
    return it, hits, preemptions


@pytest.mark.parametrize("seed", range(6))
def test_random_workloads_read_only_their_own_tokens(seed):
    _, hits, preemptions = _simulate(seed, caching=True)
    assert hits > 0
    _, hits_off, _ = _simulate(seed, caching=False)
    assert hits_off == 0


def test_random_workloads_preempt_and_evict():
    totals = [_simulate(seed, caching=True) for seed in range(6, 10)]
    assert sum(t[2] for t in totals) > 0

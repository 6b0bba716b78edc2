"""Property-based fuzzing of the native planner (``_C.Planner``; hypothesis, seeded): random
streams of calls - requests added (with token ids for the prefix cache), tokens appended,
sequences truncated, committed, cached and finished, steps scheduled (also on the worker
thread) - with sequence ids, counts and lengths sometimes unknown, negative, past the
sequence or at int32's limits, with and without prefix caching. Oracles: a call either
returns or raises ValueError, and a refused call changes nothing the planner reports; an
accepted one changes the counts as documented; after every call each page belongs to at
most one place (a live sequence's table, shared only as a cached prefix page, or the free
count) and every table covers its computed tokens; finishing every sequence and resetting
the cache returns every page. Run as fuzz_stack_script is."""
from hypothesis import given
from hypothesis import strategies as st

from fuzz_ops_script import COMPUTED, SETTINGS
from sonarspec_ext import _C

PAGES, PAGE_SIZE, MAX_LEN, IDS = 24, 4, 64, 2
INT32 = st.sampled_from([2 ** 31 - 1, -2 ** 31, 2 ** 30])
OPS = ["add", "add", "append", "append", "truncate", "commit", "cache", "finish", "finish", "schedule", "schedule",
       "schedule", "schedule_async", "reset"]


def value(lo, hi):
    return st.one_of(st.integers(lo, hi), st.integers(lo, hi), st.integers(lo, hi), INT32)


def _planner(caching):
    c = _C.PlannerConfig()
    c.num_pages, c.page_size, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len = (
        PAGES, PAGE_SIZE, 3, 24, MAX_LEN)
    c.enable_prefix_caching = caching
    return _C.Planner(c)


def _state(p):
    """What the planner reports: per live sequence (tokens, computed, page table), then the
    free and cached page counts and the queue lengths."""
    seqs = {s: (p.num_tokens(s), p.num_computed(s), tuple(p.page_table(s))) for s in range(-1, IDS + 1) if p.has(s)}
    return seqs, p.num_free_pages, p.num_cached_pages, p.num_running, p.num_waiting


def _check_pages(state, caching):
    seqs, free = state[0], state[1]
    held = [page for _, _, table in seqs.values() for page in table]
    assert all(0 <= page < PAGES for page in held), f"a page id outside the pool: {held}"
    for tokens, computed, table in seqs.values():
        assert tokens <= MAX_LEN, f"a sequence of {tokens} tokens, past max_model_len {MAX_LEN}"
        assert len(set(table)) == len(table), f"a page twice in one table: {table}"
        assert 0 <= computed <= tokens and len(table) * PAGE_SIZE >= computed, (tokens, computed, table)
    if not caching:   # with the cache, sequences share its prefix pages
        assert len(set(held)) == len(held), f"a page in two tables: {seqs}"
    assert len(set(held)) + free == PAGES, f"pages lost or counted twice: {len(set(held))} held, {free} free"


@SETTINGS
@given(caching=st.booleans(), calls=st.lists(st.tuples(st.sampled_from(OPS), st.integers(-1, IDS),
                                                      value(-3, MAX_LEN + 8), value(-3, MAX_LEN + 8),
                                                      st.booleans()), min_size=20, max_size=80))
def fuzz_planner(caching, calls):
    p = _planner(caching)
    tokens = {}   # each live sequence's token ids, as the engine would pass them to the cache

    def ids(n):   # every prompt shares its first tokens with every other: the cache has matches
        return [i % 5 for i in range(n)]
    for op, sid, a, b, typical in calls:
        before = _state(p)
        known = sid in before[0]
        cached = tokens.get(sid, []) if typical else tokens.get(sid, [])[:max(a, 0)]   # as the engine passes
        valid = len(cached) if typical else b
        try:
            if op == "add":
                p.add_request(sid, a, ids(a) if caching and 0 < a <= MAX_LEN else [])
            elif op == "append":
                p.append_tokens(sid, a)
            elif op == "truncate":
                p.truncate(sid, a)
            elif op == "commit":
                p.commit(sid, a)
            elif op == "cache":
                p.cache_prefix(sid, cached, valid)
            elif op == "finish":
                p.finish(sid, cached, valid)
            elif op == "schedule":
                plan = p.schedule(a)
            elif op == "schedule_async":
                plan = p.schedule_async(a).wait()
            else:
                p.reset_prefix_cache()
        except ValueError:
            assert _state(p) == before, f"a refused {op}{(sid, a, b)} changed the planner"
            continue
        after = _state(p)
        _check_pages(after, caching)
        seqs_before, seqs = before[0], after[0]
        if op == "add":
            assert not known and seqs[sid][:2] == (a, 0), (op, sid, a, seqs.get(sid))
            tokens[sid] = ids(a)
        elif op == "append":
            assert known and seqs[sid][0] == seqs_before[sid][0] + a and a >= 0, (op, sid, a)
            tokens[sid] += [a % 5] * a
        elif op == "truncate":
            assert known and seqs[sid][:2] == (a, min(a, seqs_before[sid][1])), (op, sid, a)
            del tokens[sid][a:]
        elif op == "commit":
            assert known and seqs[sid][1] == a, (op, sid, a)
        elif op == "finish":
            assert known and sid not in seqs
            del tokens[sid]
        elif op.startswith("schedule"):
            scheduled, preempted, _ = plan
            for s, start, n in scheduled:
                assert n >= 1 and seqs[s][1] == start + n, (plan, seqs)
            for s in preempted:
                assert seqs[s][1] == 0 and seqs[s][2] == (), (plan, seqs)
        elif op == "reset":
            assert seqs == seqs_before
        COMPUTED["fuzz_planner"] = COMPUTED.get("fuzz_planner", 0) + 1
    for sid in sorted(_state(p)[0]):
        p.finish(sid, tokens[sid], len(tokens[sid]))
    p.reset_prefix_cache()
    assert _state(p) == ({}, PAGES, 0, 0, 0), _state(p)


if __name__ == "__main__":
    fuzz_planner()
    print("fuzzed fuzz_planner computed", COMPUTED.get("fuzz_planner", 0), flush=True)

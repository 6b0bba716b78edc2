"""The native planner: page accounting, preemption, errors."""
import random

import pytest

from sonarspec_ext import _C
from helpers.planners import assert_same_metadata, make_planner as planner


def test_pages_cover_scheduled_tokens_and_lookahead():
    p = planner()
    p.add_request(7, 9)
    seqs, pre, cached = p.schedule(3)
    assert seqs == [(7, 0, 9)] and pre == [] and cached == []
    assert len(p.page_table(7)) == 3          # ceil((9 + 3) / 4)
    p.append_tokens(7, 1)
    assert p.schedule(3)[0] == [(7, 9, 1)]
    assert len(p.page_table(7)) == 4          # ceil((10 + 3) / 4)
    p.truncate(7, 5)
    assert p.num_computed(7) == 5 and p.num_tokens(7) == 5
    p.finish(7)
    assert p.num_free_pages == 32


def test_errors_are_value_errors_with_messages():
    p = planner(num_pages=4)
    p.add_request(1, 3)
    with pytest.raises(ValueError, match="already in use"):
        p.add_request(1, 3)
    with pytest.raises(ValueError, match="unknown sequence id 9"):
        p.finish(9)
    with pytest.raises(ValueError, match="KV pages"):
        p.add_request(2, 100)
    with pytest.raises(ValueError, match="max_model_len"):
        p.add_request(3, 1000)
    with pytest.raises(ValueError, match="at least one token"):
        p.add_request(4, 0)
    with pytest.raises(ValueError, match="cannot truncate"):
        p.truncate(1, 10)
    with pytest.raises(ValueError, match="max_model_len is 256"):
        p.append_tokens(1, 254)   # 3 + 254 tokens
    with pytest.raises(ValueError, match="cannot append -1"):
        p.append_tokens(1, -1)
    p.append_tokens(1, 253)
    assert p.num_tokens(1) == 256
    p.finish(1)
    with pytest.raises(ValueError, match="unknown"):
        p.finish(1)  # double free
    assert p.num_free_pages == 4


def test_random_workload_returns_every_page():
    rng = random.Random(0)
    p = planner(num_pages=48, page_size=4, max_num_seqs=6, budget=40, max_len=200)
    live, next_id, preemptions = {}, 0, 0
    for it in range(600):
        if rng.random() < 0.4 and len(live) < 20:
            n = rng.randint(1, 60)
            p.add_request(next_id, n)
            live[next_id] = rng.randint(1, 40)  # tokens still to generate
            next_id += 1
        seqs, pre, _ = p.schedule(rng.choice([0, 0, 2]))
        preemptions += len(pre)
        for sid, start, n in seqs:
            assert p.num_computed(sid) == start + n
            assert len(p.page_table(sid)) * 4 >= start + n
            if start + n == p.num_tokens(sid):
                live[sid] -= 1
                if live[sid] == 0:
                    p.finish(sid)
                    del live[sid]
                else:
                    p.append_tokens(sid, 1)
        if live and rng.random() < 0.05:
            sid = rng.choice(sorted(live))
            p.finish(sid)  # abort
            del live[sid]
        used = set()
        for sid in live:
            table = p.page_table(sid)
            assert not used & set(table), "a page is owned by two sequences"
            used |= set(table)
        assert len(used) + p.num_free_pages == 48
    for sid in list(live):
        p.finish(sid)
    assert p.num_free_pages == 48 and p.num_running == 0 and p.num_waiting == 0
    assert next_id > 150 and preemptions > 0


def _drive(planners, seed, iterations=500, lookahead=3):
    """Drives planners with the same random workload - admissions, decode steps whose
    drafts are accepted (commit) or rejected (truncate), aborts, preemption - checking
    after every step that they agree. planners[0] may schedule asynchronously."""
    rng = random.Random(seed)
    live, next_id, preemptions, steps = {}, 0, 0, 0
    for it in range(iterations):
        if rng.random() < 0.4 and len(live) < 24:
            n = rng.randint(1, 50)
            for p in planners:
                p.add_request(next_id, n)
            live[next_id] = rng.randint(1, 30)
            next_id += 1
        plans = [p.schedule(lookahead) if not hasattr(p, "schedule_async") or it % 2 else
                 p.schedule_async(lookahead).wait() for p in planners]
        assert all(pl == plans[0] for pl in plans), (it, plans)
        seqs, pre, _ = plans[0]
        preemptions += len(pre)
        steps += 1
        for sid, start, n in seqs:
            if start + n != planners[0].num_tokens(sid):
                continue
            drafts, accepted = rng.randint(0, lookahead), None
            accepted = rng.randint(0, drafts)
            live[sid] -= 1
            for p in planners:
                p.append_tokens(sid, 1 + accepted)        # accepted drafts plus one token
                p.commit(sid, start + n + accepted)       # KV valid through the accepted drafts
            if live[sid] <= 0:
                for p in planners:
                    p.finish(sid)
                del live[sid]
        if live and rng.random() < 0.05:
            sid = rng.choice(sorted(live))
            for p in planners:
                p.finish(sid)
            del live[sid]
        for sid in live:
            assert all(p.page_table(sid) == planners[0].page_table(sid) for p in planners)
        assert len({p.num_free_pages for p in planners}) == 1
    for sid in list(live):
        for p in planners:
            p.finish(sid)
    assert all(p.num_free_pages == planners[0].num_free_pages for p in planners)
    return next_id, preemptions


@pytest.mark.parametrize("seed", [1, 2])
def test_native_planner_matches_the_python_reference_sync_and_async(seed):
    from sonarspec_ext.testing.reference_planner import ReferencePlanner
    native = planner(num_pages=40, page_size=4, max_num_seqs=6, budget=48, max_len=400)
    ref = ReferencePlanner(40, 4, 6, 48, 400)
    n, preemptions = _drive([native, ref], seed)
    assert native.num_free_pages == 40 and n > 100 and preemptions > 0


def test_async_errors_surface_at_wait_and_plans_keep_call_order():
    p = planner()
    with pytest.raises(ValueError, match="lookahead"):
        p.schedule_async(-1).wait()
    p.add_request(1, 5)
    h1, h2 = p.schedule_async(0), p.schedule_async(0)
    assert h2.wait() == ([], [], []) and h1.wait() == ([(1, 0, 5)], [], []) and h1.ready


def test_waiting_on_a_later_plan_never_computes_it_before_an_earlier_one():
    # The worker thread and a waiter both take plans off the queue; a later plan computed
    # before an earlier one the worker had already taken would steal its work. The race
    # is narrow, so many fresh planners are tried.
    for _ in range(3000):
        p = planner()
        p.add_request(1, 5)
        handles = [p.schedule_async(0) for _ in range(3)]
        plans = [h.wait() for h in reversed(handles)][::-1]
        assert plans == [([(1, 0, 5)], [], []), ([], [], []), ([], [], [])]


def test_native_metadata_matches_the_python_reference():
    import numpy as np
    from sonarspec_ext.runtime.metadata import TreeBlock
    from sonarspec_ext.testing.reference_planner import build_metadata_reference
    rng = np.random.default_rng(0)
    for trial in range(60):
        page_size = int(rng.choice([1, 3, 16]))
        rows, trees = [], []
        for b in range(int(rng.integers(1, 7))):
            start, n = int(rng.integers(0, 60)), int(rng.integers(1, 9))
            table = rng.permutation(200)[:-(-(start + n) // page_size) + int(rng.integers(0, 3))].tolist()
            rows.append((start, n, table))
            tree = None
            if trial % 2 and rng.random() < 0.5:
                begin = max(0, start - int(rng.integers(0, 5)))
                bits = rng.integers(0, 2 ** 62, n, dtype=np.int64) & ((1 << (start + n - begin)) - 1)
                tree = TreeBlock(begin, bits, begin + rng.integers(0, 6, n))
            trees.append(tree)
        window = int(rng.choice([0, 4, 20]))
        use_trees = trees if any(t is not None for t in trees) else None
        for want_mask in (False, True):
            got = _C.build_metadata(rows, None if use_trees is None else [
                None if t is None else (t.begin, t.bits, t.positions) for t in use_trees], page_size, window, want_mask)
            want = build_metadata_reference(rows, page_size, window or None, use_trees, want_mask)
            assert_same_metadata(got, want, trial)
    with pytest.raises(ValueError, match="cannot hold"):
        _C.build_metadata([(10, 3, [0, 1])], None, 4, 0, True)


def test_metadata_refuses_values_outside_int32_and_bad_ids():
    import numpy as np
    bad = {"row 0: start must fit in 32 bits, got 4294967296": [(2 ** 32, 1, [0])],
           "row 1: num_query must be an integer": [(0, 1, [0]), (0, "2", [0])],
           "row 0: page ids must be >= 0": [(0, 1, [-5])],
           "row 0: needs \\(start, num_query, page_table\\)": [(0, 1)]}
    for message, rows in bad.items():
        with pytest.raises(ValueError, match=message):
            _C.build_metadata(rows, None, 4, 0, True)
    with pytest.raises(ValueError, match="row 0: tree positions must be in"):
        _C.build_metadata([(4, 1, [0, 1])], [(4, np.array([1]), np.array([-1]))], 4, 0, True)
    p = planner(num_pages=8, page_size=4)
    p.add_request(1, 5)
    p.schedule(0)
    for starts, nums, message in (([2 ** 32], [1], "row 0: start must fit"), ([0], [2 ** 32 + 1], "row 0: num_query")):
        with pytest.raises(ValueError, match=message):   # was read as 0 / 1 before: int64 cut to int32
            p.build_metadata(np.array([1]), np.array(starts), np.array(nums), None, 0, True)


def test_planner_metadata_reads_its_own_page_tables_in_flashinfer_layout():
    import numpy as np
    p = planner(num_pages=32, page_size=4)
    p.add_request(3, 9)
    p.add_request(5, 2)
    seqs = p.schedule(2)[0]
    ids, starts, nums = (np.array([s[i] for s in seqs]) for i in range(3))
    got = p.build_metadata(ids, starts, nums, None, 0, True)
    want = _C.build_metadata([(s, n, p.page_table(i)) for i, s, n in seqs], None, 4, 0, True)
    assert all(np.array_equal(got[k], want[k]) for k in want if isinstance(want[k], np.ndarray))
    t3, t5 = p.page_table(3), p.page_table(5)
    assert got["qo_indptr"].tolist() == [0, 9, 11] and got["kv_indptr"].tolist() == [0, 3, 4]
    assert got["kv_indices"].tolist() == t3[:3] + t5[:1] and got["kv_last_page_len"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="unknown sequence id 9"):
        p.build_metadata(np.array([9]), np.array([0]), np.array([1]), None, 0, False)

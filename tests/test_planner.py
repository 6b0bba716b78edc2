"""The native planner: page accounting, preemption, errors."""
import random

import pytest

from sonarspec_ext import _C


def planner(num_pages=32, page_size=4, max_num_seqs=8, budget=64, max_len=256):
    c = _C.PlannerConfig()
    c.num_pages, c.page_size, c.max_num_seqs, c.max_num_batched_tokens, c.max_model_len = (
        num_pages, page_size, max_num_seqs, budget, max_len)
    return _C.Planner(c)


def test_pages_cover_scheduled_tokens_and_lookahead():
    p = planner()
    p.add_request(7, 9)
    seqs, pre = p.schedule(3)
    assert seqs == [(7, 0, 9)] and pre == []
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
        seqs, pre = p.schedule(rng.choice([0, 0, 2]))
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

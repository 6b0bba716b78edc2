"""The engine after a failure: a step that raises, an interrupt while waiting, bad
parameters, several calling threads, interleaved streams and stop strings in streams."""
import dataclasses
import threading

import pytest

from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.engine import engine as engine_module

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _consistent(llm):
    eng = llm.engine
    assert not eng.seqs and not eng.has_unfinished()
    assert eng.planner.num_free_pages == eng.kv_cache.num_pages


def test_a_failing_step_fails_only_its_requests(llama_dir, monkeypatch):
    llm = LLM(llama_dir, max_num_seqs=1)
    calls = {"n": 0}
    real = engine_module.generic_step

    def flaky(eng, batch, drafts):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected failure")
        return real(eng, batch, drafts)
    monkeypatch.setattr(engine_module, "generic_step", flaky)
    outs = llm.generate([[1, 2, 3], [4, 5, 6]], GREEDY)
    assert outs[0].finish_reason == "error" and "injected failure" in outs[0].error
    assert outs[1].finish_reason == "length" and len(outs[1].token_ids) == 12
    _consistent(llm)
    again = llm.generate([[4, 5, 6]], GREEDY)[0]
    assert again.token_ids == outs[1].token_ids


def test_a_step_failing_before_it_schedules_ends_the_requests(llama_dir, monkeypatch):
    """Planning that raises every time: the waiting requests end with the error instead of the
    engine retrying forever; it serves again once planning works."""
    llm = LLM(llama_dir, max_num_seqs=1)
    ref = llm.generate([[4, 5, 6]], GREEDY)[0].token_ids
    real_plan = llm.engine._plan

    def broken():
        raise RuntimeError("injected planning failure")
    monkeypatch.setattr(llm.engine, "_plan", broken)
    result = {}
    worker = threading.Thread(target=lambda: result.update(outs=llm.generate([[1, 2, 3], [4, 5, 6]], GREEDY)),
                              daemon=True)   # should it loop forever, the test still ends
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "generate did not return after a step failed before scheduling"
    assert [o.finish_reason for o in result["outs"]] == ["error", "error"]
    assert all("injected planning failure" in o.error for o in result["outs"])
    _consistent(llm)
    monkeypatch.setattr(llm.engine, "_plan", real_plan)
    assert llm.generate([[4, 5, 6]], GREEDY)[0].token_ids == ref


@pytest.mark.parametrize("method", ["none", "mtp"])
def test_interrupt_while_generating_rolls_back(llama_dir, heads, monkeypatch, method):
    spec = SpecConfig(method=method, draft=heads["random"] if method == "mtp" else None, num_draft_tokens=2)
    llm = LLM(llama_dir, spec=spec, max_num_seqs=1)
    ref = llm.generate([[7, 8, 9]], GREEDY)[0].token_ids
    real_step, calls = llm.engine._step, {"n": 0}

    def interrupted():
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real_step()
    monkeypatch.setattr(llm.engine, "_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[1, 2, 3], [7, 8, 9]], GREEDY)
    _consistent(llm)
    assert llm.generate([[7, 8, 9]], GREEDY)[0].token_ids == ref


def test_a_bad_second_prompt_leaves_nothing_queued(llama_dir):
    llm = LLM(llama_dir, max_num_seqs=1)
    with pytest.raises(ValueError, match="prompt 1: the text is not valid Unicode"):
        llm.generate(["fine", "lone \ud800 surrogate"], GREEDY)
    _consistent(llm)
    with pytest.raises(ValueError, match="got a str in the list|SamplingParams or a list"):
        llm.generate(["a"], {"max_tokens": 3})


def test_parameters_are_validated_where_they_are_made(llama_dir):
    with pytest.raises(ValueError, match="seed must be"):
        SamplingParams(seed=2 ** 64)
    with pytest.raises(ValueError, match="top_k must be"):
        SamplingParams(top_k=2 ** 63)
    p = SamplingParams(max_tokens=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.top_k = 2 ** 63
    llm = LLM(llama_dir)
    tiny = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=1e-45, seed=3, ignore_eos=True))
    greedy = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert tiny[0].token_ids == greedy[0].token_ids


@pytest.mark.parametrize("method", ["none", "mtp"])
def test_several_threads_share_one_llm(llama_dir, heads, method):
    spec = SpecConfig(method=method, draft=heads["trained"] if method == "mtp" else None, num_draft_tokens=3)
    llm = LLM(llama_dir, spec=spec)
    prompts = [[i + 1, 2 * i + 3, 5] for i in range(12)]
    ref = [o.token_ids for o in llm.generate(prompts, GREEDY)]
    results, errors = {}, []

    def work(k):
        try:
            mine = prompts[k::3]
            results[k] = [o.token_ids for o in llm.generate(mine, GREEDY)]
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and not any(t.is_alive() for t in threads)
    for k in range(3):
        assert results[k] == ref[k::3]
    _consistent(llm)


def test_interleaved_streams_deliver_everything(llama_dir):
    llm = LLM(llama_dir)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    ref = [llm.generate([p], params)[0].text for p in ("def f", "class A")]
    a, b = llm.stream("def f", params), llm.stream("class A", params)
    got = ["", ""]
    live = [a, b]
    while live:
        for i, s in enumerate((a, b)):
            if s in live:
                try:
                    got[i] += next(s)
                except StopIteration:
                    live.remove(s)
    assert got == ref
    _consistent(llm)


def test_stream_holds_back_text_a_stop_string_removes(llama_dir):
    llm = LLM(llama_dir)
    base = llm.generate(["x = "], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0].text
    stop = base[6:12]   # a stop string that the output reaches token by token
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, stop=stop)
    full = llm.generate(["x = "], params)[0].text
    deltas = list(llm.stream("x = ", params))
    assert "".join(deltas) == full and stop not in full
    for i in range(1, len(deltas) + 1):   # no prefix of the stream ever ran past the final text
        assert full.startswith("".join(deltas[:i]))


@pytest.mark.parametrize("method", ["none", "mtp"])
def test_a_request_larger_than_the_kv_pool_finishes(llama_dir, heads, method):
    """Two pages of 16 tokens: the request stops at what the pool holds, with reason length."""
    spec = SpecConfig(method=method, draft=heads["random"] if method == "mtp" else None, num_draft_tokens=3)
    llm = LLM(llama_dir, spec=spec, num_pages=2, page_size=16)
    out = llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True))[0]
    assert out.finish_reason == "length" and 4 + len(out.token_ids) <= 32
    _consistent(llm)
    with pytest.raises(ValueError, match="context holds"):
        llm.generate([list(range(40))], GREEDY)
    with pytest.raises(ValueError, match="cannot hold a prompt token"):
        LLM(llama_dir, spec=spec, num_pages=1, page_size=1)

"""Greedy generation vs transformers generate, batch vs alone, dtypes, streaming."""
import pytest
import torch

from helpers.models import hf_load
from helpers.prompts import prompts
from sonarspec_ext import LLM, SamplingParams


@pytest.mark.parametrize("fixture", ["llama_dir", "qwen_dir"])
def test_greedy_batch_equals_alone_equals_transformers(fixture, request):
    path = request.getfixturevalue(fixture)
    llm = LLM(path, page_size=4)
    hf = hf_load(path)
    ps = prompts(6)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    batch = llm.generate(ps, params)
    for p, out in zip(ps, batch):
        alone = llm.generate([p], params)[0]
        assert alone.token_ids == out.token_ids
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                              max_new_tokens=20, do_sample=False, min_new_tokens=20,
                              pad_token_id=0)[0, len(p):].tolist()
        assert out.token_ids == ref
        assert out.finish_reason == "length" and len(out.token_ids) == 20


def test_small_token_budget_chunks_prefill_without_changing_output(llama_dir):
    ps = prompts(5, seed=3)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    ref = LLM(llama_dir).generate(ps, params)
    chunked = LLM(llama_dir, max_num_batched_tokens=7, max_num_seqs=2).generate(ps, params)
    assert [o.token_ids for o in chunked] == [o.token_ids for o in ref]


def test_preemption_recomputes_without_changing_output(llama_dir):
    ps = prompts(8, seed=4)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ref = LLM(llama_dir).generate(ps, params)
    llm = LLM(llama_dir, page_size=2, num_pages=40)
    tight = llm.generate(ps, params)
    assert [o.token_ids for o in tight] == [o.token_ids for o in ref]
    assert sum(o.stats["num_preemptions"] for o in tight) > 0
    assert llm.engine.planner.num_free_pages == 40


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_and_mostly_agrees(llama_dir, dtype):
    ps = prompts(3, seed=5)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ref = LLM(llama_dir).generate(ps, params)
    out = LLM(llama_dir, dtype=dtype).generate(ps, params)
    assert all(len(o.token_ids) == 6 for o in out)
    # First greedy token agrees with float32 (margins of this model are large).
    assert sum(o.token_ids[0] == r.token_ids[0] for o, r in zip(out, ref)) >= 2


def test_stop_token_and_stop_string(llama_dir):
    llm = LLM(llama_dir)
    p = prompts(1, seed=6)[0]
    base = llm.generate(p, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))[0]
    stop_tok = base.token_ids[4]
    first = base.token_ids.index(stop_tok)
    out = llm.generate(p, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True,
                                         stop_token_ids=[stop_tok]))[0]
    assert out.token_ids == base.token_ids[:first + 1] and out.finish_reason == "stop"
    text = base.text
    stop = text[3:5]
    out = llm.generate(p, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == text[:text.find(stop)]


def test_eos_ends_generation_unless_ignored(llama_dir):
    llm = LLM(llama_dir)
    p = prompts(1, seed=7)[0]
    base = llm.generate(p, SamplingParams(max_tokens=15, temperature=0.0, ignore_eos=True))[0]
    eos = base.token_ids[2]
    llm.engine.eos_ids = [eos]
    out = llm.generate(p, SamplingParams(max_tokens=15, temperature=0.0))[0]
    assert out.token_ids[-1] == eos and out.finish_reason == "stop"
    assert out.token_ids == base.token_ids[:len(out.token_ids)]


def test_stream_yields_the_same_text_as_generate(llama_dir):
    llm = LLM(llama_dir)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    text = llm.generate("hello world", params)[0].text
    deltas = list(llm.stream("hello world", params))
    assert "".join(deltas) == text and len(deltas) > 1
    assert llm.engine.planner.num_free_pages == llm.engine.kv_cache.num_pages
    assert llm.stats()["num_output_tokens"] == 32


def test_engine_freezes_the_gc_view_of_what_it_loaded_unless_told_not_to(llama_dir):
    """``freeze_gc`` (default on) moves everything alive once the engine is built to the
    collector's permanent generation; requests still free their objects."""
    import gc
    import weakref
    gc.unfreeze()
    try:
        llm = LLM(llama_dir, freeze_gc=False)
        assert gc.get_freeze_count() == 0
        llm = LLM(llama_dir)
        assert gc.get_freeze_count() > 0
        params = SamplingParams(max_tokens=4, temperature=0)
        ref = weakref.ref(llm.generate([[1, 2, 3]], params)[0])
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("kv", ["bfloat16", "float16", "float32"])
def test_kv_cache_dtypes_keep_speculation_lossless(llama_dir, draft_dir, kv):
    """16-bit KV pools (the default for bfloat16 weights on the CPU: bfloat16): a batch
    decodes as its prompts alone, draft_target and ngram speculation equal plain decoding,
    and greedy output mostly agrees with float32 pools (this model's margins are large)."""
    from sonarspec_ext import SpecConfig
    ps = prompts(4, seed=9)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    llm = LLM(llama_dir, kv_cache_dtype=kv)
    assert llm.engine.kv_cache.k.dtype == getattr(torch, kv)
    plain = [o.token_ids for o in llm.generate(ps, params)]
    assert [llm.generate([p], params)[0].token_ids for p in ps] == plain
    for spec in (SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=3),
                 SpecConfig(method="ngram", num_draft_tokens=3)):
        assert [o.token_ids for o in LLM(llama_dir, kv_cache_dtype=kv, spec=spec).generate(ps, params)] == plain
    wide = [o.token_ids for o in LLM(llama_dir, kv_cache_dtype="float32").generate(ps, params)]
    assert sum(a[0] == b[0] for a, b in zip(plain, wide)) >= 3


def test_kv_cache_dtype_auto_and_bad_values(llama_dir):
    """auto: bfloat16 pools for bfloat16 weights (the packaged model's), float32 for float32
    weights (a float32 checkpoint, or compact_weights=False)."""
    assert LLM("default").engine.kv_cache.k.dtype == torch.bfloat16
    assert LLM("default", compact_weights=False).engine.kv_cache.k.dtype == torch.float32
    assert LLM(llama_dir).engine.kv_cache.k.dtype == torch.float32
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        LLM(llama_dir, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="compute dtype"):
        LLM(llama_dir, dtype="bfloat16", kv_cache_dtype="float16")

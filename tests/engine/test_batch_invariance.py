"""Batch invariance on the CPU: a request's tokens are identical whatever else is in the
batch, however its prompt is chunked, after preemption, and with or without speculation -
greedy and seeded sampling - because every row runs the same kernels in the same order
(native GEMM rows independent of the rows beside them, attention per query token)."""
import random

import pytest

from sonarspec_ext import LLM, SamplingParams, SpecConfig


def _requests(seed, n=10):
    rng = random.Random(seed)
    prompts = [[rng.randrange(280) for _ in range(rng.randint(1, 150))] for _ in range(n)]
    params = [SamplingParams(max_tokens=rng.randint(4, 24), ignore_eos=True,
                             temperature=rng.choice([0.0, 0.8]), top_p=rng.choice([1.0, 0.9]), seed=1000 + i)
              for i in range(n)]
    return prompts, params


@pytest.fixture(scope="module")
def alone(llama_dir):
    llm = LLM(llama_dir)
    return lambda p, sp: llm.generate([p], sp)[0].token_ids


@pytest.mark.parametrize("engine_kwargs", [
    dict(),                                           # one batch, prefills of up to 150 tokens in one step
    dict(max_num_batched_tokens=37),                  # prompts chunked at odd places
    dict(num_pages=48, page_size=4, max_num_seqs=8),  # KV pressure: preemption and recompute
], ids=["batched", "chunked", "preempted"])
def test_requests_equal_running_alone(llama_dir, alone, engine_kwargs):
    prompts, params = _requests(seed=len(engine_kwargs))
    outs = LLM(llama_dir, **engine_kwargs).generate(prompts, params)
    for p, sp, o in zip(prompts, params, outs):
        assert o.token_ids == alone(p, sp)


@pytest.mark.parametrize("method", ["draft_target", "mtp"])
def test_speculation_in_a_batch_equals_plain_alone(llama_dir, draft_dir, heads, alone, method):
    """Greedy requests: speculative decoding in a batch equals plain decoding alone."""
    prompts, params = _requests(seed=7)
    greedy = [SamplingParams(max_tokens=sp.max_tokens, temperature=0.0, ignore_eos=True) for sp in params]
    draft = draft_dir if method == "draft_target" else heads["trained"]
    llm = LLM(llama_dir, spec=SpecConfig(method=method, draft=draft, num_draft_tokens=3), max_num_batched_tokens=64)
    for p, sp, o in zip(prompts, greedy, llm.generate(prompts, greedy)):
        assert o.token_ids == alone(p, sp)


def test_kv_pressure_preempts(llama_dir):
    """The preempted case above does preempt (otherwise it would test nothing new)."""
    prompts, params = _requests(seed=3)
    llm = LLM(llama_dir, num_pages=48, page_size=4, max_num_seqs=8)
    llm.generate(prompts, params)
    assert llm.stats()["num_preemptions"] > 0


def test_logits_are_bit_identical_batched_chunked_or_alone(llama_dir):
    """The model's logits for a sequence, bit for bit: prefilled with others (150+ rows,
    past every native row count) and decoded in a batch, versus alone."""
    import torch
    from helpers.parity import paged_logits
    from sonarspec_ext.models.loader import load_model
    model = load_model(llama_dir)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 280, (n,), generator=g).tolist() for n in (150, 3, 77, 1, 40)]
    conts = [torch.randint(0, 280, (5,), generator=g).tolist() for _ in prompts]
    together = paged_logits(model, prompts, conts, 4, num_pages=512, native=True)
    for p, c, t in zip(prompts, conts, together):
        assert torch.equal(t, paged_logits(model, [p], [c], 4, num_pages=512, native=True)[0])


@pytest.mark.parametrize("engine_kwargs", [dict(), dict(max_num_batched_tokens=37)], ids=["batched", "chunked"])
def test_packaged_model_requests_equal_running_alone(engine_kwargs):
    """The packaged model (bfloat16 weights, 8192 tokens: near ties happen)."""
    rng = random.Random(11)
    prompts = ["def parse_args(argv):\n", "class LRUCache:\n    def __init__(self, capacity):\n",
               "import os\nimport sys\n", "    for key, value in sorted(self.items()):\n",
               "try:\n    import json\nexcept ImportError:\n", "def read_config(path):\n", "x = [", "# TODO"]
    params = [SamplingParams(max_tokens=24, ignore_eos=True, temperature=rng.choice([0.0, 0.9]), seed=i)
              for i in range(len(prompts))]
    batched = LLM("default", **engine_kwargs).generate(prompts, params)
    single = LLM("default")
    for p, sp, o in zip(prompts, params, batched):
        assert o.token_ids == single.generate([p], sp)[0].token_ids, p


@pytest.mark.parametrize("spec", [SpecConfig(method="draft_target", draft="default", num_draft_tokens=4),
                                  SpecConfig(method="ngram", num_draft_tokens=4),
                                  SpecConfig(method="mtp", num_draft_tokens=3, lookup_draft_tokens=8)],
                         ids=["draft_target", "ngram", "mtp+lookup"])
def test_speculation_across_the_attention_split_boundary_equals_plain(spec):
    """Verification blocks and long prompt chunks whose tokens see 500-530 keys: the native
    attention splits each token's keys into runs of 512, so tokens of one block have one
    or two runs (a kernel once let a one-run token's result be overwritten there)."""
    rng = random.Random(5)
    prompts = [[rng.randrange(1, 8192) for _ in range(n)] for n in (498, 503, 509)]
    params = SamplingParams(max_tokens=24, ignore_eos=True, temperature=0.0)
    plain = [o.token_ids for o in LLM("default").generate(prompts, params)]
    outs = LLM("default", spec=spec).generate(prompts, params)
    assert [o.finish_reason for o in outs] == ["length"] * 3
    assert [o.token_ids for o in outs] == plain

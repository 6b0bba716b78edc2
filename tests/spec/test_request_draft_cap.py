"""SamplingParams.max_draft_tokens: a per-request cap on the drafted tokens a step verifies
(chains, lookup drafts, tree nodes; 0: plain decoding), in batches beside uncapped
requests. Oracle: plain decoding (greedy, so the tokens must be equal) and each request's
own drafting counts."""
import pytest

from helpers.prompts import prompts
from sonarspec_ext import LLM, SamplingParams, SpecConfig
from sonarspec_ext.server.app import _params
from sonarspec_ext.server.protocol import CompletionRequest

SCHEMES = {
    "mtp_chain_lookup": lambda heads, draft_dir: SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=3,
                                                            lookup_draft_tokens=8),
    "eagle_tree": lambda heads, draft_dir: SpecConfig(method="eagle_tree", draft=heads["trained"]),
    "draft_target": lambda heads, draft_dir: SpecConfig(method="draft_target", draft=draft_dir, num_draft_tokens=4),
    "ngram": lambda heads, draft_dir: SpecConfig(method="ngram", num_draft_tokens=4),
}
CAPS = [None, 0, 1, 2, None, 0, 1, 2]


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_capped_requests_draft_at_most_their_cap_and_decode_as_plain(llama_dir, draft_dir, heads, scheme):
    ps = prompts(len(CAPS), seed=71)
    base = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True) for _ in CAPS]
    want = [o.token_ids for o in LLM(llama_dir).generate(ps, base)]
    llm = LLM(llama_dir, spec=SCHEMES[scheme](heads, draft_dir))
    params = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, max_draft_tokens=c) for c in CAPS]
    outs = llm.generate(ps, params)
    assert [o.token_ids for o in outs] == want
    for cap, out in zip(CAPS, outs):
        s = out.stats
        if cap is None:
            continue
        assert s["num_draft_tokens"] <= cap * s["num_steps"], (cap, s)
        assert len(s["drafted_per_position"]) <= cap, (cap, s)
        if cap == 0:
            assert s["num_draft_tokens"] == 0
    uncapped = [o.stats for c, o in zip(CAPS, outs) if c is None]
    # the cap binds: uncapped requests of the same batch draft more than 2 tokens in a step
    # (a chain longer than 2, or more than 2 tree nodes a step on average)
    assert any(len(s["drafted_per_position"]) > 2 or s["num_draft_tokens"] > 2 * s["num_steps"] for s in uncapped)
    assert any(o.stats["num_draft_tokens"] > 0 for c, o in zip(CAPS, outs) if c)


def test_the_cap_holds_under_the_adaptive_control(llama_dir, heads):
    ps = prompts(4, seed=72)
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, max_draft_tokens=c)
              for c in (0, 1, None, 1)]
    want = [o.token_ids for o in LLM(llama_dir).generate(ps, params)]
    llm = LLM(llama_dir, spec=SpecConfig(method="mtp", draft=heads["trained"], num_draft_tokens=3),
              adaptive_speculation=True)
    outs = llm.generate(ps, params)
    assert [o.token_ids for o in outs] == want
    assert outs[0].stats["num_draft_tokens"] == 0
    assert all(len(outs[i].stats["drafted_per_position"]) <= 1 for i in (1, 3))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_bad_cap_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="max_draft_tokens"):
        SamplingParams(max_draft_tokens=bad)


def test_the_server_passes_the_cap_on():
    from sonarspec_ext.server.app import ServerLimits
    req = CompletionRequest(prompt="hi", max_tokens=5, max_draft_tokens=2)
    assert _params(req, 5, None, 3, ServerLimits(), 64, 100).max_draft_tokens == 2
    req = CompletionRequest(prompt="hi", max_tokens=5)
    assert _params(req, 5, None, 3, ServerLimits(), 64, 100).max_draft_tokens is None
    with pytest.raises(ValueError):   # pydantic's ValidationError: the server answers 400
        CompletionRequest(prompt="hi", max_draft_tokens=-1)

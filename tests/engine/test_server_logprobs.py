"""Log-probabilities through the OpenAI-compatible server (both of OpenAI's shapes, streamed
and not) against the library's ``RequestOutput.logprobs`` for the same request."""
import pytest

from helpers.server import KEY, post as _post
from sonarspec_ext import SamplingParams


def test_logprobs_through_the_openai_client_equal_the_library(server):
    """Completions' and chat's logprobs (OpenAI's two shapes), streamed and not: the
    library's ``RequestOutput.logprobs`` for the same request; bad values are 400s."""
    openai = pytest.importorskip("openai")
    url, _, _, oracle = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    want = oracle.generate(["def add(a, b):"], SamplingParams(max_tokens=12, temperature=0, logprobs=2))[0]
    r = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=12, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([e.logprob for e in want.logprobs], abs=1e-6)
    assert lp.tokens == [oracle.tokenizer.decode([e.token_id]) for e in want.logprobs]
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    assert [len(t) for t in lp.top_logprobs] == [len({oracle.tokenizer.decode([i]) for i, _ in e.top})
                                                 for e in want.logprobs]
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model="tiny", prompt="def add(a, b):", max_tokens=12, temperature=0, logprobs=2, stream=True)
        if c.choices and c.choices[0].logprobs is not None]
    assert sum((c.token_logprobs for c in streamed), []) == pytest.approx(lp.token_logprobs, abs=1e-6)
    assert sum((c.text_offset for c in streamed), []) == lp.text_offset
    messages = [{"role": "user", "content": "hi"}]
    want = oracle.chat(messages, SamplingParams(max_tokens=10, temperature=0, logprobs=3))[0]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                       logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([e.logprob for e in want.logprobs], abs=1e-6)
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token for c in content)
    assert all(bytes(c.bytes).decode("utf-8") == c.token for c in content)
    chunks = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                            logprobs=True, stream=True)
    streamed = sum((c.choices[0].logprobs.content for c in chunks if c.choices and c.choices[0].logprobs), [])
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=1e-6)
    assert all(c.top_logprobs == [] for c in streamed)
    assert client.completions.create(model="tiny", prompt="x", max_tokens=2).choices[0].logprobs is None
    for body in ({"messages": messages, "top_logprobs": 2}, {"messages": messages, "logprobs": True,
                                                             "top_logprobs": 21}):
        r = _post(url, "/v1/chat/completions", body)
        assert r.status_code == 400 and "logprobs" in r.json()["error"]["message"], r.text

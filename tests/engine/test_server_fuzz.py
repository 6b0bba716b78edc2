"""`sonarspec serve` under random request bodies (hypothesis, seeded): the OpenAI fields with
values of every JSON type - numbers at their limits, NaN and infinities, strings, lists,
objects, nulls - and unknown fields, streamed or not, to both generation routes. Each is
answered 200 with a well-formed completion or stream, or 400 / 404 / 413 with an OpenAI error
object, never a 5xx; afterwards the engine tracks no request, every KV page is free, and a
plain request is served."""
import json
import os

import httpx
import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from helpers.server import KEY, post, wait_until_idle  # noqa: E402

LIMITS = st.sampled_from([0, -1, 2 ** 31, 2 ** 63, -(2 ** 63), 10 ** 30])
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0]))
ANY = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-3, 20), LIMITS, FLOATS, st.text(max_size=12)),
                   lambda inner: st.one_of(st.lists(inner, max_size=3),
                                           st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                   max_leaves=6)
TEXT = st.text(max_size=24)
WORDS = st.sampled_from(["Hello", "def parse(x):", "The sky is", "1, 2, 3,", "Write a poem"])
WILD = st.one_of(ANY, LIMITS, FLOATS)


def mostly(valid, other):
    """valid 3 times in 4, else other (one_of would not keep to weights)."""
    return st.integers(0, 3).flatmap(lambda i: other if i == 0 else valid)


# per field: values it accepts
VALID = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0.01, 1), "top_k": st.integers(-1, 50),
    "seed": st.integers(0, 2 ** 63 - 1), "stop": st.one_of(TEXT, st.lists(TEXT, max_size=4)),
    "n": st.integers(1, 3), "logprobs": st.booleans(), "top_logprobs": st.integers(0, 5),
    "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2),
    "logit_bias": st.dictionaries(st.sampled_from(["1", "7", "30"]), st.floats(-100, 100), max_size=3),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}), "model": st.just("tiny"),
    "user": TEXT, "unknown_field": TEXT,   # refused whatever it holds
}
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "user", "system", "assistant", "tool"]),
                                 "content": mostly(WORDS, st.one_of(TEXT, WILD))})
# max_tokens always present and mostly small, so every accepted request ends quickly
MAX_TOKENS = mostly(st.integers(1, 6), st.one_of(st.integers(-2, 0), WILD))
PROMPT = mostly(st.one_of(WORDS, st.lists(WORDS, min_size=1, max_size=3)),
               st.one_of(TEXT, st.lists(TEXT, max_size=3), st.lists(st.integers(-3, 10 ** 6), max_size=4), WILD))
MESSAGES = mostly(st.lists(MESSAGE, min_size=1, max_size=3), WILD)


def _check(r, body):
    assert r.status_code in (200, 400, 404, 413), (r.status_code, body, r.text[:500])
    if r.status_code != 200:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["message"], r.text
        return
    if body["stream"]:
        events = [ln[6:] for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert events and events[-1] == "[DONE]", r.text[-300:]
        chunks = [json.loads(e) for e in events[:-1]]
        assert all("choices" in c for c in chunks), chunks
    else:
        out = r.json()
        bound = body["max_tokens"] if isinstance(body["max_tokens"], int) else 1000   # "5" is 5, say
        assert out["choices"] and out["usage"]["completion_tokens"] <= bound * 3 * 3, out   # x n x prompts


@pytest.mark.filterwarnings("ignore")
def test_random_request_bodies_are_served_or_refused_and_serving_goes_on(server):
    url, app, llm, _ = server
    client = httpx.Client(timeout=60, headers={"Authorization": f"Bearer {KEY}"})
    statuses = {}

    @settings(max_examples=int(os.environ.get("SERVER_FUZZ_EXAMPLES", 300)), derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(route=st.sampled_from(["completions", "chat"]), stream=st.booleans(), data=st.data(),
           fields=st.lists(st.sampled_from(sorted(VALID)), max_size=4, unique=True))
    def one(route, stream, data, fields):
        body = {"prompt": data.draw(PROMPT)} if route == "completions" else {"messages": data.draw(MESSAGES)}
        body.update(max_tokens=data.draw(MAX_TOKENS), stream=stream)
        for f in fields:
            body[f] = data.draw(mostly(VALID[f], WILD))
        m = body["max_tokens"]
        if m is None or (isinstance(m, (int, float)) and 6 < m <= 1000):   # allowed (None: to the limit) but slow
            body["max_tokens"] = 6
        content = json.dumps(body, allow_nan=True)   # NaN and Infinity as Python's json writes them
        r = client.post(f"{url}/v1/{'completions' if route == 'completions' else 'chat/completions'}",
                        content=content, headers={"Content-Type": "application/json"})
        _check(r, body)
        key = (r.status_code, route, stream)
        statuses[key] = statuses.get(key, 0) + 1
    try:
        one()
    finally:
        client.close()
    served = {k: v for k, v in statuses.items() if k[0] == 200}
    assert len(served) == 4 and sum(served.values()) >= 20, statuses   # both routes, streamed and not, served
    assert sum(v for k, v in statuses.items() if k[0] == 400) >= 20, statuses
    wait_until_idle(app, llm)
    assert post(url, "/v1/completions", {"prompt": "ok", "max_tokens": 2}).status_code == 200

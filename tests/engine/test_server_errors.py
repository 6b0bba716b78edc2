"""`sonarspec serve` answering what it cannot serve: bad requests and bodies get OpenAI-shaped
400 / 401 / 413 errors, a request the engine refuses is the client's error and a failure
while one runs the server's - and serving goes on after each."""
import json

import httpx
import pytest

from helpers.server import KEY, post as _post, wait_until_idle as _wait_until_idle
from sonarspec_ext import SamplingParams


@pytest.mark.parametrize("body,status,words", [
    ({"prompt": "x", "n": 17}, 400, "at most 16"),
    ({"prompt": ["a", "b", "c"], "n": 6}, 400, "18 choices"),
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": []}, 400, "prompt is empty"),
    ({"prompt": ["a", ""]}, 400, "prompt is empty"),
    ({"prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": 42}, 400, "prompt"),
    ({"prompt": "x", "best_of_unknown": 1}, 400, "best_of_unknown"),
    ({"prompt": "x", "stop": ["a"] * 3, "seed": 2 ** 70}, 400, "seed"),
    ({"prompt": "x", "logprobs": 6}, 400, "logprobs"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"prompt": "x", "max_tokens": 1500}, 400, "limit of 1000"),
    ({"prompt": "x " * 400}, 400, "at most 300"),
    ({"prompt": [1, 2, 10 ** 9]}, 400, "token ids"),
    ({"prompt": "x", "model": "gpt-4"}, 404, "not served here"),
    ({"max_tokens": 3}, 400, "prompt"),
    ({"prompt": "x" * 30_000}, 413, "larger than"),
    ({"prompt": "x", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ({"prompt": "x", "logit_bias": {"12": 101}}, 400, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"-3": 1}}, 400, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"1000000": 1}}, 400, "logit_bias"),
    ({"prompt": "x", "echo": True}, 400, "echo"),
    ({"prompt": "x", "best_of": 3}, 400, "best_of must equal n"),
    ({"prompt": "x", "suffix": " end"}, 400, "suffix"),
])
def test_bad_requests_get_openai_errors_and_serving_goes_on(server, body, status, words):
    url = server[0]
    r = _post(url, "/v1/completions", body)
    assert r.status_code == status and words in r.json()["error"]["message"], r.text
    assert _post(url, "/v1/completions", {"prompt": "ok", "max_tokens": 2}).status_code == 200


def test_bad_json_bad_messages_and_api_keys(server):
    url = server[0]
    r = httpx.post(url + "/v1/completions", content=b"{not json", headers={"Authorization": f"Bearer {KEY}",
                                                                         "content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/completions", content=b'{"prompt": "x", "temperature": NaN}',
                   headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]
    r = _post(url, "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]})
    assert r.status_code == 400 and "role" in r.json()["error"]["message"]
    hi = [{"role": "user", "content": "hi"}]
    for extra, field in (({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                         ({"tool_choice": "required"}, "tool_choice"),
                         ({"response_format": {"type": "json_object"}}, "response_format")):
        r = _post(url, "/v1/chat/completions", {"messages": hi, "max_tokens": 2, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert "not supported" in r.json()["error"]["message"]
    # the same fields at OpenAI's defaults, as clients send them, are served
    r = _post(url, "/v1/chat/completions", {"messages": hi, "max_tokens": 2, "tools": [], "tool_choice": "none",
                                            "parallel_tool_calls": True, "response_format": {"type": "text"}})
    assert r.status_code == 200, r.text
    r = _post(url, "/v1/completions", {"prompt": "x", "max_tokens": 2, "echo": False, "best_of": 1, "suffix": None})
    assert r.status_code == 200, r.text
    assert _post(url, "/v1/completions", {"prompt": "x"}, key=None).status_code == 401
    assert _post(url, "/v1/completions", {"prompt": "x"}, key="wrong").status_code == 401
    assert httpx.get(url + "/health").status_code == 200          # no key needed outside /v1
    assert httpx.get(url + "/v1/models").status_code == 401


def test_a_chunked_body_past_the_limit_is_a_413_before_it_is_all_read(server):
    """Without a Content-Length the guard cannot see the size: the handler stops reading at the
    limit (20 000 bytes here) - a body of 64 MB is answered without being held in memory."""
    url = server[0]

    def chunks():
        yield b'{"prompt": "x", "user": "'
        for _ in range(64):
            yield b" " * (1 << 20)
        yield b'"}'
    r = httpx.post(url + "/v1/completions", content=chunks(), timeout=60,
                   headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json"})
    assert r.status_code == 413 and "larger than 20000 bytes" in r.json()["error"]["message"]
    assert _post(url, "/v1/completions", {"prompt": "ok", "max_tokens": 2}).status_code == 200

    # the read itself: no chunk is taken past the one that crosses the limit
    import asyncio
    from starlette.requests import Request
    from sonarspec_ext.server.app import BadRequest, _body
    taken = []

    async def receive():
        taken.append(1)
        return {"type": "http.request", "body": b"x" * 1000, "more_body": len(taken) < 1000}
    request = Request({"type": "http", "method": "POST", "headers": []}, receive)
    with pytest.raises(BadRequest, match="larger than 2500 bytes"):
        asyncio.run(_body(request, 2500))
    assert len(taken) == 3


@pytest.mark.parametrize("path,raw,words", [
    ("/v1/completions", b'{"prompt": "\\ud800 x", "max_tokens": 2}', "not valid Unicode"),
    ("/v1/completions", b'{"prompt": ["ok", "\\udfff"], "max_tokens": 2}', "not valid Unicode"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "not valid Unicode"),
    ("/v1/completions", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),
    ("/v1/completions", b'{"prompt": "x", "frequency_penalty": NaN}', "finite number"),
    ("/v1/completions", b'{"prompt": "x", "top_p": NaN}', "finite number"),
    ("/v1/completions", b'{"prompt": "x", "repetition_penalty": Infinity}', "finite number"),
])
def test_bodies_the_parsers_reject_are_400s_on_a_connection_that_stays_open(server, path, raw, words):
    """Text no tokenizer takes (lone surrogates), JSON nested past the parser's recursion
    limit and non-finite numbers: a 400 that says which, and the same keep-alive connection
    then serves a good request."""
    url = server[0]
    headers = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as client:
        r = client.post(path, content=raw)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        assert client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2}).status_code == 200


def test_a_request_whose_planning_fails_is_answered_and_serving_goes_on(server, monkeypatch):
    """Planning that raises at every step: the request gets an OpenAI-shaped error naming the
    failure (the engine loop used to retry the step forever, the client waiting until its
    timeout); once planning works again the server answers as the library does."""
    url, app, llm, oracle = server
    body = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}

    def broken():
        raise RuntimeError("injected planning failure")
    monkeypatch.setattr(llm.engine, "_plan", broken)
    r = _post(url, "/v1/completions", body)
    error = r.json()["error"]   # the engine's fault, not the request's
    assert r.status_code == 500 and error["type"] == "server_error", r.text
    assert "injected planning failure" in error["message"], r.text
    monkeypatch.undo()
    r = _post(url, "/v1/completions", body)
    want = oracle.generate(["def add(a, b):"], SamplingParams(max_tokens=8, temperature=0))[0]
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == want.text
    _wait_until_idle(app, llm)


def test_a_request_the_engine_refuses_is_the_clients_error(server, monkeypatch):
    """A request the engine refuses at admission (``add_request`` raising ValueError) is a
    400 invalid_request_error carrying the engine's message, streamed or not; a failure
    while it runs is a 500 (the test above)."""
    url, app, llm, _ = server

    def refuse(*args, **kwargs):
        raise ValueError("injected refusal")
    monkeypatch.setattr(llm.engine, "add_request", refuse)
    body = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0}
    r = _post(url, "/v1/completions", body)
    error = r.json()["error"]
    assert r.status_code == 400 and error["type"] == "invalid_request_error", r.text
    assert error["message"] == "injected refusal"
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as r:
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    errors = [e["error"] for e in events if "error" in e]
    assert [(e["type"], e["message"]) for e in errors] == [("invalid_request_error", "injected refusal")]
    _wait_until_idle(app, llm)

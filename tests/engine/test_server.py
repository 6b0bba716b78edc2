"""`sonarspec serve`: the OpenAI-compatible server against the library's own outputs (the
oracle: ``LLM.generate`` / ``LLM.chat`` on the same model), through a real uvicorn server and
the ``openai`` client; clients that disconnect have their requests aborted and their KV pages
freed (errors: test_server_errors.py)."""
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers.server import KEY, post as _post, wait_until_idle as _wait_until_idle
from sonarspec_ext import SamplingParams
from sonarspec_ext.server.engine_loop import Done
from sonarspec_ext.server.responses import speculation_figures


def test_completions_and_chat_equal_the_library(server):
    url, _, _, oracle = server
    r = _post(url, "/v1/completions", {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 24,
                                       "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    want = oracle.generate(["def add(a, b):"], SamplingParams(max_tokens=24, temperature=0))[0]
    assert body["choices"][0]["text"] == want.text and body["object"] == "text_completion"
    assert body["usage"] == {"prompt_tokens": len(want.prompt_token_ids), "completion_tokens": len(want.token_ids),
                             "total_tokens": len(want.prompt_token_ids) + len(want.token_ids),
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert body["choices"][0]["finish_reason"] == want.finish_reason and body["id"].startswith("cmpl-")
    msgs = [{"role": "user", "content": "Write a loop."}]
    r = _post(url, "/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 20, "temperature": 0})
    assert r.status_code == 200, r.text
    want = oracle.chat(msgs, SamplingParams(max_tokens=20, temperature=0))[0]
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": want.text}
    assert r.json()["speculation"]["num_draft_tokens"] > 0
    assert r.json()["speculation"]["acceptance_length"] >= 1.0
    r = _post(url, "/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 20, "temperature": 0,
                                            "max_draft_tokens": 0})
    assert r.status_code == 200, r.text   # no drafts: every verification step gives one token
    assert r.json()["choices"][0]["message"]["content"] == want.text
    assert r.json()["speculation"] == {"num_draft_tokens": 0, "num_accepted_tokens": 0, "acceptance_length": 1.0}


def test_speculation_figures_of_requests_that_never_verified_drafts():
    """Requests decoded plainly throughout (speculation paused by the load control, or an
    engine without a drafter) ran no verification step: no acceptance length (null), not
    0.0; with steps, drafted and accepted tokens over the choices together."""
    plain = Done("stop", 3, 5, {"num_steps": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0})
    none = {"num_draft_tokens": 0, "num_accepted_tokens": 0, "acceptance_length": None}
    assert speculation_figures([plain]) == none
    drafted = Done("length", 3, 9, {"num_steps": 4, "num_draft_tokens": 8, "num_accepted_tokens": 5})
    both = {"num_draft_tokens": 8, "num_accepted_tokens": 5, "acceptance_length": 2.25}
    assert speculation_figures([plain, drafted]) == both


def test_streaming_is_the_same_text_in_openai_chunks(server):
    url, _, _, oracle = server
    body = {"prompt": "class Stack:", "max_tokens": 30, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert chunks[0]["choices"][0]["text"], "a completions stream opens with text (no empty chunk)"
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    want = oracle.generate(["class Stack:"], SamplingParams(max_tokens=30, temperature=0))[0]
    assert text == want.text
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == want.finish_reason
    assert chunks[-1]["usage"]["completion_tokens"] == len(want.token_ids) and chunks[-1]["choices"] == []


def test_the_openai_client_chats_and_streams(server):
    openai = pytest.importorskip("openai")
    url, _, _, oracle = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sort a list."}]
    out = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=16, temperature=0)
    want = oracle.chat(msgs, SamplingParams(max_tokens=16, temperature=0))[0]
    assert out.choices[0].message.content == want.text and out.usage.completion_tokens == len(want.token_ids)
    parts = [c.choices[0].delta.content or "" for c in
             client.chat.completions.create(model="tiny", messages=msgs, max_tokens=16, temperature=0, stream=True)
             if c.choices]
    assert "".join(parts) == want.text


def test_concurrent_clients_share_batches_and_get_their_own_answers(server):
    url, _, _, oracle = server
    prompts = [f"def f{i}(x):" for i in range(8)]
    params = [{"prompt": p, "max_tokens": 20, "temperature": 0.8, "seed": i} for i, p in enumerate(prompts)]
    with ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda b: _post(url, "/v1/completions", b).json()["choices"][0]["text"], params))
    want = [oracle.generate([p], SamplingParams(max_tokens=20, temperature=0.8, seed=i))[0].text
            for i, p in enumerate(prompts)]
    assert got == want


def test_a_client_that_leaves_frees_its_request(server):
    url, app, llm, _ = server
    body = {"prompt": "while True:", "max_tokens": 1000, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                break                                                # leave after the first text
    _wait_until_idle(app, llm)
    metrics = httpx.get(url + "/metrics").text
    assert 'sonarspec_requests_finished_total{reason="abort"}' in metrics
    assert "sonarspec_spec_draft_tokens_total" in metrics and "sonarspec_time_to_first_token_seconds_bucket" in metrics
    assert "sonarspec_spec_lookup_steps_total" in metrics
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines()
              if line and not line.startswith("#")}
    m = llm.memory()
    assert values['sonarspec_weight_bytes{model="target"}'] == m["target_weight_bytes"] > 0
    assert values['sonarspec_weight_bytes{model="drafter"}'] == m["drafter_weight_bytes"]
    assert values["sonarspec_kv_pool_bytes"] == m["kv_pool_bytes"] and values["sonarspec_kv_pool_tokens"] == m[
        "kv_pool_tokens"]


def test_sonarspec_serve_command(tmp_path):
    """The CLI entry point: binds 127.0.0.1, answers /health and a completion, stops on SIGTERM."""
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "sonarspec_ext.cli", "serve", "--model", "default", "--port",
                             str(port), "--spec", "mtp", "--spec-max-batch", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        r = httpx.post(url + "/v1/completions", json={"prompt": "def f():", "max_tokens": 5, "temperature": 0},
                       timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
        assert r.json()["model"] == "default"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert f"http://127.0.0.1:{port}/v1" in err
    r = subprocess.run([sys.executable, "-m", "sonarspec_ext.cli", "serve", "--model", "default", "--port", "99999"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "a TCP port is at most 65535, got 99999" in r.stderr
    r = subprocess.run([sys.executable, "-m", "sonarspec_ext.cli", "serve", "--model", "default", "--api-key", ""],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--api-key: is empty" in r.stderr
    from sonarspec_ext.server.app import create_app
    with pytest.raises(ValueError, match="api_key must be a non-empty string"):
        create_app(None, "default", api_key=" ")


def _rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def test_200_streaming_clients_a_third_leaving(server):
    """Load and faults: 200 concurrent streaming clients of mixed lengths, every third one
    leaving after its first text; then every KV page is free, /health answers, the clients
    that stayed got the offline greedy outputs, and a second round does not grow memory."""
    import asyncio
    url, app, llm, oracle = server
    prompts = [f"def task_{i}(n):" for i in range(200)]
    lengths = [4 + (i * 7) % 37 for i in range(200)]

    async def client(http, i):
        body = {"prompt": prompts[i], "max_tokens": lengths[i], "temperature": 0, "stream": True}
        text = []
        async with http.stream("POST", url + "/v1/completions", json=body,
                               headers={"Authorization": f"Bearer {KEY}"}) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    return "".join(text)
                if line.startswith("data: {"):
                    choices = json.loads(line[6:])["choices"]
                    text += [c["text"] for c in choices]
                    if i % 3 == 0 and "".join(text):
                        return None   # leaves mid-stream
        return "".join(text)

    async def round_():
        limits = httpx.Limits(max_connections=250, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=300, limits=limits) as http:
            return await asyncio.gather(*(client(http, i) for i in range(200)))

    want = {i: o.text for i, o in zip(range(200), oracle.generate(
        prompts, [SamplingParams(max_tokens=n, temperature=0) for n in lengths])) if i % 3}
    sizes = []
    for _ in range(2):
        got = asyncio.run(round_())
        assert {i: t for i, t in enumerate(got) if i % 3} == want
        _wait_until_idle(app, llm)
        assert not llm.engine.seqs and httpx.get(url + "/health").status_code == 200
        sizes.append(_rss_mb())
    assert sizes[1] - sizes[0] < 64, sizes


def test_stop_strings_and_seeds_through_the_openai_client(server):
    openai = pytest.importorskip("openai")
    url, _, _, oracle = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    free = oracle.generate(["def g(x):"], SamplingParams(max_tokens=30, temperature=0))[0].text
    stop = free[len(free) // 2:len(free) // 2 + 2]
    assert stop.strip()
    out = client.completions.create(model="tiny", prompt="def g(x):", max_tokens=30, temperature=0, stop=[stop])
    want = oracle.generate(["def g(x):"], SamplingParams(max_tokens=30, temperature=0, stop=[stop]))[0]
    assert out.choices[0].text == want.text and stop not in want.text and out.choices[0].finish_reason == "stop"
    kw = dict(model="tiny", prompt="import os\n", max_tokens=20, temperature=0.9)
    a = client.completions.create(seed=11, **kw).choices[0].text
    b = client.completions.create(seed=11, **kw).choices[0].text
    c = client.completions.create(seed=12, **kw).choices[0].text
    assert a == b == oracle.generate(["import os\n"], SamplingParams(max_tokens=20, temperature=0.9, seed=11))[0].text
    assert c != a


def test_penalties_and_logit_bias_through_the_openai_client(server):
    openai = pytest.importorskip("openai")
    url, _, _, oracle = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    msgs = [{"role": "user", "content": "List some colours."}]
    tok = oracle.tokenizer.encode(" the")[0]
    out = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, temperature=0,
                                         presence_penalty=1.2, frequency_penalty=0.6, logit_bias={str(tok): 3.0},
                                         user="someone", extra_body={"repetition_penalty": 1.3})
    want = oracle.chat(msgs, SamplingParams(max_tokens=24, temperature=0, presence_penalty=1.2, frequency_penalty=0.6,
                                            logit_bias={tok: 3.0}, repetition_penalty=1.3))[0]
    assert out.choices[0].message.content == want.text
    assert want.text != oracle.chat(msgs, SamplingParams(max_tokens=24, temperature=0))[0].text


def test_n_choices_and_prompt_lists_equal_the_library(server):
    """``n`` choices of a seeded request sample with seeds s, s + 1, ...; a list of prompts
    answers each in order (choice index = prompt x n + j); usage counts each prompt once."""
    url, _, _, oracle = server
    r = _post(url, "/v1/completions", {"prompt": ["def add(a, b):", "import sys\n"], "n": 2, "max_tokens": 16,
                                       "temperature": 0.9, "seed": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    prompts = ["def add(a, b):", "def add(a, b):", "import sys\n", "import sys\n"]
    want = oracle.generate(prompts, [SamplingParams(max_tokens=16, temperature=0.9, seed=5 + j % 2)
                                     for j in range(4)])
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == [w.text for w in want]
    assert body["choices"][0]["text"] != body["choices"][1]["text"]
    assert body["usage"]["prompt_tokens"] == len(want[0].prompt_token_ids) + len(want[2].prompt_token_ids)
    assert body["usage"]["completion_tokens"] == sum(len(w.token_ids) for w in want)
    ids = oracle.tokenizer.encode("x = 1\n")
    r = _post(url, "/v1/completions", {"prompt": [ids, ids[:2]], "max_tokens": 8, "temperature": 0})
    want = oracle.generate([ids, ids[:2]], SamplingParams(max_tokens=8, temperature=0))
    assert [c["text"] for c in r.json()["choices"]] == [w.text for w in want]


def test_n_choices_stream_with_their_indices(server):
    openai = pytest.importorskip("openai")
    url, _, _, oracle = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    msgs = [{"role": "user", "content": "Name a fruit."}]
    texts = {}
    for chunk in client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=1.0,
                                                seed=3, n=3, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
        if chunk.usage is not None:
            usage = chunk.usage
    want = [oracle.chat(msgs, SamplingParams(max_tokens=12, temperature=1.0, seed=3 + j))[0] for j in range(3)]
    assert texts == {j: w.text for j, w in enumerate(want)}
    assert usage.prompt_tokens == len(want[0].prompt_token_ids)
    assert usage.completion_tokens == sum(len(w.token_ids) for w in want)


def test_a_chat_turn_reuses_the_earlier_turns_kv(server):
    """The second turn's request begins with the first's: the prefix cache supplies those
    tokens' KV (reported as OpenAI's ``usage.prompt_tokens_details.cached_tokens``) and the
    reply equals the library's."""
    openai = pytest.importorskip("openai")
    url, _, _, oracle = server
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY)
    msgs = [{"role": "system", "content": "You are a careful assistant who answers questions about Python code."},
            {"role": "user", "content": "What does a list comprehension do?"}]
    first = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, temperature=0)
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And a generator expression?"}]
    second = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, temperature=0)
    want = oracle.chat(msgs, SamplingParams(max_tokens=24, temperature=0))[0]
    assert second.choices[0].message.content == want.text
    assert second.usage.prompt_tokens == len(want.prompt_token_ids)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 32 and cached % 16 == 0 and cached < second.usage.prompt_tokens
    metrics = {line.split(" ")[0]: float(line.split(" ")[1]) for line in httpx.get(url + "/metrics").text.splitlines()
               if line.startswith(("sonarspec_prefix_cache_hit_tokens_total", "sonarspec_kv_pages_cached"))}
    assert metrics["sonarspec_prefix_cache_hit_tokens_total"] >= cached and metrics["sonarspec_kv_pages_cached"] >= 2

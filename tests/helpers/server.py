"""Talking to a test server: the API key it is started with, requests, waiting until idle."""
import time

import httpx

KEY = "test-key"


def wait_until_idle(app, llm, timeout_s: float = 10.0):
    """Waits until the engine thread tracks no request and every KV page is free; asserts it."""
    total = llm.engine.kv_cache.num_pages
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if not app.state.engine_loop._tracked and llm.engine.planner.num_free_pages == total:
            break
        time.sleep(0.05)
    assert not app.state.engine_loop._tracked and llm.engine.planner.num_free_pages == total


def post(url, path, body, key=KEY, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + path, json=body, headers=headers, timeout=60, **kw)

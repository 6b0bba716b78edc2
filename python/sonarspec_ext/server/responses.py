"""A request's choices run on the engine and answered in OpenAI's shapes: one JSON body
when all have finished, or an SSE stream of their chunks as the tokens come (each chunk
naming its choice's index), then the usage and ``data: [DONE]``. A client that leaves has
its choices aborted."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from ..params import SamplingParams
from .engine_loop import Delta, Done, EngineLoop
from .protocol import chunk_body, choice_body, completion_body, error_body, logprobs_body, new_id, usage

# One choice: the prompt's token ids, its parameters, and whether its prompt counts in
# usage (the first choice of each prompt: with n > 1 a prompt is counted once, as OpenAI does)
Choice = Tuple[List[int], SamplingParams, bool]


async def events(loop: EngineLoop, ids, params, request: Request):
    """Yields the request's Delta events, then its Done; aborts it if the client leaves."""
    out: asyncio.Queue = asyncio.Queue()
    key = loop.submit(ids, params, out, asyncio.get_running_loop())
    done = False
    try:
        while True:
            try:
                async with asyncio.timeout(1.0):   # no task per event, unlike asyncio.wait_for
                    ev = await out.get()
            except TimeoutError:
                if await request.is_disconnected():
                    return
                continue
            yield ev
            if isinstance(ev, Done):
                done = True
                return
    finally:
        if not done:
            loop.abort(key)


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   param: Optional[str] = None) -> JSONResponse:
    """An error in OpenAI's JSON shape."""
    return JSONResponse(error_body(message, kind, code=str(status), param=param), status_code=status)


def _error_status(done: Done) -> Tuple[int, str]:
    """(HTTP status, OpenAI error type) of a choice that ended in an error: a request the
    engine refused is the client's error, a failure while it ran is the server's."""
    return (400, "invalid_request_error") if done.rejected else (500, "server_error")


def _usage(choices: Sequence[Choice], dones: Sequence[Done]) -> Dict[str, Any]:
    counted = [d for (_, _, first), d in zip(choices, dones) if first]
    return usage(sum(d.prompt_tokens for d in counted), sum(d.completion_tokens for d in dones),
                 sum(d.stats.get("num_cached_tokens", 0) for d in counted))


def speculation_figures(dones: Sequence[Done]) -> Dict[str, Any]:
    """The speculation figures of the choices together: drafted and accepted tokens, and
    tokens per verification step (None where no step verified drafts: every token came
    from plain decoding)."""
    stats = [d.stats for d in dones]
    steps = sum(s.get("num_steps", 0) for s in stats)
    drafted, accepted = (sum(s.get(k, 0) for s in stats) for k in ("num_draft_tokens", "num_accepted_tokens"))
    return {"num_draft_tokens": drafted, "num_accepted_tokens": accepted,
            "acceptance_length": (accepted + steps) / steps if steps else None}


async def respond(request: Request, loop: EngineLoop, choices: Sequence[Choice], req, model_name: str, chat: bool):
    """The response to ``req`` for its ``choices`` (choice i has index i)."""
    rid = new_id("chatcmpl" if chat else "cmpl")
    decode = loop.llm.tokenizer.decode
    token_text = lambda tid: decode([tid])  # noqa: E731
    if not req.stream:
        return await _whole(request, loop, choices, rid, model_name, chat, token_text)
    return StreamingResponse(_stream(request, loop, choices, req, rid, model_name, chat, token_text),
                             media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _whole(request, loop, choices, rid, model_name, chat, token_text):
    async def one(ids, params):
        text, entries = [], None if params.logprobs is None else []
        async for ev in events(loop, ids, params, request):
            if isinstance(ev, Delta):
                text.append(ev.text)
                if entries is not None and ev.logprobs:
                    entries.extend(ev.logprobs)
            else:
                return "".join(text), entries, ev
        return None   # the client left
    results = await asyncio.gather(*(one(ids, params) for ids, params, _ in choices))
    if any(r is None for r in results):
        return error_response(499, "client closed the request")
    for _, _, done in results:
        if done.finish_reason == "error":
            status, kind = _error_status(done)
            return error_response(status, done.error or "generation failed", kind)
    dones = [done for _, _, done in results]
    bodies = [choice_body(i, text, done.finish_reason, chat, logprobs_body(entries, token_text, chat))
              for i, (text, entries, done) in enumerate(results)]
    return completion_body(rid, model_name, bodies, _usage(choices, dones), chat, speculation_figures(dones))


async def _tagged(loop: EngineLoop, choices: Sequence[Choice], request: Request):
    """Yields (choice index, event) as the choices' events come, and (i, None) when choice
    i's events have ended: one choice's straight from its queue, several through a merged
    queue fed by a task each."""
    if len(choices) == 1:
        ids, params, _ = choices[0]
        async with contextlib.aclosing(events(loop, ids, params, request)) as evs:
            async for ev in evs:
                yield 0, ev
        yield 0, None
        return
    merged: asyncio.Queue = asyncio.Queue()

    async def pump(i, ids, params):
        try:
            async for ev in events(loop, ids, params, request):
                await merged.put((i, ev))
        finally:
            await merged.put((i, None))   # this choice's stream has ended
    tasks = [asyncio.create_task(pump(i, ids, params)) for i, (ids, params, _) in enumerate(choices)]
    try:
        while True:
            yield await merged.get()
    finally:
        for t in tasks:
            t.cancel()


async def _stream(request, loop, choices, req, rid, model_name, chat, token_text):
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    created = int(time.time())
    for i in range(len(choices) if chat else 0):   # chat streams open with the role; completions with text
        yield _sse(chunk_body(rid, model_name, created, chat, text="", role=True, index=i))
    offsets = [0] * len(choices)   # completions' text_offset of each choice's next token
    dones: List[Done] = [None] * len(choices)
    open_streams = len(choices)
    async with contextlib.aclosing(_tagged(loop, choices, request)) as tagged:
        async for i, ev in tagged:
            if ev is None:
                open_streams -= 1
                if not open_streams:
                    break
            elif isinstance(ev, Delta):
                lp = logprobs_body(ev.logprobs, token_text, chat, offsets[i]) if ev.logprobs else None
                if lp is not None and not chat:
                    offsets[i] += sum(len(t) for t in lp["tokens"])
                if ev.text or lp is not None:
                    yield _sse(chunk_body(rid, model_name, created, chat, text=ev.text, logprobs=lp, index=i))
            elif ev.finish_reason == "error":
                dones[i] = ev
                yield _sse(error_body(ev.error or "generation failed", _error_status(ev)[1]))
            else:
                dones[i] = ev
                yield _sse(chunk_body(rid, model_name, created, chat, reason=ev.finish_reason, index=i))
    if any(d is None for d in dones):   # the client left
        return
    if include_usage:
        body = chunk_body(rid, model_name, created, chat)
        body["choices"], body["usage"] = [], _usage(choices, dones)
        yield _sse(body)
    yield "data: [DONE]\n\n"


def _sse(body: Dict[str, Any]) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

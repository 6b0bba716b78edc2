"""The HTTP app: OpenAI's /v1/completions and /v1/chat/completions (streamed over SSE or
whole), /v1/models, /health and Prometheus /metrics, in front of one EngineLoop."""
from __future__ import annotations

import hmac
import json
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Dict, List, Optional, Tuple

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from pydantic import ValidationError

from ..llm import LLM
from ..params import SamplingParams
from .engine_loop import EngineLoop
from .metrics import Metrics
from .protocol import ChatCompletionRequest, CompletionRequest, unsupported
from .responses import Choice, error_response as _error, respond


class ServerLimits:
    def __init__(self, max_body_bytes: int = 1 << 20, max_prompt_tokens: Optional[int] = None,
                 max_tokens: int = 4096, max_choices: int = 16):
        self.max_body_bytes, self.max_prompt_tokens, self.max_tokens = max_body_bytes, max_prompt_tokens, max_tokens
        self.max_choices = max_choices   # choices per request: prompts times n


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, param: Optional[str] = None, kind="invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind


class _Guard:
    """ASGI middleware in front of every ``/v1`` route: the API key (Bearer, constant-time
    compare) and the declared body size. A plain ASGI callable rather than an ``http``
    middleware function, which would pass every streamed chunk through a task of its own."""

    def __init__(self, app, api_key: Optional[str], max_body_bytes: int):
        self.app, self.api_key, self.max_body_bytes = app, api_key, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            rejected = self._reject(Headers(scope=scope))
            if rejected is not None:
                return await rejected(scope, receive, send)
        await self.app(scope, receive, send)

    def _reject(self, headers: Headers) -> Optional[Response]:
        if self.api_key is not None:
            auth = headers.get("authorization", "")
            given = auth[7:] if auth.lower().startswith("bearer ") else ""
            if not hmac.compare_digest(given.encode(), self.api_key.encode()):
                return _error(401, "invalid or missing API key (Authorization: Bearer <key>)", "authentication_error")
        size = headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > self.max_body_bytes):
            return _error(413, f"request body larger than {self.max_body_bytes} bytes")
        return None


def create_app(llm: LLM, model_name: str, api_key: Optional[str] = None,
               limits: Optional[ServerLimits] = None) -> FastAPI:
    """The app; its engine thread starts with the app and stops with it."""
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        # an empty key would let every request through (an unset variable in --api-key "$KEY")
        raise ValueError("api_key must be a non-empty string (None: no key)")
    limits = limits or ServerLimits()
    metrics = Metrics()
    loop = EngineLoop(llm, metrics)
    metrics.watch(llm.engine, lambda: loop.num_requests, llm.memory())

    @asynccontextmanager
    async def lifespan(_app):
        loop.start()
        try:
            yield
        finally:
            loop.stop()

    app = FastAPI(title="sonarspec", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.engine_loop = loop
    max_len, vocab = llm.engine.max_model_len, llm.engine.model_config.vocab_size

    app.add_middleware(_Guard, api_key=api_key, max_body_bytes=limits.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, exc: RequestValidationError):
        return _error(400, _describe(exc.errors()))

    @app.exception_handler(BadRequest)
    async def _bad(_, exc: BadRequest):
        return _error(exc.status, str(exc), exc.kind, exc.param)

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "ok"} if loop.alive else {"status": "engine stopped"},
                            status_code=200 if loop.alive else 503)

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "sonarspec", "max_model_len": max_len}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await _parse(request, CompletionRequest, limits, model_name)
        prompts = _prompts(llm, req.prompt)
        _check_choices(len(prompts), req.n, limits)
        choices = [c for ids in prompts
                   for c in _choices(ids, _params(req, req.max_tokens, 16, len(ids), limits, max_len, vocab), req.n)]
        return await respond(request, loop, choices, req, model_name, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await _parse(request, ChatCompletionRequest, limits, model_name)
        messages = [{"role": m.role, "content": _content(m.content)} for m in req.messages]
        try:
            ids, turn = llm.chat_request(messages, SamplingParams(max_tokens=1))
        except ValueError as e:
            raise BadRequest(str(e), param="messages") from None
        _check_choices(1, req.n, limits)
        params = replace(_params(req, req.max_completion_tokens or req.max_tokens, None, len(ids), limits, max_len,
                                 vocab),
                         stop_token_ids=turn.stop_token_ids)
        return await respond(request, loop, _choices(ids, params, req.n), req, model_name, chat=True)

    return app


def _describe(errors) -> str:
    parts = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc}: {e.get('msg')}" if loc else str(e.get("msg")))
    return "invalid request: " + "; ".join(parts)


async def _body(request: Request, limit: int) -> bytes:
    """The request body, read until it passes ``limit`` bytes (then a 413): a body sent in
    chunks has no Content-Length for the guard to check."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"request body larger than {limit} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


async def _parse(request: Request, model, limits: ServerLimits, model_name: str):
    body = await _body(request, limits.max_body_bytes)
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        req = model.model_validate(data)
    except ValidationError as e:
        raise BadRequest(_describe(e.errors())) from None
    if req.model is not None and req.model != model_name:
        raise BadRequest(f"model {req.model!r} is not served here; this server serves {model_name!r}",
                         status=404, param="model", kind="not_found_error")
    if isinstance(req, ChatCompletionRequest) and req.top_logprobs is not None and not req.logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    problem = unsupported(req)
    if problem is not None:
        raise BadRequest(problem[1], param=problem[0])
    return req


def _content(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise BadRequest("message content parts must be text parts ({'type': 'text', 'text': ...})",
                             param="messages")
        texts.append(part["text"])
    return "".join(texts)


def _prompts(llm: LLM, prompt) -> List[List[int]]:
    """A completions request's prompts as token ids: a string, token ids, or a list of either."""
    if isinstance(prompt, str) or (prompt and all(isinstance(t, int) for t in prompt)):
        prompt = [prompt]
    if not prompt:
        raise BadRequest("the prompt is empty", param="prompt")
    vocab = llm.engine.model_config.vocab_size
    out = []
    for p in prompt:
        if isinstance(p, str):
            try:
                out.append(llm.tokenizer.encode(p))
            except ValueError as e:
                raise BadRequest(str(e), param="prompt") from None
        elif not p or any(not isinstance(t, int) or t < 0 or t >= vocab for t in p):
            raise BadRequest(f"prompt token ids must be non-empty lists of integers in [0, {vocab})", param="prompt")
        else:
            out.append(list(p))
    return out


def _check_choices(prompts: int, n: int, limits: ServerLimits) -> None:
    if prompts * n > limits.max_choices:
        raise BadRequest(f"{prompts} prompt(s) x n = {n} is {prompts * n} choices; this server answers at most "
                         f"{limits.max_choices} per request", param="n")


def _choices(ids: List[int], params: SamplingParams, n: int) -> List[Choice]:
    """A prompt's ``n`` choices: with a seed, choice j samples with seed + j (the same seed
    would give the same sample)."""
    try:
        return [(ids, params if j == 0 or params.seed is None else replace(params, seed=params.seed + j), j == 0)
                for j in range(n)]
    except ValueError as e:
        raise BadRequest(str(e), param="seed") from None


def _params(req, max_tokens: Optional[int], default: Optional[int], prompt_len: int, limits: ServerLimits,
            max_len: int, vocab: int) -> SamplingParams:
    if prompt_len == 0:
        raise BadRequest("the prompt is empty", param="prompt")
    room = max_len - prompt_len
    if limits.max_prompt_tokens is not None and prompt_len > limits.max_prompt_tokens:
        raise BadRequest(f"the prompt has {prompt_len} tokens; this server takes at most {limits.max_prompt_tokens}",
                         param="prompt")
    if room < 1:
        raise BadRequest(f"the prompt has {prompt_len} tokens; the model's context is {max_len}", param="prompt")
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise BadRequest(f"max_tokens {max_tokens} is above this server's limit of {limits.max_tokens}",
                         param="max_tokens")
    n = max_tokens if max_tokens is not None else (default or min(room, limits.max_tokens))
    stop = [req.stop] if isinstance(req.stop, str) else req.stop
    bias = _logit_bias(req.logit_bias, vocab)
    try:
        return SamplingParams(max_tokens=min(n, room), temperature=req.temperature, top_k=max(0, req.top_k),
                              top_p=req.top_p, seed=req.seed, stop=stop or None, ignore_eos=req.ignore_eos,
                              logprobs=_num_logprobs(req), repetition_penalty=req.repetition_penalty,
                              frequency_penalty=req.frequency_penalty, presence_penalty=req.presence_penalty,
                              logit_bias=bias, max_draft_tokens=req.max_draft_tokens)
    except ValueError as e:
        raise BadRequest(str(e)) from None


def _logit_bias(bias: Optional[Dict[str, float]], vocab: int) -> Optional[Dict[int, float]]:
    """OpenAI's logit_bias (token ids as JSON object keys) as SamplingParams takes it."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit() and int(key) < vocab):
            raise BadRequest(f"logit_bias keys must be token ids in [0, {vocab}), got {key!r}", param="logit_bias")
        out[int(key)] = value
    return out


def _num_logprobs(req) -> Optional[int]:
    """SamplingParams.logprobs for a request: the completions API's count; chat's
    top_logprobs when logprobs is true; else None."""
    if isinstance(req, ChatCompletionRequest):
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs


def serve(llm: LLM, model_name: str, host: str = "127.0.0.1", port: int = 8000, api_key: Optional[str] = None,
          limits: Optional[ServerLimits] = None) -> None:
    import uvicorn
    uvicorn.run(create_app(llm, model_name, api_key, limits), host=host, port=port, log_level="info")


__all__: Tuple[str, ...] = ("create_app", "serve", "ServerLimits")

"""OpenAI-compatible request bodies (pydantic) and the response and stream-chunk shapes."""
from __future__ import annotations

import time
import uuid
from typing import Any, Dict, List, Optional, Tuple, Union

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")   # an unknown field is a 400, as OpenAI answers it
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=-1)      # vLLM's extra field; -1 and 0 both mean off
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = Field(default=1, ge=1)   # choices per prompt
    ignore_eos: bool = False
    presence_penalty: float = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    repetition_penalty: float = Field(default=1.0, gt=0, le=100, allow_inf_nan=False)   # vLLM's extra field
    logit_bias: Optional[Dict[str, float]] = None   # token id -> bias in [-100, 100]
    max_draft_tokens: Optional[int] = Field(default=None, ge=0)   # sonarspec's: SamplingParams.max_draft_tokens
    user: Optional[str] = None   # OpenAI's end-user id: accepted, not used


class CompletionRequest(_Common):
    prompt: Union[str, List[int], List[str], List[List[int]]]   # one prompt, or a list of them
    logprobs: Optional[int] = Field(default=None, ge=0, le=5)   # alternatives per token, as OpenAI allows
    # OpenAI fields served only at their defaults (clients send them so): see ``unsupported``
    echo: bool = False
    best_of: Optional[int] = Field(default=None, ge=1)
    suffix: Optional[str] = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: Union[str, List[Dict[str, Any]], None] = ""


class ChatCompletionRequest(_Common):
    messages: List[ChatMessage]
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=20)
    # OpenAI fields served only at their defaults (clients send them so): see ``unsupported``
    tools: Optional[List[Dict[str, Any]]] = None
    tool_choice: Optional[Union[str, Dict[str, Any]]] = None
    parallel_tool_calls: Optional[bool] = None
    response_format: Optional[Dict[str, Any]] = None


def unsupported(req: Union[CompletionRequest, ChatCompletionRequest]) -> Optional[Tuple[str, str]]:
    """(field, message) for an OpenAI field set to something this server does not do - the
    request is then a 400 naming it; None when every such field has its neutral value
    (echo false, best_of equal to n, an empty suffix, no tools, text responses)."""
    if isinstance(req, CompletionRequest):
        if req.echo:
            return "echo", "echo (the prompt repeated in the completion) is not supported"
        if req.best_of is not None and req.best_of != req.n:
            return "best_of", f"best_of must equal n ({req.n}): choices are not ranked on the server"
        if req.suffix:
            return "suffix", "suffix (text inserted after the completion) is not supported"
        return None
    if req.tools:
        return "tools", "tool calling is not supported"
    if req.tool_choice not in (None, "none", "auto"):
        return "tool_choice", "tool calling is not supported (tool_choice may only be 'none' or 'auto')"
    if req.response_format is not None and req.response_format.get("type") != "text":
        return "response_format", "structured output is not supported (response_format may only be {'type': 'text'})"
    return None


def logprobs_body(entries: Optional[list], token_text, chat: bool, offset: int = 0) -> Optional[Dict[str, Any]]:
    """OpenAI's ``logprobs`` of a choice for ``sampling.logprobs.TokenLogprob`` entries:
    chat's ``{"content": [{token, logprob, bytes, top_logprobs}]}``, or the completions
    API's ``{tokens, token_logprobs, top_logprobs, text_offset}`` (offsets into the output
    from ``offset``). ``token_text(id)`` is a token's text; None without entries."""
    if entries is None:
        return None
    if chat:
        def one(tid, lp):
            t = token_text(tid)
            return {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
        return {"content": [{**one(e.token_id, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]}
                            for e in entries]}
    tokens = [token_text(e.token_id) for e in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{token_text(t): v for t, v in e.top} for e in entries], "text_offset": offsets}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int, cached: int = 0) -> Dict[str, Any]:
    """OpenAI's usage object; ``cached``: prompt tokens whose KV came from the prefix cache."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def choice_body(index: int, text: str, reason: str, chat: bool,
                logprobs: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One finished choice of a response; ``reason``: OpenAI's finish_reason words."""
    choice: Dict[str, Any] = {"index": index, "finish_reason": reason, "logprobs": logprobs}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return choice


def completion_body(rid: str, model: str, choices: List[Dict[str, Any]], u: Dict[str, int], chat: bool,
                    spec: Dict[str, Any]) -> Dict[str, Any]:
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": choices, "usage": u, "speculation": spec}


def chunk_body(rid: str, model: str, created: int, chat: bool, text: Optional[str] = None,
               reason: Optional[str] = None, role: bool = False,
               logprobs: Optional[Dict[str, Any]] = None, index: int = 0) -> Dict[str, Any]:
    choice: Dict[str, Any] = {"index": index, "finish_reason": reason, "logprobs": logprobs}
    if chat:
        delta: Dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice["text"] = text or ""
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": [choice]}


def error_body(message: str, kind: str = "invalid_request_error", code: Optional[str] = None,
               param: Optional[str] = None) -> Dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}



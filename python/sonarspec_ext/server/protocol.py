"""OpenAI-compatible request bodies (pydantic) and the response and stream-chunk shapes."""
from __future__ import annotations

import time
import uuid
from typing import Any, Dict, List, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")   # an unknown field is a 400, as OpenAI answers it
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)      # vLLM's extra field; -1 and 0 both mean off
    seed: Optional[int] = None
    stop: Optional[Union[str, List[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: int = 1
    logprobs: Optional[Any] = None
    ignore_eos: bool = False


class CompletionRequest(_Common):
    prompt: Union[str, List[int], List[str]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: Union[str, List[Dict[str, Any]], None] = ""


class ChatCompletionRequest(_Common):
    messages: List[ChatMessage]
    max_completion_tokens: Optional[int] = Field(default=None, ge=1)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt: int, completion: int) -> Dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(rid: str, model: str, text: str, reason: str, u: Dict[str, int], chat: bool,
                    spec: Dict[str, Any]) -> Dict[str, Any]:
    choice: Dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}   # the engine's: OpenAI's words
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice], "usage": u, "speculation": spec}


def chunk_body(rid: str, model: str, created: int, chat: bool, text: Optional[str] = None,
               reason: Optional[str] = None, role: bool = False) -> Dict[str, Any]:
    choice: Dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
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



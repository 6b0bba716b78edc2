"""Rendering a model's chat template (Jinja, in a sandbox, the way ``transformers``'
``apply_chat_template`` renders it: trimmed blocks, ``raise_exception``, ``tojson``)."""
from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import List, Mapping, Optional, Sequence

ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatTemplateError(ValueError):
    """The conversation is malformed, or the template refused it."""


def check_messages(messages) -> List[dict]:
    """A conversation: a non-empty list of ``{"role": ..., "content": str}`` dicts."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ChatTemplateError("a conversation must be a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"message {i}: expected a dict with 'role' and 'content', "
                                    f"got {type(m).__name__}")
        if m.get("role") not in ROLES:
            raise ChatTemplateError(f"message {i}: role must be one of {ROLES}, got {m.get('role')!r}")
        if not isinstance(m.get("content"), str):
            raise ChatTemplateError(f"message {i}: content must be a string, got "
                                    f"{type(m.get('content')).__name__}")
        out.append(dict(m))
    return out


def render_chat(template: Optional[str], messages: Sequence[Mapping], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "") -> str:
    """The prompt text of a conversation under ``template``."""
    if not template:
        raise ChatTemplateError("this model has no chat template (tokenizer.chat_template / "
                                "tokenizer_config.json); use generate() with a plain prompt")
    import jinja2
    try:
        compiled = _compile(template)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the model's chat template does not compile: {e}") from None
    try:
        return compiled.render(messages=check_messages(messages), add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"the chat template rejected the conversation: {e}") from None


def _raise_exception(message):
    import jinja2
    raise jinja2.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)

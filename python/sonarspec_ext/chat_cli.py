"""``sonarspec chat``: an interactive terminal chat that streams each reply and reports its
speed and acceptance; ``chat_turn`` also serves ``sonarspec generate --chat``."""
from __future__ import annotations

import re
import sys
import time
from typing import Callable, List, Optional, TextIO

from .llm import LLM
from .params import SamplingParams

HELP = "commands: /reset (new conversation), /exit (or Ctrl-D), /help"
# a line that is one slash word (``/reset``, ``/hepl``) is a command, never sent to the model;
# a line that merely starts with a slash (``/etc/hosts lists ...``) is a message
_COMMAND = re.compile(r"/[A-Za-z?]+")


def drafts_summary(steps: int, accepted: int, drafted: int) -> str:
    """", acceptance length T, A/D drafts accepted" for steps that drafted; "" when none did."""
    if not drafted:
        return ""
    return f", acceptance length {(accepted + steps) / max(steps, 1):.2f}, {accepted}/{drafted} drafts accepted"


def chat_turn(llm: LLM, messages: List[dict], params: SamplingParams, out: TextIO = sys.stdout,
              err: TextIO = sys.stderr) -> str:
    """Streams the assistant's reply to ``messages`` to ``out``; one line of speed and
    acceptance for this turn to ``err``. Returns the reply."""
    before = llm.stats()
    t0 = time.perf_counter()
    parts = []
    for delta in llm.stream_chat(messages, params):
        parts.append(delta)
        out.write(delta)
        out.flush()
    dt = time.perf_counter() - t0
    after = llm.stats()
    n = after["num_output_tokens"] - before["num_output_tokens"]
    steps = after["num_steps"] - before["num_steps"]
    accepted = after["num_accepted_tokens"] - before["num_accepted_tokens"]
    drafted = after["num_draft_tokens"] - before["num_draft_tokens"]
    line = f"[{n} tokens in {dt:.2f}s, {n / dt if dt > 0 else 0.0:.1f} tok/s"
    cached = after["num_cached_tokens"] - before["num_cached_tokens"]
    if cached:
        prompt = after["num_prompt_tokens"] - before["num_prompt_tokens"]
        line += f", {cached} of {prompt} prompt tokens from the prefix cache"
    line += drafts_summary(steps, accepted, drafted)
    if drafted:
        lookups = after["num_lookup_steps"] - before["num_lookup_steps"]
        if lookups:
            line += f" ({lookups} of {steps} steps drafted from the context)"
    out.write("\n")
    err.write(line + "]\n")
    err.flush()
    return "".join(parts)


def fit_history(llm: LLM, messages: List[dict], max_tokens: int) -> List[dict]:
    """Drops the oldest turns (keeping a system message) until the rendered prompt leaves
    room for ``max_tokens`` in the context."""
    msgs = list(messages)
    limit = llm.engine.max_model_len - max_tokens
    while True:
        ids, _ = llm.chat_request(msgs, SamplingParams(max_tokens=1))
        first = 1 if msgs and msgs[0]["role"] == "system" else 0
        if len(ids) <= limit or len(msgs) - first <= 1:
            return msgs
        del msgs[first]


def run_chat(llm: LLM, params: SamplingParams, system: Optional[str] = None,
             read: Callable[[str], str] = input, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """The read-reply loop; ends at /exit or end of input."""
    base = [{"role": "system", "content": system}] if system else []
    messages = list(base)
    err.write(HELP + "\n")
    while True:
        try:
            line = read("> ")
        except (EOFError, KeyboardInterrupt):
            out.write("\n")
            return 0
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            messages = list(base)
            err.write("(new conversation)\n")
            continue
        if _COMMAND.fullmatch(text):
            err.write(("" if text in ("/help", "/?") else f"unknown command {text}; ") + HELP + "\n")
            continue
        messages.append({"role": "user", "content": line})
        messages = fit_history(llm, messages, params.max_tokens)
        try:
            reply = chat_turn(llm, messages, params, out, err)
        except KeyboardInterrupt:   # stop this reply, keep the session
            out.write("\n")
            messages.pop()
            continue
        except ValueError as e:
            err.write(f"error: {e}\n")
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": reply})

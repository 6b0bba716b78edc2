"""Prometheus metrics of the server (``GET /metrics``), with the speculation metrics:
drafted and accepted tokens, acceptance per draft position, steps that speculated and steps
that the load control ran plainly."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        p = "sonarspec_"
        self.requests_running = Gauge(p + "requests_running", "Requests in the engine", registry=r)
        self.requests_waiting = Gauge(p + "requests_waiting", "Requests not yet scheduled", registry=r)
        self.finished = Counter(p + "requests_finished", "Finished requests by reason", ["reason"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first token", buckets=_LATENCY,
                              registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time per generated token after the first",
                             buckets=_LATENCY, registry=r)
        self.e2e = Histogram(p + "request_latency_seconds", "Arrival to finish", buckets=_LATENCY, registry=r)
        self.kv_pages_used = Gauge(p + "kv_pages_in_use", "KV cache pages held by requests", registry=r)
        self.kv_pages_total = Gauge(p + "kv_pages_total", "KV cache pages", registry=r)
        self.draft_tokens = Counter(p + "spec_draft_tokens", "Draft tokens proposed (finished requests)",
                                    registry=r)
        self.accepted_tokens = Counter(p + "spec_accepted_tokens", "Draft tokens accepted (finished requests)",
                                       registry=r)
        self.spec_steps = Counter(p + "spec_decode_steps", "Decode steps of finished requests", registry=r)
        self.drafted_at = Counter(p + "spec_drafted_at_position", "Drafts proposed per draft position",
                                  ["position"], registry=r)
        self.accepted_at = Counter(p + "spec_accepted_at_position", "Drafts accepted per draft position",
                                   ["position"], registry=r)
        self.acceptance_length = Gauge(p + "spec_acceptance_length",
                                       "Tokens per decode step over finished requests (tau)", registry=r)
        self.engine_steps = Counter(p + "spec_engine_steps", "Engine steps with decoding sequences: drafted "
                                    "(speculating) or run plainly by the load control (paused)", ["kind"],
                                    registry=r)
        self._engine_steps = {}   # the engine's counts already exported
        self._steps = self._accepted = 0

    def record_finished(self, done, latency_s: float) -> None:
        self.finished.labels(reason=done.finish_reason).inc()
        self.e2e.observe(latency_s)
        st = done.stats or {}
        self.draft_tokens.inc(st.get("num_draft_tokens", 0))
        self.accepted_tokens.inc(st.get("num_accepted_tokens", 0))
        self.spec_steps.inc(st.get("num_steps", 0))
        for i, (d, a) in enumerate(zip(st.get("drafted_per_position", []), st.get("num_accepted_per_position", []))):
            self.drafted_at.labels(position=str(i)).inc(d)
            self.accepted_at.labels(position=str(i)).inc(a)
        self._steps += st.get("num_steps", 0)
        self._accepted += st.get("num_accepted_tokens", 0)
        if self._steps:
            self.acceptance_length.set((self._accepted + self._steps) / self._steps)

    def set_engine_state(self, engine, tracked: int) -> None:
        planner = engine.planner
        self.requests_running.set(tracked)
        self.requests_waiting.set(planner.num_waiting)
        total = engine.kv_cache.num_pages
        self.kv_pages_total.set(total)
        self.kv_pages_used.set(total - planner.num_free_pages)
        for kind, n in engine.decode_steps.items():
            self.engine_steps.labels(kind=kind).inc(n - self._engine_steps.get(kind, 0))
            self._engine_steps[kind] = n

    def render(self) -> bytes:
        return generate_latest(self.registry)

"""Prometheus metrics of the server (``GET /metrics``), with the speculation metrics:
drafted and accepted tokens, acceptance per draft position, steps that speculated and steps
that the load control ran plainly. The engine's state (requests, KV pages, step counts) is
read when the metrics are scraped, so the engine's steps do no metrics work for it."""
from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        p = "sonarspec_"
        self.finished = Counter(p + "requests_finished", "Finished requests by reason", ["reason"], registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter(p + "generation_tokens", "Generated tokens", registry=r)
        self.cached_prompt_tokens = Counter(p + "prefix_cache_hit_tokens", "Prompt tokens whose KV came from the "
                                            "prefix cache (finished requests)", registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Arrival to first token", buckets=_LATENCY,
                              registry=r)
        self.itl = Histogram(p + "inter_token_latency_seconds", "Time per generated token after the first",
                             buckets=_LATENCY, registry=r)
        self.e2e = Histogram(p + "request_latency_seconds", "Arrival to finish", buckets=_LATENCY, registry=r)
        self.draft_tokens = Counter(p + "spec_draft_tokens", "Draft tokens proposed (finished requests)",
                                    registry=r)
        self.accepted_tokens = Counter(p + "spec_accepted_tokens", "Draft tokens accepted (finished requests)",
                                       registry=r)
        self.spec_steps = Counter(p + "spec_decode_steps", "Decode steps of finished requests", registry=r)
        self.lookup_steps = Counter(p + "spec_lookup_steps", "Decode steps that drafted from the context "
                                    "(lookup drafts; finished requests)", registry=r)
        self.lookup_accepted = Counter(p + "spec_lookup_accepted_tokens", "Lookup draft tokens accepted "
                                       "(finished requests)", registry=r)
        self.drafted_at = Counter(p + "spec_drafted_at_position", "Drafts proposed per draft position",
                                  ["position"], registry=r)
        self.accepted_at = Counter(p + "spec_accepted_at_position", "Drafts accepted per draft position",
                                   ["position"], registry=r)
        self.acceptance_length = Gauge(p + "spec_acceptance_length",
                                       "Tokens per decode step over finished requests (tau)", registry=r)
        self.weight_bytes = Gauge(p + "weight_bytes", "Bytes of the models' weights (the drafter's own: what it "
                                  "shares with the target is counted there)", ["model"], registry=r)
        self.kv_pool_bytes = Gauge(p + "kv_pool_bytes", "Bytes of the KV pools (target and drafter)", registry=r)
        self.kv_pool_tokens = Gauge(p + "kv_pool_tokens", "Tokens the KV pools hold", registry=r)
        self._steps = self._accepted = 0

    def watch(self, engine, num_requests: Callable[[], int], memory: dict) -> None:
        """Exports ``engine``'s state at each scrape; ``num_requests``: requests in the engine;
        ``memory``: its ``LLM.memory()`` (fixed once loaded)."""
        self.registry.register(_EngineState(engine, num_requests))
        self.weight_bytes.labels(model="target").set(memory["target_weight_bytes"])
        self.weight_bytes.labels(model="drafter").set(memory["drafter_weight_bytes"])
        self.kv_pool_bytes.set(memory["kv_pool_bytes"])
        self.kv_pool_tokens.set(memory["kv_pool_tokens"])

    def record_finished(self, done, latency_s: float) -> None:
        self.finished.labels(reason=done.finish_reason).inc()
        self.e2e.observe(latency_s)
        st = done.stats or {}
        self.cached_prompt_tokens.inc(st.get("num_cached_tokens", 0))
        self.draft_tokens.inc(st.get("num_draft_tokens", 0))
        self.accepted_tokens.inc(st.get("num_accepted_tokens", 0))
        self.spec_steps.inc(st.get("num_steps", 0))
        self.lookup_steps.inc(st.get("num_lookup_steps", 0))
        self.lookup_accepted.inc(st.get("num_lookup_accepted_tokens", 0))
        for i, (d, a) in enumerate(zip(st.get("drafted_per_position", []), st.get("num_accepted_per_position", []))):
            self.drafted_at.labels(position=str(i)).inc(d)
            self.accepted_at.labels(position=str(i)).inc(a)
        self._steps += st.get("num_steps", 0)
        self._accepted += st.get("num_accepted_tokens", 0)
        if self._steps:
            self.acceptance_length.set((self._accepted + self._steps) / self._steps)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineState:
    """The engine's requests, KV pages and step counts, read at each scrape (the planner's
    counts are thread safe; the step counts are plain integers the engine thread updates)."""

    def __init__(self, engine, num_requests: Callable[[], int]):
        self.engine, self.num_requests = engine, num_requests

    def collect(self):
        p, planner, total = "sonarspec_", self.engine.planner, self.engine.kv_cache.num_pages
        yield GaugeMetricFamily(p + "requests_running", "Requests in the engine", value=self.num_requests())
        yield GaugeMetricFamily(p + "requests_waiting", "Requests not yet scheduled", value=planner.num_waiting)
        yield GaugeMetricFamily(p + "kv_pages_in_use", "KV cache pages held by requests",
                                value=total - planner.num_free_pages)
        yield GaugeMetricFamily(p + "kv_pages_total", "KV cache pages", value=total)
        yield GaugeMetricFamily(p + "kv_pages_cached", "KV cache pages in the prefix cache (held by requests "
                                "or free to evict)", value=planner.num_cached_pages)
        steps = CounterMetricFamily(p + "spec_engine_steps", "Engine steps with decoding sequences: drafted "
                                    "(speculating) or run plainly by the load control (paused)", labels=["kind"])
        for kind, n in dict(self.engine.decode_steps).items():
            steps.add_metric([kind], n)
        yield steps

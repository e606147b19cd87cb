"""Prometheus metrics of every tier, named as DESIGN.md fixes: prefix dsflash_, base units,
counters ending in _total, a `role` label for the tier. Conversation and request ids are
never label values (unbounded cardinality).

One registry per process; `dsflash serve` runs all tiers in one process, and the role label
keeps them apart.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_STEP = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048)
_ACCEPT = (1, 2, 3, 4, 5, 6, 7, 8)
_TRANSFER = (0.0001, 0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry or CollectorRegistry()
        role = ["role"]
        self.ttft = Histogram("dsflash_time_to_first_token_seconds", "Time from request arrival to its first token",
                              role, buckets=_LATENCY, registry=r)
        self.itl = Histogram("dsflash_inter_token_latency_seconds", "Time between consecutive tokens of a request",
                             role, buckets=_LATENCY, registry=r)
        self.duration = Histogram("dsflash_request_duration_seconds", "Time from request arrival to its end", role,
                                  buckets=_LATENCY, registry=r)
        self.requests = Counter("dsflash_requests_total", "Finished requests by finish reason",
                                role + ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("dsflash_prompt_tokens_total", "Prompt tokens received", role, registry=r)
        self.generation_tokens = Counter("dsflash_generation_tokens_total", "Tokens generated", role, registry=r)
        self.cached_tokens = Counter("dsflash_cached_prompt_tokens_total",
                                     "Prompt tokens served from a cached conversation (not computed)", role, registry=r)
        self.computed_tokens = Counter("dsflash_prefill_computed_tokens_total", "Prompt tokens a prefill computed",
                                       role, registry=r)
        self.accept = Histogram("dsflash_spec_accept_length", "Tokens emitted per decode step (DSpark acceptance)",
                                role, buckets=_ACCEPT, registry=r)
        self.drafted = Counter("dsflash_spec_draft_tokens_total", "Draft tokens proposed", role, registry=r)
        self.accepted = Counter("dsflash_spec_accepted_tokens_total", "Draft tokens accepted", role, registry=r)
        self.step = Histogram("dsflash_decode_step_seconds", "Duration of one decode step (draft + verify)", role,
                              buckets=_STEP, registry=r)
        self.transfer_bytes = Counter("dsflash_kv_transfer_bytes_total", "KV cache bytes moved between workers",
                                      role + ["transport"], registry=r)
        self.transfer_seconds = Histogram("dsflash_kv_transfer_seconds", "Duration of one KV cache handoff",
                                          role + ["transport"], buckets=_TRANSFER, registry=r)
        self.transfer_failures = Counter("dsflash_kv_transfer_failures_total",
                                         "KV handoffs that failed (peer gone, timeout, checksum)", role, registry=r)
        self.host_cache_bytes = Gauge("dsflash_kv_host_cache_bytes", "Bytes of conversation caches kept in host memory",
                                      role, registry=r)
        self.host_cache_evictions = Counter("dsflash_kv_host_cache_evictions_total",
                                            "Conversation caches evicted", role, registry=r)
        self.running = Gauge("dsflash_requests_running", "Requests being computed", role, registry=r)
        self.waiting = Gauge("dsflash_requests_waiting", "Requests queued for memory or a slot", role, registry=r)
        self.prefill_queue = Gauge("dsflash_prefill_queue_tokens", "Prompt tokens queued for prefill", role,
                                   registry=r)
        self.kv_free_bytes = Gauge("dsflash_kv_pool_free_bytes", "Free bytes of the KV pool", role, registry=r)
        self.degraded = Gauge("dsflash_directory_degraded", "1 while Redis is unreachable (local ownership)", role,
                              registry=r)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """A /metrics endpoint on its own port (workers)."""
        start_http_server(port, addr=host, registry=self.registry)


class RequestTimer:
    """TTFT, inter-token latency and duration of one request, from the tier that streams it."""

    def __init__(self, metrics: Metrics, role: str, prompt_tokens: int):
        self.m, self.role = metrics, role
        self.began = self.last = time.monotonic()
        self.first = None
        metrics.prompt_tokens.labels(role).inc(prompt_tokens)

    def tokens(self, count: int) -> None:
        if count <= 0:
            return
        now = time.monotonic()
        if self.first is None:
            self.first = now
            self.m.ttft.labels(self.role).observe(now - self.began)
        else:
            # tokens of one chunk arrive together: spread the gap over them
            gap = (now - self.last) / count
            for _ in range(count):
                self.m.itl.labels(self.role).observe(gap)
        self.last = now
        self.m.generation_tokens.labels(self.role).inc(count)

    def finish(self, reason: str, cached_tokens: int = 0) -> None:
        self.m.duration.labels(self.role).observe(time.monotonic() - self.began)
        self.m.requests.labels(self.role, reason).inc()
        self.m.cached_tokens.labels(self.role).inc(cached_tokens)

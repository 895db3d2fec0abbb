"""The server's Prometheus series, on a registry of its own (two servers in one process, as in
tests, do not collide)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class ServeMetrics:
    """Requests by route and status, request latency, batch sizes, inference time, and the
    queue depth, read from ``queue_depth`` at scrape time."""

    def __init__(self, queue_depth: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("ringtrain_serve_requests", "HTTP requests answered",
                                ["route", "code"], registry=self.registry)
        self.latency = Histogram("ringtrain_serve_request_seconds", "Request latency",
                                 ["route"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.batch_size = Histogram("ringtrain_serve_batch_size", "Inputs per model call",
                                    buckets=_BATCH_BUCKETS, registry=self.registry)
        self.inference = Histogram("ringtrain_serve_inference_seconds", "Model time per batch",
                                   buckets=_LATENCY_BUCKETS, registry=self.registry)
        depth = Gauge("ringtrain_serve_queue_depth", "Inputs waiting for the model",
                      registry=self.registry)
        depth.set_function(queue_depth)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """One request, as :class:`~ringtrain.web.request_timing.RequestTiming` reports it."""
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def observe_batch(self, size: int, seconds: float) -> None:
        """Record one model call."""
        self.batch_size.observe(size)
        self.inference.observe(seconds)

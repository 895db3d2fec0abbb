"""What the dashboard shows of a deployment's replicas, read from each one's ``/metrics``.

A replica (``ringtrain serve``) exports cumulative series: requests by route and code, request
latency and batch size histograms. Rates and percentiles are of the interval since the previous
scrape of that replica (its first scrape: of its whole life), so they describe now, not the
average since it started.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: Seconds one replica's /metrics may take before it is reported unreachable.
TIMEOUT_S = 2.0


def _totals(text: str) -> dict[str, Any]:
    """Cumulative counts of one exposition: requests, errors, latency buckets, batch sizes."""
    requests = errors = 0.0
    latency: dict[float, float] = {}
    batch_sum = batch_count = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "ringtrain_serve_requests_total":
                requests += s.value
                if s.labels.get("code", "200")[:1] in ("4", "5"):
                    errors += s.value
            elif s.name == "ringtrain_serve_request_seconds_bucket":
                bound = float(s.labels["le"])
                latency[bound] = latency.get(bound, 0.0) + s.value
            elif s.name == "ringtrain_serve_batch_size_sum":
                batch_sum += s.value
            elif s.name == "ringtrain_serve_batch_size_count":
                batch_count += s.value
    return {"requests": requests, "errors": errors, "latency": latency,
            "batch_sum": batch_sum, "batch_count": batch_count}


def _quantile(buckets: dict[float, float], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram, interpolated within its bucket."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    target = q * buckets[bounds[-1]]
    low_bound, low_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= target:
            if math.isinf(bound):
                return low_bound
            share = (target - low_count) / (count - low_count) if count > low_count else 1.0
            return low_bound + (bound - low_bound) * share
        low_bound, low_count = bound, count
    return None


class ReplicaScraper:
    """Scrapes replicas and keeps each one's previous totals, for rates over the interval.

    Args:
        get: fetches a URL's text (injectable for tests); raises on failure.
    """

    def __init__(self, get: Callable[[str], str] | None = None):
        self._get = get or _http_get
        self._previous: dict[str, tuple[float, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def scrape(self, url: str) -> dict[str, Any]:
        """``{"url", "rate", "p50", "p99", "mean_batch", "errors"}`` of one replica (seconds,
        requests per second; ``None`` where there is nothing to say yet), or
        ``{"url", "error"}`` if its metrics cannot be read."""
        try:
            now, totals = time.monotonic(), _totals(self._get(url.rstrip("/") + "/metrics"))
        except Exception as e:  # noqa: BLE001 - any failure is shown on the page, not raised
            return {"url": url, "error": f"unreachable: {type(e).__name__}"}
        with self._lock:
            before = self._previous.get(url)
            self._previous[url] = (now, totals)
        base = before[1] if before is not None and before[1]["requests"] <= totals["requests"] \
            else None
        delta = {k: totals[k] - (base[k] if base else 0.0)
                 for k in ("requests", "errors", "batch_sum", "batch_count")}
        latency = {b: c - (base["latency"].get(b, 0.0) if base else 0.0)
                   for b, c in totals["latency"].items()}
        rate = None if before is None else delta["requests"] / max(now - before[0], 1e-9)
        return {"url": url, "rate": rate, "p50": _quantile(latency, 0.5),
                "p99": _quantile(latency, 0.99),
                "mean_batch": delta["batch_sum"] / delta["batch_count"]
                if delta["batch_count"] else None,
                "errors": int(totals["errors"])}


def _http_get(url: str) -> str:
    response = httpx.get(url, timeout=TIMEOUT_S)
    response.raise_for_status()
    return response.text

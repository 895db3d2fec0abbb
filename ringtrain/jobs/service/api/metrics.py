"""The job service's Prometheus metrics, served at ``/metrics``.

Counts of jobs and nodes are computed from the store at scrape time (they are the records, so
they cannot drift from them); the scheduler's tick time and the API's latency are histograms
observed as they happen. API latency is measured to the start of the response, so a followed
log or the dashboard's event stream counts for its set-up, not for the hours it stays open.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ringtrain.jobs.models import JobState, NodeCounts
from ringtrain.jobs.service.job_service import JobService

_WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, float("inf"))


class _StoreCollector(Collector):
    """Jobs by state and cluster, queue length and waits, nodes by state: read at scrape."""

    def __init__(self, service: JobService):
        self.service = service

    def collect(self) -> Iterator[Any]:
        jobs = self.service.store.list_jobs()
        now = self.service.clock()
        by_state = GaugeMetricFamily("ringtrain_jobs", "Jobs by state and cluster.",
                                     labels=["state", "cluster"])
        counts = Counter((j.state.value, j.cluster) for j in jobs)
        for (state, cluster), n in sorted(counts.items()):
            by_state.add_metric([state, cluster], n)
        yield by_state
        queued = [j for j in jobs if j.state == JobState.QUEUED]
        length = GaugeMetricFamily("ringtrain_jobs_queue_length", "Jobs queued, by cluster.",
                                   labels=["cluster"])
        oldest = GaugeMetricFamily("ringtrain_jobs_queue_oldest_wait_seconds",
                                   "How long the longest-waiting queued job has waited.",
                                   labels=["cluster"])
        for cluster, n in sorted(Counter(j.cluster for j in queued).items()):
            length.add_metric([cluster], n)
            oldest.add_metric([cluster], max(now - j.created_at for j in queued
                                              if j.cluster == cluster))
        yield length
        yield oldest
        # Submission to the first node claimed, of every job that got nodes.
        waits = sorted(j.started_at - j.created_at for j in jobs if j.started_at is not None)
        buckets, i = [], 0
        for bound in _WAIT_BUCKETS:
            while i < len(waits) and waits[i] <= bound:
                i += 1
            buckets.append(("+Inf" if bound == float("inf") else str(bound), i))
        wait = HistogramMetricFamily("ringtrain_jobs_queue_wait_seconds",
                                     "From submission to getting nodes, of started jobs.")
        wait.add_metric([], buckets, sum(waits))
        yield wait
        nodes = GaugeMetricFamily("ringtrain_nodes", "Cluster nodes by state.",
                                  labels=["state", "cluster"])
        for c in self.service.store.list_clusters():
            for state in NodeCounts.model_fields:
                nodes.add_metric([state, c.name], getattr(c.node_counts, state))
        yield nodes


class ServiceMetrics:
    """The registry of one job service, with the histograms its parts observe into.

    Args:
        service: the service whose store and scheduler are measured.
    """

    def __init__(self, service: JobService):
        self.registry = CollectorRegistry()
        self.registry.register(_StoreCollector(service))
        self.tick_seconds = Histogram(
            "ringtrain_jobs_scheduler_tick_seconds", "Time of one scheduler pass.",
            registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, float("inf")))
        self.api_seconds = Histogram(
            "ringtrain_jobs_api_request_seconds",
            "Time from a request's arrival to the start of its response.",
            ["method", "route", "status"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, float("inf")))
        service.tick_observers.append(self.tick_seconds.observe)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """One API request, as :class:`~ringtrain.web.request_timing.RequestTiming` reports it."""
        self.api_seconds.labels(method, route, str(status)).observe(seconds)

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)

"""The scaling forecast's performance model: pure arithmetic from measured inputs to a step time.

A worker's step is its compute, plus the part of the gradients' reduction backward could not
hide, plus input-pipeline time in the training process; loader workers beside it cap the step
rate instead. Buckets are reduced one at a time as soon as each is ready and the network is
free, as ``DistributedOptimizer`` and Horovod's fusion buffer do. The formulas of ring,
hierarchical and parameter-server reduction: docs/forecast.md, "The model".

Nothing here measures or imports torch: :mod:`ringtrain.doctor.forecast` feeds it the
buckets ``DistributedOptimizer`` planned and timed (:class:`~ringtrain.torch.grad_bucket.Bucket`,
named here for types only).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ringtrain.torch.grad_bucket import Bucket

@dataclass(frozen=True)
class Link:
    """One kind of connection: ``latency_s`` per message step and ``bandwidth_Bps`` (bytes per
    second one worker can push through it while the others do the same)."""

    latency_s: float
    bandwidth_Bps: float

    def __post_init__(self) -> None:
        if self.latency_s < 0 or self.bandwidth_Bps <= 0:
            raise ValueError(f"a link needs latency >= 0 and bandwidth > 0, got {self}")


@dataclass(frozen=True)
class Network:
    """The links between workers: ``intra`` within a host, ``inter`` across hosts, with the
    profile's name and what it assumes (shown with every forecast)."""

    name: str
    intra: Link
    inter: Link
    assumptions: str = ""


@dataclass(frozen=True)
class Workload:
    """One worker's step, measured (or published) on one worker.

    Attributes:
        compute_ms: Forward, backward and optimizer of one step, without waiting for data.
        buckets: The gradient buckets in the order they become ready.
        batch_size: Samples per worker per step (0: unknown; rates are then steps/s).
        inline_data_ms: Input-pipeline time inside the training process per step (loading
            without loader workers): added to the step.
        pipeline_ms: Milliseconds per batch the worker's background input pipeline delivers at
            best (``None``: faster than the step; it never limits).
        overlap: Fraction of the time before the end of backward in which reductions proceed
            without slowing compute: 1 for a GPU (the device computes while the NIC moves
            bytes), 0 for CPU training that uses every core it has (a reduction takes cores
            from backward, so nothing is hidden).
    """

    compute_ms: float
    buckets: tuple[Bucket, ...]
    batch_size: int = 0
    inline_data_ms: float = 0.0
    pipeline_ms: float | None = None
    overlap: float = 1.0

    def __post_init__(self) -> None:
        if self.compute_ms <= 0:
            raise ValueError(f"compute_ms must be positive, got {self.compute_ms}")
        if not 0.0 <= self.overlap <= 1.0:
            raise ValueError(f"overlap must be within [0, 1], got {self.overlap}")
        if self.inline_data_ms < 0 or (self.pipeline_ms is not None and self.pipeline_ms <= 0):
            raise ValueError("inline_data_ms must be >= 0 and pipeline_ms positive")


@dataclass(frozen=True)
class Strategy:
    """How gradients are reduced: ``ring``, ``hierarchical`` or ``ps`` with ``servers``
    parameter servers (0: one per host of workers, as TensorFlow's usual layout)."""

    kind: str
    servers: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("ring", "hierarchical", "ps"):
            raise ValueError(f"strategy must be ring, hierarchical or ps, got {self.kind!r}")
        if self.servers < 0:
            raise ValueError("servers must not be negative")

    @property
    def label(self) -> str:
        """``ring``, ``hierarchical``, ``ps (k=4)`` or ``ps (k=hosts)``."""
        if self.kind != "ps":
            return self.kind
        return f"ps (k={self.servers or 'hosts'})"

    @staticmethod
    def parse(text: str) -> Strategy:
        """``ring``, ``hierarchical``, ``ps`` or ``ps:K``.

        Raises:
            ValueError: anything else.
        """
        kind, _, k = text.partition(":")
        if k and (kind != "ps" or not k.isdigit() or int(k) < 1):
            raise ValueError(f"strategy {text!r}: use ring, hierarchical, ps or ps:K (K >= 1)")
        return Strategy(kind, int(k) if k else 0)


@dataclass(frozen=True)
class Layout:
    """``workers`` workers placed ``per_host`` to a host (the last host may hold fewer)."""

    workers: int
    per_host: int

    def __post_init__(self) -> None:
        if self.workers < 1 or self.per_host < 1:
            raise ValueError(f"workers and per_host must be positive, got {self}")

    @property
    def local(self) -> int:
        """Workers on a full host."""
        return min(self.workers, self.per_host)

    @property
    def hosts(self) -> int:
        """Hosts used."""
        return -(-self.workers // self.per_host)


@dataclass(frozen=True)
class Point:
    """The forecast of one size under one strategy.

    ``step_ms`` splits into ``compute_ms``, ``exposed_comm_ms`` (reduction not hidden by
    backward), ``inline_data_ms`` and ``pipeline_wait_ms`` (waiting for a background pipeline
    slower than the rest); ``comm_ms`` is all reduction time, hidden or not. ``efficiency``:
    throughput over ``workers`` times one worker's without communication (Horovod's scaling
    efficiency); ``limit``: the resource the step waits on most beyond compute.
    """

    workers: int
    strategy: str
    step_ms: float
    compute_ms: float
    comm_ms: float
    exposed_comm_ms: float
    inline_data_ms: float
    pipeline_wait_ms: float
    rate: float
    efficiency: float
    limit: str
    notes: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v)
                for k, v in self.__dict__.items()}


def allreduce_ms(nbytes: int, layout: Layout, network: Network, strategy: Strategy) -> float:
    """Milliseconds to reduce ``nbytes`` once over ``layout`` with ``strategy`` (0 for one
    worker); the formulas are in docs/forecast.md."""
    p = layout.workers
    if p == 1 or nbytes <= 0:
        return 0.0
    if strategy.kind == "ps":
        # Each worker's own NIC carries n each way; the servers' NICs carry p n between them.
        link = network.inter if layout.hosts > 1 or strategy.servers else network.intra
        servers = strategy.servers or layout.hosts
        per_direction = max(1.0, p / servers) * nbytes / link.bandwidth_Bps
        return 1e3 * (2 * link.latency_s + 2 * per_direction)
    if strategy.kind == "ring" or layout.hosts == 1:
        link = network.inter if layout.hosts > 1 else network.intra
        return 1e3 * (2 * (p - 1) * link.latency_s
                      + 2 * (p - 1) / p * nbytes / link.bandwidth_Bps)
    local, hosts = layout.local, layout.hosts
    within = (2 * (local - 1) * network.intra.latency_s
              + 2 * (local - 1) / local * nbytes / network.intra.bandwidth_Bps)
    across = (2 * (hosts - 1) * network.inter.latency_s
              + 2 * (hosts - 1) / hosts * nbytes / network.inter.bandwidth_Bps)
    return 1e3 * (within + across)


def exposed_ms(buckets: Sequence[Bucket], costs: Sequence[float], overlap: float) -> float:
    """Reduction time left after backward ends: buckets are reduced one at a time, each from
    when it is ready and the previous one is done; ``overlap`` (see :class:`Workload`) is the
    share of that schedule that really hides behind backward."""
    total = sum(costs)
    if total == 0:
        return 0.0
    done: float | None = None
    for bucket, cost in zip(buckets, costs):
        start = -bucket.ready_before_end_ms
        done = max(start, done if done is not None else start) + cost
    assert done is not None  # costs has one entry per bucket and sums to non-zero
    scheduled = max(0.0, done)
    return overlap * scheduled + (1.0 - overlap) * total


def forecast_point(workload: Workload, layout: Layout, network: Network,
                   strategy: Strategy) -> Point:
    """The step time, rate and limit of ``workload`` on ``layout``."""
    costs = [allreduce_ms(b.nbytes, layout, network, strategy) for b in workload.buckets]
    exposed = exposed_ms(workload.buckets, costs, workload.overlap)
    busy = workload.compute_ms + exposed + workload.inline_data_ms
    pipeline_wait = max(0.0, (workload.pipeline_ms or 0.0) - busy)
    step = busy + pipeline_wait
    alone = workload.compute_ms + workload.inline_data_ms
    if workload.pipeline_ms is not None:
        alone = max(alone, workload.pipeline_ms)
    per_step = workload.batch_size or 1
    rate = layout.workers * per_step * 1e3 / step
    waits = {"network": exposed, "input pipeline": workload.inline_data_ms + pipeline_wait}
    limit = max(waits, key=waits.__getitem__)
    if waits[limit] < 0.05 * step:  # nothing beside compute takes a twentieth of the step
        limit = "compute"
    return Point(layout.workers, strategy.label, step, workload.compute_ms, sum(costs), exposed,
                 workload.inline_data_ms, pipeline_wait, rate, alone / step, limit)


def forecast(workload: Workload, sizes: Iterable[int], per_host: int, network: Network,
             strategies: Iterable[Strategy]) -> list[Point]:
    """:func:`forecast_point` for every size and strategy (sizes in order, strategies within).

    Raises:
        ValueError: a size below 1.
    """
    strategies = list(strategies)
    return [forecast_point(workload, Layout(n, per_host), network, s)
            for n in sizes for s in strategies]

"""`EngineConfig`: the settings one engine is built with, and their defaults (Horovod's).

A pure leaf (standard library only): the launcher carries it from its flags and YAML to the
workers, and must import neither torch nor the engine to do so. The ``HOROVOD_*`` variables that
transport it are named only in ``contract/env.py``, which renders and parses it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``DistributedOptimizer``'s default gradient bucket size (DDP's).
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


@dataclass(frozen=True)
class AutotuneConfig:
    """``--autotune``'s settings (Horovod's flags and defaults): samples thrown away first,
    training steps per sample, samples of the Bayesian optimisation, the noise its Gaussian
    process assumes, and where the log goes (``None``: no log)."""

    log_file: str | None = None
    warmup_samples: int = 3
    steps_per_sample: int = 10
    max_samples: int = 20
    gaussian_process_noise: float = 0.8


@dataclass(frozen=True)
class EngineConfig:
    """The engine settings a launcher passes to its workers.

    ``bucket_bytes`` (``DistributedOptimizer``'s gradient buckets) and ``threads_per_rank``
    (intra-op threads set at ``init()``; ``None``: PyTorch's default) are ringtrain's own
    knobs; ``autotune`` (``None``: off) tunes them and the cycle time online.
    """

    fusion_threshold_bytes: int = 128 * 1024 * 1024  # Horovod's default fusion buffer
    cycle_time_ms: float = 1.0
    cache_capacity: int = 1024
    timeline_filename: str | None = None
    timeline_mark_cycles: bool = False
    stall_check_enabled: bool = True
    stall_warning_s: float = 60.0
    stall_shutdown_s: float = 0.0  # 0 = never fail a stalled job, as in Horovod
    log_level: str | None = None
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    threads_per_rank: int | None = None
    autotune: AutotuneConfig | None = None
    #: Collectives between ranks of one host through shared memory: None = wherever two ranks
    #: share a host, False = never (Gloo over loopback), True = the same as None, but asked for.
    shared_memory: bool | None = None
    #: Which ranks share memory: "host", those of one host name (Horovod's rule, and what a
    #: launch over several host names of one machine tests), or "machine", every rank of one
    #: kernel, whatever its host name (the nodes of a local job cluster, all on one machine).
    shared_memory_scope: str = "host"
    #: Allreduce of sets spanning hosts: within each host, then across one leader per host
    #: (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE). None = whenever shared memory is used.
    hierarchical_allreduce: bool | None = None

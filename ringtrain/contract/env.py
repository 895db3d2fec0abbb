"""The launcher-to-worker environment contract: the only module that names these variables.

The launcher builds each worker's environment with :func:`worker_environ`; a worker parses its own
with :func:`read_worker_env`, once, inside ``init()``. A worker started by another launcher
(torchrun, mpirun, Slurm's srun) or by hand as a single process is recognised from that
launcher's own variables.
"""

from __future__ import annotations

import builtins
import os
import re
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ringtrain import shm_names
from ringtrain.engine.config import DEFAULT_BUCKET_BYTES, AutotuneConfig, EngineConfig
from ringtrain.errors import ConfigError
from ringtrain.record_fields import REQUIRED, FieldError, text_field

DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_MASTER_PORT = 29500
#: Horovod's default elastic timeout (HOROVOD_ELASTIC_TIMEOUT).
DEFAULT_ELASTIC_TIMEOUT_S = 600.0

# Set by `ringtrain run` only: the rendezvous store is served by the launcher, so every rank is a
# client of it (otherwise rank 0 serves it).
LAUNCHER_STORE = "RINGTRAIN_LAUNCHER_STORE"
# Set by `ringtrain run` only: the prefix under which this launch's keys live in the store.
RUN_ID = "RINGTRAIN_RUN_ID"
# Set by an elastic `ringtrain run` only (Horovod's flag, then this worker's place in the launch).
ELASTIC = "HOROVOD_ELASTIC"
ELASTIC_TIMEOUT = "HOROVOD_ELASTIC_TIMEOUT"
ELASTIC_WORKER = "RINGTRAIN_ELASTIC_WORKER"
ELASTIC_GENERATION = "RINGTRAIN_ELASTIC_GENERATION"
# ringtrain's own engine knobs (Horovod has none for them): gradient bucket bytes, and the
# intra-op threads each rank sets at init().
BUCKET_BYTES = "RINGTRAIN_BUCKET_BYTES"
THREADS_PER_RANK = "RINGTRAIN_THREADS_PER_RANK"
# Collectives within a host through shared memory (unset: wherever ranks share a host).
SHM = "RINGTRAIN_SHM"
SHM_SCOPE = shm_names.SCOPE_VAR
SHM_SCOPES = ("host", "machine")
HIERARCHICAL_ALLREDUCE = "HOROVOD_HIERARCHICAL_ALLREDUCE"


def store_prefix(run_id: str, generation: int) -> str:
    """The store prefix of one ``init()`` of one launch; each re-init gets a fresh generation."""
    return f"ringtrain/{run_id}/init.{generation}/"


def engine_environ(config: EngineConfig) -> dict[str, str]:
    """The engine's settings as Horovod's environment variables."""
    env = {
        "HOROVOD_FUSION_THRESHOLD": str(config.fusion_threshold_bytes),
        "HOROVOD_CYCLE_TIME": _fmt_float(config.cycle_time_ms),
        "HOROVOD_CACHE_CAPACITY": str(config.cache_capacity),
        "HOROVOD_STALL_CHECK_DISABLE": "0" if config.stall_check_enabled else "1",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": _fmt_float(config.stall_warning_s),
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": _fmt_float(config.stall_shutdown_s),
    }
    if config.timeline_filename:
        env["HOROVOD_TIMELINE"] = config.timeline_filename
        env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1" if config.timeline_mark_cycles else "0"
    if config.log_level:
        env["HOROVOD_LOG_LEVEL"] = config.log_level
    if config.bucket_bytes != DEFAULT_BUCKET_BYTES:
        env[BUCKET_BYTES] = str(config.bucket_bytes)
    if config.threads_per_rank is not None:
        env[THREADS_PER_RANK] = str(config.threads_per_rank)
    tune = config.autotune
    if tune is not None:
        env.update({"HOROVOD_AUTOTUNE": "1",
                    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": str(tune.warmup_samples),
                    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": str(tune.steps_per_sample),
                    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": str(tune.max_samples),
                    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE":
                        _fmt_float(tune.gaussian_process_noise)})
        if tune.log_file:
            env["HOROVOD_AUTOTUNE_LOG"] = tune.log_file
    if config.shared_memory is not None:
        env[SHM] = "1" if config.shared_memory else "0"
    if config.shared_memory_scope != "host":
        env[SHM_SCOPE] = config.shared_memory_scope
    if config.hierarchical_allreduce is not None:
        env[HIERARCHICAL_ALLREDUCE] = "1" if config.hierarchical_allreduce else "0"
    return env


def _read_autotune(r: _Reader, environ: Mapping[str, str]) -> AutotuneConfig | None:
    if not r.bool("HOROVOD_AUTOTUNE", False):
        return None
    d = AutotuneConfig()
    return AutotuneConfig(
        log_file=environ.get("HOROVOD_AUTOTUNE_LOG") or None,
        warmup_samples=r.int("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", d.warmup_samples),
        steps_per_sample=r.int("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", d.steps_per_sample),
        max_samples=r.int("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", d.max_samples),
        gaussian_process_noise=r.float("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
                                       d.gaussian_process_noise))


def read_engine_config(environ: Mapping[str, str]) -> EngineConfig:
    """Read the engine's settings from Horovod's variables, defaulting what is unset.

    Raises:
        ConfigError: a variable is set to something that is not a number or a boolean, or
            hierarchical allreduce is asked for with shared memory turned off.
    """
    r = _Reader(environ)
    default = EngineConfig()
    shm, hierarchical = r.opt_bool(SHM), r.opt_bool(HIERARCHICAL_ALLREDUCE)
    if shm is False and hierarchical:
        raise ConfigError(f"{HIERARCHICAL_ALLREDUCE}=1 reduces within each host through shared "
                          f"memory, which {SHM}=0 turns off; unset one of them")
    scope = environ.get(SHM_SCOPE, "").strip() or "host"
    if scope not in SHM_SCOPES:
        raise ConfigError(f"environment variable {SHM_SCOPE}={scope!r} is not one of "
                          f"{', '.join(SHM_SCOPES)}")
    return EngineConfig(
        fusion_threshold_bytes=r.int("HOROVOD_FUSION_THRESHOLD", default.fusion_threshold_bytes),
        cycle_time_ms=r.float("HOROVOD_CYCLE_TIME", default.cycle_time_ms),
        cache_capacity=r.int("HOROVOD_CACHE_CAPACITY", default.cache_capacity),
        timeline_filename=environ.get("HOROVOD_TIMELINE") or None,
        timeline_mark_cycles=r.bool("HOROVOD_TIMELINE_MARK_CYCLES", False),
        stall_check_enabled=not r.bool("HOROVOD_STALL_CHECK_DISABLE", False),
        stall_warning_s=r.float("HOROVOD_STALL_CHECK_TIME_SECONDS", default.stall_warning_s),
        stall_shutdown_s=r.float("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", default.stall_shutdown_s),
        log_level=environ.get("HOROVOD_LOG_LEVEL") or None,
        bucket_bytes=r.int(BUCKET_BYTES, default.bucket_bytes),
        threads_per_rank=r.opt_int(THREADS_PER_RANK),
        autotune=_read_autotune(r, environ),
        shared_memory=shm,
        shared_memory_scope=scope,
        hierarchical_allreduce=hierarchical,
    )


@dataclass(frozen=True)
class ElasticWorker:
    """A worker of an elastic launch: its id (fixed for its life) and the world it was started
    for; ``init()`` asks the launcher's store for its rank in that world and the later ones."""

    worker_id: int
    generation: int
    timeout_s: float = DEFAULT_ELASTIC_TIMEOUT_S

    def environ(self) -> dict[str, str]:
        """This worker's elastic variables."""
        return {ELASTIC: "1", ELASTIC_WORKER: str(self.worker_id),
                ELASTIC_GENERATION: str(self.generation),
                ELASTIC_TIMEOUT: _fmt_float(self.timeout_s)}


def elastic_timeout_from_environ(environ: Mapping[str, str]) -> float:
    """``HOROVOD_ELASTIC_TIMEOUT``, or Horovod's default of 600 s (``ConfigError``: not a
    number)."""
    return _Reader(environ).float(ELASTIC_TIMEOUT, DEFAULT_ELASTIC_TIMEOUT_S)


@dataclass(frozen=True)
class WorkerEnv:
    """What a worker learns about its place in the job from its environment.

    ``local_rank``/``local_size``/``cross_*`` are ``None`` when the launcher did not say; ``init``
    then derives them from the hostnames of all ranks.
    """

    rank: int
    size: int
    hostname: str
    launcher: str  # "ringtrain", "torchrun", "mpirun", "slurm" or "none"
    local_rank: int | None = None
    local_size: int | None = None
    cross_rank: int | None = None
    cross_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    launcher_store: bool = False
    run_id: str = "default"
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    knobs: EngineConfig = field(default_factory=EngineConfig)
    elastic: ElasticWorker | None = None  # set under an elastic `ringtrain run` only


def worker_environ(
    *,
    rank: int,
    size: int,
    local_rank: int,
    local_size: int,
    cross_rank: int,
    cross_size: int,
    hostname: str,
    master_addr: str,
    master_port: int,
    run_id: str,
    start_timeout_s: float,
    knobs: EngineConfig,
    elastic: ElasticWorker | None = None,
) -> dict[str, str]:
    """The variables `ringtrain run` adds to one worker's environment.

    Both Horovod's and torchrun's names are set, so that code written for either finds its place.
    In an elastic launch the ranks are those of the world the worker is started for.
    """
    env = {
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(local_size),
        "HOROVOD_CROSS_RANK": str(cross_rank),
        "HOROVOD_CROSS_SIZE": str(cross_size),
        "HOROVOD_HOSTNAME": hostname,
        "HOROVOD_START_TIMEOUT": _fmt_float(start_timeout_s),
        "RANK": str(rank),
        "WORLD_SIZE": str(size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_size),
        "GROUP_RANK": str(cross_rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        LAUNCHER_STORE: "1",
        RUN_ID: run_id,
    }
    env.update(engine_environ(knobs))
    if elastic is not None:
        env.update(elastic.environ())
    return env


def socket_ifname_environ(ifnames: Sequence[str]) -> dict[str, str]:
    """The variables that make Gloo and NCCL open their sockets on these interfaces only."""
    joined = ",".join(ifnames)
    return {"GLOO_SOCKET_IFNAME": joined, "NCCL_SOCKET_IFNAME": joined}


def unbuffered_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """Make Python workers write each line as it is printed (unless the user chose otherwise).

    The launcher reads workers through pipes, where Python would otherwise buffer output in
    blocks, so a tailed ``rank.N/stdout`` would lag by kilobytes.
    """
    return {} if "PYTHONUNBUFFERED" in environ else {"PYTHONUNBUFFERED": "1"}


def prepend_pythonpath(directory: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``PYTHONPATH`` with ``directory`` first (the ``horovod`` shim of ``--horovod-compat``)."""
    existing = environ.get("PYTHONPATH")
    return {"PYTHONPATH": directory + (os.pathsep + existing if existing else "")}


# Variables that describe the launcher's own host or login session and would be wrong on
# another host (Horovod forwards the rest of the environment to remote ranks too).
_HOST_SPECIFIC = re.compile(
    r"HOSTNAME|HOST|PWD|OLDPWD|SHLVL|_|SSH_\w*|BASH_FUNC_.*|DISPLAY|XAUTHORITY|XDG_RUNTIME_DIR"
    r"|XDG_SESSION_\w*|TMUX|TMUX_PANE|DBUS_SESSION_BUS_ADDRESS"
)
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def remote_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The part of the launcher's environment that is forwarded to ranks on other hosts.

    Everything is forwarded (PATH, PYTHONPATH, VIRTUAL_ENV, the user's own variables) except
    variables tied to this host or login session, and names a shell cannot assign.
    """
    return {k: v for k, v in environ.items()
            if _SHELL_NAME.fullmatch(k) and not _HOST_SPECIFIC.fullmatch(k)}


#: The launchers a worker recognises, looked for in this order, by their variables: the rank
#: and the world size (``both``: recognised only when both are set), then the local rank and size
#: and the cross rank and size, as far as the launcher sets them.
_LAUNCHERS: tuple[tuple[str, bool, str, str, tuple[str, ...]], ...] = (
    ("ringtrain", False, "HOROVOD_RANK", "HOROVOD_SIZE",
     ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")),
    ("torchrun", True, "RANK", "WORLD_SIZE", ("LOCAL_RANK", "LOCAL_WORLD_SIZE")),
    ("mpirun", False, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("mpirun", False, "PMI_RANK", "PMI_SIZE", ("MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
    ("slurm", True, "SLURM_PROCID", "SLURM_NTASKS", ("SLURM_LOCALID",)),
)


def read_worker_env(environ: Mapping[str, str] | None = None) -> WorkerEnv:
    """Parse this process's place in the job from the environment of whichever launcher started it.

    Raises:
        ConfigError: a variable is malformed, or a multi-process launch lacks the rendezvous
            address (MASTER_ADDR/MASTER_PORT) that only ringtrain's and torchrun's launchers set.
    """
    environ = os.environ if environ is None else environ
    r = _Reader(environ)
    knobs = read_engine_config(environ)
    start_timeout = r.float("HOROVOD_START_TIMEOUT", DEFAULT_START_TIMEOUT_S)
    hostname = environ.get("HOROVOD_HOSTNAME") or socket.gethostname()
    common: dict[str, Any] = dict(knobs=knobs, start_timeout_s=start_timeout, hostname=hostname)

    found = next((t for t in _LAUNCHERS if t[2] in environ and (not t[1] or t[3] in environ)), None)
    if found is None:
        return WorkerEnv(rank=0, size=1, launcher="none", local_rank=0, local_size=1,
                         cross_rank=0, cross_size=1, **common)
    launcher, _, rank_var, size_var, place_vars = found
    rank, size = r.int(rank_var), r.int(size_var)
    # What the launcher does not set stays None: init() derives it from the ranks' hostnames.
    place: dict[str, Any] = dict(zip(("local_rank", "local_size", "cross_rank", "cross_size"),
                                     map(r.opt_int, place_vars)))

    if not 0 <= rank < size:
        raise ConfigError(f"{launcher} says rank {rank} of world size {size}: the rank must lie in "
                          f"[0, {size}); check the launcher's variables")
    master_addr = environ.get("MASTER_ADDR")
    if master_addr is None and launcher == "slurm":
        master_addr = first_slurm_host(
            environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or "")
    if size > 1 and not master_addr:
        raise ConfigError(
            f"started by {launcher} as rank {rank} of {size}, but MASTER_ADDR is not set: export "
            "MASTER_ADDR (the host of rank 0) and MASTER_PORT to every rank, or launch with "
            "`ringtrain run`")
    return WorkerEnv(
        rank=rank, size=size, launcher=launcher, master_addr=master_addr,
        master_port=r.int("MASTER_PORT", DEFAULT_MASTER_PORT),
        launcher_store=r.bool(LAUNCHER_STORE, False)
        or r.bool("TORCHELASTIC_USE_AGENT_STORE", False),
        run_id=environ.get(RUN_ID) or environ.get("TORCHELASTIC_RUN_ID") or "default",
        elastic=_elastic_worker(r) if launcher == "ringtrain" else None,
        **place, **common,
    )


def _elastic_worker(r: _Reader) -> ElasticWorker | None:
    if not r.bool(ELASTIC, False):
        return None
    return ElasticWorker(worker_id=r.int(ELASTIC_WORKER), generation=r.int(ELASTIC_GENERATION),
                         timeout_s=r.float(ELASTIC_TIMEOUT, DEFAULT_ELASTIC_TIMEOUT_S))


def first_slurm_host(nodelist: str) -> str | None:
    """The first host of a Slurm node list such as ``node[07-09,12],gpu3``."""
    m = re.match(r"([^,\[]+)(?:\[(\d+))?", nodelist.strip())
    if not m:
        return None
    return m.group(1) + (m.group(2) or "")


def _fmt_float(x: float) -> str:
    return repr(float(x)).removesuffix(".0")


class _Reader:
    """Typed access to environment variables with errors that name the variable."""

    def __init__(self, environ: Mapping[str, str]):
        self._env = environ

    def _parse(self, name: str, default, convert, kind: str):
        try:
            return text_field(self._env, name, convert, kind, default)
        except FieldError as e:
            raise ConfigError(f"environment variable {e}") from None

    # The methods are named after the types they return, so inside the class those names are the
    # methods: annotations spell the types through ``builtins``.
    def int(self, name: str, default: builtins.int | None = None) -> builtins.int:
        return self._parse(name, REQUIRED if default is None else default, builtins.int,
                           "an integer")

    def opt_int(self, name: str) -> builtins.int | None:
        return self._parse(name, None, builtins.int, "an integer")

    def float(self, name: str, default: builtins.float) -> builtins.float:
        return self._parse(name, default, builtins.float, "a number")

    def bool(self, name: str, default: builtins.bool) -> builtins.bool:
        return self._parse(name, default, _to_bool, "a boolean (1/0, true/false)")

    def opt_bool(self, name: str) -> builtins.bool | None:
        return self._parse(name, None, _to_bool, "a boolean (1/0, true/false)")


def _to_bool(raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


"""`LaunchConfig`: everything `ringtrain run` was asked to do, frozen and validated once.

:func:`load_config` merges the sources, highest first: the command line, ``--config-file``,
Horovod's ``HOROVOD_*`` variables in the launcher's environment (for the engine knobs, as
horovodrun leaves an exported knob alone unless a flag sets it), then the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ringtrain.contract.env import (
    DEFAULT_ELASTIC_TIMEOUT_S,
    elastic_timeout_from_environ,
    read_engine_config,
)
from ringtrain.engine.config import AutotuneConfig, EngineConfig
from ringtrain.errors import ConfigError
from ringtrain.log_level import LOG_LEVELS, is_log_level
from ringtrain.runner import hosts as hostlib
from ringtrain.runner.config_file import read_config_file
from ringtrain.runner.options import AUTOTUNE_DESTS, BY_DEST, OPTIONS, parse_argv

_MIB = 1024 * 1024


@dataclass(frozen=True)
class ElasticSpec:
    """How an elastic launch may grow, shrink and re-form (horovodrun's elastic options);
    a field out of range raises ``ConfigError``, naming the flag."""

    min_np: int
    max_np: int | None = None  # None: every slot discovery reports
    discovery_script: str | None = None  # None: the fixed hosts of -H/--hostfile
    reset_limit: int | None = None  # None: re-form as often as needed
    timeout_s: float = DEFAULT_ELASTIC_TIMEOUT_S
    slots_per_host: int = 1  # for hosts the discovery script prints without a slot count
    world_file: str | None = None  # where each world is written as it forms

    def __post_init__(self) -> None:
        if self.min_np < 1:
            raise ConfigError(f"--min-np: must be at least 1, not {self.min_np}")
        if self.max_np is not None and self.max_np < self.min_np:
            raise ConfigError(f"--max-np: {self.max_np} is below --min-np {self.min_np}")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise ConfigError(f"--reset-limit: must not be negative, not {self.reset_limit}")
        if self.timeout_s <= 0:
            raise ConfigError(f"--elastic-timeout: must be positive, not {self.timeout_s}")
        if self.slots_per_host < 1:
            raise ConfigError(f"--slots-per-host: must be at least 1, not {self.slots_per_host}")
        if self.discovery_script is not None and not Path(self.discovery_script).is_file():
            raise ConfigError(f"--host-discovery-script: {self.discovery_script} does not exist")


@dataclass(frozen=True)
class NodeSpec:
    """A per-node launch: this process starts one node's ranks of a job of several nodes;
    a field out of range raises ``ConfigError``, naming the flag."""

    nnodes: int
    node_rank: int
    nproc_per_node: int
    endpoint_host: str
    endpoint_port: int
    name: str
    rdzv_timeout_s: float = 600.0
    #: Started by the ssh launcher: output goes framed to stdout, stdin closing stops the node.
    stdio: bool = False

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes: must be at least 1, not {self.nnodes}")
        if self.node_rank < 0:
            raise ConfigError(f"--node-rank: must not be negative, not {self.node_rank}")
        if self.nproc_per_node < 1:
            raise ConfigError(f"--nproc-per-node: must be at least 1, not {self.nproc_per_node}")
        if not 0 < self.endpoint_port < 65536:
            raise ConfigError(f"--rdzv-endpoint: {self.endpoint_port} is not a TCP port (1-65535)")
        if self.rdzv_timeout_s <= 0:
            raise ConfigError(f"--rdzv-timeout: must be positive, not {self.rdzv_timeout_s}")
        if self.stdio and self.node_rank == 0:
            raise ConfigError("--node-stdio: node 0 drives the job and prints its output itself; "
                              "give it to the other nodes only")

    @property
    def is_driver(self) -> bool:
        """Whether this node serves the rendezvous and drives the job (node 0)."""
        return self.node_rank == 0


@dataclass(frozen=True)
class LaunchConfig:
    """A validated launch request; a field out of range raises ``ConfigError``, naming the
    flag."""

    command: tuple[str, ...]
    num_proc: int
    hosts: tuple[hostlib.HostInfo, ...]
    ssh_port: int | None = None
    ssh_identity_file: str | None = None
    start_timeout_s: float = 30.0
    #: How long another node may go without a sign of life (``--node-timeout``).
    node_timeout_s: float = 10.0
    network_interfaces: tuple[str, ...] = ()
    output_filename: str | None = None
    result_file: str | None = None
    prefix_output_with_timestamp: bool = False
    verbose: bool = False
    knobs: EngineConfig = field(default_factory=EngineConfig)
    #: Put the ``horovod`` shim on the workers' PYTHONPATH (see ``plan.horovod_compat_environ``).
    horovod_compat: bool = False
    #: Elastic training; ``num_proc`` is then the size of the first world.
    elastic: ElasticSpec | None = None
    #: A per-node launch (``--nnodes``); ``hosts`` is then empty (the nodes register).
    node: NodeSpec | None = None

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no command given: put the program after the options, e.g. "
                              "`ringtrain run -np 2 python train.py`")
        discovered = self.node is not None or (
            self.elastic is not None and self.elastic.discovery_script is not None)
        if not self.hosts and not discovered:
            raise ConfigError("-H/--hosts: no host given")
        if self.num_proc < 1:
            raise ConfigError(f"-np/--num-proc: {self.num_proc} ranks requested; give at least 1")
        if self.elastic is not None and not (
                self.elastic.min_np <= self.num_proc <= (self.elastic.max_np or self.num_proc)):
            raise ConfigError(f"-np/--num-proc: {self.num_proc} lies outside --min-np/--max-np")
        slots = hostlib.total_slots(self.hosts)
        if self.num_proc > slots and not discovered:
            listed = ",".join(f"{h.hostname}:{h.slots}" for h in self.hosts)
            raise ConfigError(
                f"-np/--num-proc: {self.num_proc} ranks requested but the hosts ({listed}) have "
                f"only {slots} slots; lower -np or add slots to -H/--hostfile")
        if self.ssh_port is not None and not 0 < self.ssh_port < 65536:
            raise ConfigError(f"-p/--ssh-port: {self.ssh_port} is not a TCP port (1-65535)")
        if self.start_timeout_s <= 0:
            raise ConfigError(f"--start-timeout: must be positive, not {self.start_timeout_s}")
        if self.node_timeout_s <= 0:
            raise ConfigError(f"--node-timeout: must be positive, not {self.node_timeout_s}")
        if self.output_filename and Path(self.output_filename).is_file():
            raise ConfigError(f"--output-filename: {self.output_filename} is a file; give a "
                              "directory (each rank writes rank.N/stdout and rank.N/stderr)")
        _check_knobs(self.knobs)


def load_config(argv: Sequence[str], environ: Mapping[str, str]) -> LaunchConfig:
    """The validated configuration of ``ringtrain run ARGV`` in the launcher's ``environ``
    (read for ``HOROVOD_*`` knobs only).

    Raises:
        ConfigError: any bad or contradictory input; the message names the flag.
    """
    given, command = parse_argv(argv)
    if "config_file" in given:
        from_file, file_command = read_config_file(given["config_file"])
        given = from_file | given
        command = command or file_command
    values = {opt.dest: opt.default for opt in OPTIONS} | given

    if values["mpi"]:
        raise ConfigError("--mpi: ringtrain has no MPI; it always uses Gloo (and NCCL for CUDA "
                          "tensors). Drop --mpi, or pass --gloo")
    elastic = _elastic(values, environ)
    host_list = _hosts(values)
    node = _node(values)
    num_proc, host_list = _ranks_and_hosts(values, host_list, elastic, node)
    identity = values["ssh_identity_file"]
    if identity is not None and not Path(identity).is_file():
        raise ConfigError(f"-i/--ssh-identity-file: {identity} does not exist")
    return LaunchConfig(
        command=tuple(command),
        num_proc=num_proc,
        hosts=tuple(host_list),
        ssh_port=values["ssh_port"],
        ssh_identity_file=identity,
        start_timeout_s=values["start_timeout"],
        node_timeout_s=values["node_timeout"],
        network_interfaces=_interfaces(values["network_interfaces"]),
        output_filename=values["output_filename"],
        result_file=values["result_file"],
        prefix_output_with_timestamp=values["prefix_output_with_timestamp"],
        verbose=values["verbose"],
        knobs=_knobs(values, environ),
        horovod_compat=values["horovod_compat"],
        elastic=elastic,
        node=node,
    )


def _ranks_and_hosts(values: dict[str, Any], host_list: list[hostlib.HostInfo],
                     elastic: ElasticSpec | None, node: NodeSpec | None
                     ) -> tuple[int, list[hostlib.HostInfo]]:
    """How many ranks to start, and on which hosts (this one when none is named)."""
    if node is not None:
        values["num_proc"] = node.nnodes * node.nproc_per_node
    if elastic is not None and elastic.discovery_script is not None and host_list:
        raise ConfigError("--host-discovery-script and -H/--hosts or --hostfile both given; "
                          "the script says which hosts to use")
    num_proc = values["num_proc"]
    if num_proc is None and elastic is not None:
        num_proc = elastic.min_np
    if num_proc is None and not host_list:
        raise ConfigError("-np/--num-proc is required when no -H/--hosts or --hostfile is "
                          "given, e.g. `ringtrain run -np 2 python train.py`")
    if num_proc is None:
        num_proc = hostlib.total_slots(host_list)
    if not host_list and node is None and (elastic is None or elastic.discovery_script is None):
        host_list = [hostlib.HostInfo("localhost", max(num_proc, 1))]
    return num_proc, host_list


def _node(values: dict[str, Any]) -> NodeSpec | None:
    """The per-node options, or ``None`` for a launch from one host.

    Raises:
        ConfigError: a per-node option without ``--nnodes``, a missing one, or one that
            contradicts placing ranks from one host.
    """
    names = ("node_rank", "nproc_per_node", "rdzv_endpoint", "node_name", "node_stdio")
    if values["nnodes"] is None:
        given = [BY_DEST[d].name for d in names if values[d] not in (None, False)]
        if given:
            raise ConfigError(f"{', '.join(given)}: only for per-node launches; add --nnodes N")
        return None
    clash = [BY_DEST[d].name for d in ("num_proc", "hosts", "hostfile", "host_discovery_script")
             if values[d] is not None]
    if clash:
        raise ConfigError(f"{', '.join(clash)}: a per-node launch (--nnodes) places "
                          "--nproc-per-node ranks on each node that joins; drop them")
    for dest in ("node_rank", "rdzv_endpoint"):
        if values[dest] is None:
            raise ConfigError(f"--nnodes needs {BY_DEST[dest].name} too, e.g. `ringtrain run "
                              "--nnodes 2 --node-rank 0 --rdzv-endpoint 10.0.0.1:29400 ...`")
    endpoint = values["rdzv_endpoint"]
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--rdzv-endpoint: {endpoint!r} is not HOST:PORT, e.g. "
                          "10.0.0.1:29400")
    rank = values["node_rank"]
    return NodeSpec(nnodes=values["nnodes"], node_rank=rank,
                    nproc_per_node=values["nproc_per_node"] or 1, endpoint_host=host,
                    endpoint_port=int(port), name=values["node_name"] or f"node{rank}",
                    rdzv_timeout_s=values["rdzv_timeout"], stdio=bool(values["node_stdio"]))


def _hosts(values: dict[str, Any]) -> list[hostlib.HostInfo]:
    if values["hosts"] is not None and values["hostfile"] is not None:
        raise ConfigError("-H/--hosts and --hostfile both given; use one of them")
    try:
        if values["hosts"] is not None:
            return hostlib.parse_hosts(values["hosts"])
        if values["hostfile"] is not None:
            path = values["hostfile"]
            try:
                text = Path(path).read_text()
            except OSError as e:
                raise ConfigError(f"--hostfile {path}: cannot read it ({e.strerror})") from None
            return hostlib.parse_hostfile(text, f"--hostfile {path}")
    except ValueError as e:  # hosts' parse errors (a ConfigError passes through unchanged)
        raise ConfigError(str(e)) from None
    return []


def _interfaces(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise ConfigError(f"--network-interfaces: {text!r} has an empty name; write e.g. eth0,eth1")
    return names


def _knobs(values: dict[str, Any], environ: Mapping[str, str]) -> EngineConfig:
    knobs = read_engine_config(environ)
    # Options given (a config file may say false) as they are: the timeline's file is relative
    # to the ranks' working directory.
    changes: dict[str, Any] = {key: values[dest] for dest, key in (
        ("cycle_time_ms", "cycle_time_ms"), ("cache_capacity", "cache_capacity"),
        ("timeline_filename", "timeline_filename"), ("log_level", "log_level"),
        ("stall_check_warning_time_seconds", "stall_warning_s"),
        ("stall_check_shutdown_time_seconds", "stall_shutdown_s"),
        ("threads_per_rank", "threads_per_rank"),
        ("hierarchical_allreduce", "hierarchical_allreduce")) if values[dest] is not None}
    for dest, key in (("fusion_threshold_mb", "fusion_threshold_bytes"),
                      ("bucket_mb", "bucket_bytes")):
        if values[dest] is not None:
            changes[key] = int(values[dest] * _MIB)
    if values["disable_cache"]:
        changes["cache_capacity"] = 0
    if values["timeline_mark_cycles"]:
        changes["timeline_mark_cycles"] = True
    if values["no_stall_check"]:
        changes["stall_check_enabled"] = False
    autotune = _autotune(values)
    if autotune is not None:
        changes["autotune"] = autotune
    if values["shm"] and values["no_shm"]:
        raise ConfigError("--shm and --no-shm contradict each other; give one of them")
    if values["shm"] or values["no_shm"]:
        changes["shared_memory"] = bool(values["shm"])
    knobs = replace(knobs, **changes)
    if knobs.shared_memory is False and knobs.hierarchical_allreduce:
        raise ConfigError("--hierarchical-allreduce reduces within each host through shared "
                          "memory, which --no-shm (RINGTRAIN_SHM=0) turns off; give one of them")
    return knobs


def _check_knobs(knobs: EngineConfig) -> None:
    checks = (
        (knobs.fusion_threshold_bytes >= 0, "fusion_threshold_mb", "must not be negative"),
        (knobs.cycle_time_ms > 0, "cycle_time_ms", "must be positive"),
        (knobs.cache_capacity >= 0, "cache_capacity", "must not be negative"),
        (knobs.bucket_bytes >= 1, "bucket_mb", "must be positive"),
        (knobs.threads_per_rank is None or knobs.threads_per_rank >= 1, "threads_per_rank",
         "must be at least 1"),
        (knobs.stall_warning_s > 0, "stall_check_warning_time_seconds", "must be positive"),
        (knobs.stall_shutdown_s >= 0, "stall_check_shutdown_time_seconds",
         "must not be negative (0 = never shut down)"),
        (knobs.log_level is None or is_log_level(knobs.log_level), "log_level",
         f"must be one of {', '.join(LOG_LEVELS)}"),
    )
    for ok, dest, what in checks:
        if not ok:
            raise ConfigError(f"{BY_DEST[dest].name} {what}")


def _autotune(values: dict[str, Any]) -> AutotuneConfig | None:
    """``--autotune``'s settings (``None``: off).

    Raises:
        ConfigError: an ``--autotune-*`` setting without ``--autotune``, or a value out of
            range.
    """
    given = [BY_DEST[dest].name for dest in AUTOTUNE_DESTS
             if dest != "autotune" and values[dest] is not None]
    if not values["autotune"]:
        if given:
            raise ConfigError(f"{', '.join(given)} given without --autotune (or `autotune: "
                              "{enabled: true}` in --config-file): add it, or drop them")
        return None
    d = AutotuneConfig()
    tune = AutotuneConfig(
        log_file=values["autotune_log_file"],
        warmup_samples=_given(values, "autotune_warmup_samples", d.warmup_samples),
        steps_per_sample=_given(values, "autotune_steps_per_sample", d.steps_per_sample),
        max_samples=_given(values, "autotune_bayes_opt_max_samples", d.max_samples),
        gaussian_process_noise=_given(values, "autotune_gaussian_process_noise",
                                      d.gaussian_process_noise))
    for ok, dest, what in (
            (tune.warmup_samples >= 0, "autotune_warmup_samples", "must not be negative"),
            (tune.steps_per_sample >= 1, "autotune_steps_per_sample", "must be at least 1"),
            (tune.max_samples >= 1, "autotune_bayes_opt_max_samples", "must be at least 1"),
            (tune.gaussian_process_noise >= 0, "autotune_gaussian_process_noise",
             "must not be negative")):
        if not ok:
            raise ConfigError(f"{BY_DEST[dest].name} {what}")
    return tune


def _given(values: dict[str, Any], dest: str, default: Any) -> Any:
    return default if values[dest] is None else values[dest]


def _elastic(values: dict[str, Any], environ: Mapping[str, str]) -> ElasticSpec | None:
    """The elastic options, or ``None`` for a fixed world.

    As horovodrun, a launch is elastic when it has a discovery script or ``--min-np``; the other
    elastic options alone are refused, since they would do nothing.
    """
    min_np, script = values["min_np"], values["host_discovery_script"]
    if min_np is None and script is None:
        given = [BY_DEST[dest].name for dest in ("max_np", "reset_limit", "elastic_timeout",
                                                 "slots_per_host", "world_file")
                 if values[dest] is not None]
        if given:
            raise ConfigError(f"{', '.join(given)}: only for elastic launches; add --min-np N "
                              "or --host-discovery-script FILE")
        return None
    min_np = min_np if min_np is not None else values["num_proc"]
    if min_np is None:
        raise ConfigError("an elastic launch needs -np/--num-proc or --min-np: how many ranks "
                          "to start with")
    timeout = values["elastic_timeout"]
    if timeout is None:
        timeout = elastic_timeout_from_environ(environ)
    return ElasticSpec(min_np=min_np, max_np=values["max_np"], discovery_script=script,
                       reset_limit=values["reset_limit"], timeout_s=timeout,
                       slots_per_host=values["slots_per_host"] or 1,
                       world_file=values["world_file"])


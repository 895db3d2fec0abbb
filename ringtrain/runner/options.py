"""The options of `ringtrain run` (horovodrun's), defined once for the command line and YAML.

Every option is one :class:`Option` row: the argument parser, the config file reader and error
messages all come from this table, so the three cannot drift apart (Horovod keeps flags, YAML
keys and environment names in hand-synchronised copies).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ringtrain.errors import ConfigError
from ringtrain.log_level import LOG_LEVELS


@dataclass(frozen=True)
class Option:
    """One option: its flags, where it is stored and how its text value is converted.

    ``type`` is ``None`` for on/off flags. ``default`` is what applies when neither the command
    line nor the config file sets the option (``None``: decided later, e.g. from the environment).
    """

    flags: tuple[str, ...]
    dest: str
    help: str
    group: str
    type: Callable[[str], Any] | None = None
    default: Any = None
    metavar: str | None = None

    @property
    def name(self) -> str:
        """How messages name the option, e.g. ``-np/--num-proc``."""
        return "/".join(self.flags)


def _opt(*flags: str, dest: str, help: str, group: str, type=None, default=None,
         metavar=None) -> Option:
    return Option(tuple(flags), dest, help, group, type, default, metavar)


_PLACE, _NODE, _OUT, _TUNE, _TIMELINE, _STALL, _AUTOTUNE, _ELASTIC, _CTRL = (
    "placement", "per-node launch", "output", "tuning", "timeline", "stall check", "autotune",
    "elastic", "controller")

OPTIONS: tuple[Option, ...] = (
    _opt("-np", "--num-proc", dest="num_proc", type=int, metavar="N", group=_PLACE,
         help="number of ranks (default: the total slots of -H/--hostfile)"),
    _opt("-H", "--hosts", dest="hosts", type=str, metavar="HOST:SLOTS,...", group=_PLACE,
         help="hosts and their slots, e.g. localhost:2,node2:4 (default: localhost:NP)"),
    _opt("-hostfile", "--hostfile", dest="hostfile", type=str, metavar="FILE", group=_PLACE,
         help="file with one `HOST slots=N` per line"),
    _opt("-p", "--ssh-port", dest="ssh_port", type=int, metavar="PORT", group=_PLACE,
         help="ssh port of the remote hosts"),
    _opt("-i", "--ssh-identity-file", dest="ssh_identity_file", type=str, metavar="FILE",
         group=_PLACE, help="ssh private key for the remote hosts"),
    _opt("--start-timeout", dest="start_timeout", type=float, default=30.0, metavar="SECONDS",
         group=_PLACE, help="how long each rank may take to start (ssh included); default 30"),
    _opt("--network-interfaces", "--network-interface", dest="network_interfaces", type=str,
         metavar="IF,...", group=_PLACE,
         help="interfaces for the rendezvous and the collectives, e.g. eth0"),
    _opt("--nnodes", dest="nnodes", type=int, metavar="N", group=_NODE,
         help="per-node launch: start only this node's ranks; the job has N nodes (elastic: "
              "the first world's), each running `ringtrain run` with the same options"),
    _opt("--node-rank", dest="node_rank", type=int, metavar="K", group=_NODE,
         help="per-node launch: this node's rank; node 0 serves the rendezvous and drives "
              "the job, the others start the ranks it places on them"),
    _opt("--nproc-per-node", dest="nproc_per_node", type=int, metavar="P", group=_NODE,
         help="per-node launch: ranks on this node (default 1)"),
    _opt("--rdzv-endpoint", dest="rdzv_endpoint", type=str, metavar="HOST:PORT", group=_NODE,
         help="per-node launch: where node 0 serves the rendezvous store (it binds HOST:PORT; "
              "the ranks reach it there too)"),
    _opt("--node-name", dest="node_name", type=str, metavar="NAME", group=_NODE,
         help="per-node launch: the host name of this node's ranks (default: nodeK)"),
    _opt("--rdzv-timeout", dest="rdzv_timeout", type=float, default=600.0, metavar="SECONDS",
         group=_NODE, help="per-node launch: how long node 0 waits for the other nodes, and "
                           "they for node 0 (default 600)"),
    _opt("--node-timeout", dest="node_timeout", type=float, default=10.0, metavar="SECONDS",
         group=_NODE, help="per-node and ssh launches: how long another node may go without a "
                           "sign of life before its ranks fail as `stopped answering` (default "
                           "10)"),
    _opt("--node-stdio", dest="node_stdio", group=_NODE,
         help="per-node launch, not node 0 (how the ssh launcher starts each remote host): send "
              "the ranks' output on stdout to the launcher, which prints it and writes "
              "--output-filename, and stop the ranks when stdin closes"),
    _opt("--output-filename", dest="output_filename", type=str, metavar="DIR", group=_OUT,
         help="also write each rank's output to DIR/rank.N/stdout and DIR/rank.N/stderr"),
    _opt("--prefix-output-with-timestamp", dest="prefix_output_with_timestamp", group=_OUT,
         help="prefix each line on the terminal with the time it was read"),
    _opt("--result-file", dest="result_file", type=str, metavar="FILE", group=_OUT,
         help="write the outcome to FILE as JSON: the exit status, the summary line and each "
              "root cause's rank and exit code (the job service reads it)"),
    _opt("--verbose", dest="verbose", group=_OUT, help="log what the launcher does"),
    _opt("--log-level", dest="log_level", type=str.upper, metavar="LEVEL", group=_OUT,
         help=f"the workers' log level, one of {', '.join(LOG_LEVELS)}"),
    _opt("--fusion-threshold-mb", dest="fusion_threshold_mb", type=float, metavar="MB",
         group=_TUNE, help="fusion buffer size in MiB (Horovod's default: 128)"),
    _opt("--cycle-time-ms", dest="cycle_time_ms", type=float, metavar="MS", group=_TUNE,
         help="time between engine cycles (default: 1)"),
    _opt("--cache-capacity", dest="cache_capacity", type=int, metavar="N", group=_TUNE,
         help="response cache entries (default: 1024)"),
    _opt("--disable-cache", dest="disable_cache", group=_TUNE,
         help="turn the response cache off (--cache-capacity 0)"),
    _opt("--shm", dest="shm", group=_TUNE,
         help="collectives between ranks of one host through shared memory (the default "
              "wherever two ranks share a host)"),
    _opt("--no-shm", dest="no_shm", group=_TUNE,
         help="collectives between ranks of one host through Gloo over loopback (as "
              "RINGTRAIN_SHM=0)"),
    _opt("--hierarchical-allreduce", dest="hierarchical_allreduce", group=_TUNE,
         help="allreduce within each host first, then across one leader per host (the default "
              "with shared memory)"),
    _opt("--timeline-filename", dest="timeline_filename", type=str, metavar="FILE",
         group=_TIMELINE, help="write a Chrome-trace timeline of the collectives to FILE"),
    _opt("--timeline-mark-cycles", dest="timeline_mark_cycles", group=_TIMELINE,
         help="mark engine cycles in the timeline"),
    _opt("--no-stall-check", dest="no_stall_check", group=_STALL,
         help="do not report tensors that some ranks never submit"),
    _opt("--stall-check-warning-time-seconds", dest="stall_check_warning_time_seconds",
         type=float, metavar="SECONDS", group=_STALL,
         help="report a stall after this long (default: 60)"),
    _opt("--stall-check-shutdown-time-seconds", dest="stall_check_shutdown_time_seconds",
         type=float, metavar="SECONDS", group=_STALL,
         help="fail a stalled job after this long (default: 0, never)"),
    _opt("--bucket-mb", dest="bucket_mb", type=float, metavar="MB", group=_TUNE,
         help="DistributedOptimizer's gradient bucket size in MiB (default: 25)"),
    _opt("--threads-per-rank", dest="threads_per_rank", type=int, metavar="N", group=_TUNE,
         help="intra-op threads each rank sets at init (default: PyTorch's)"),
    _opt("--autotune", dest="autotune", group=_AUTOTUNE,
         help="tune the gradient bucket size, cycle time and threads per rank online with "
              "Bayesian optimisation, then train on with the best (needs ringtrain[autotune])"),
    _opt("--autotune-log-file", dest="autotune_log_file", type=str, metavar="FILE",
         group=_AUTOTUNE, help="write every sample to FILE (Horovod's CSV columns) and the "
                               "best settings to FILE.best.yaml, for --config-file"),
    _opt("--autotune-warmup-samples", dest="autotune_warmup_samples", type=int, metavar="N",
         group=_AUTOTUNE, help="samples thrown away before tuning (default: 3)"),
    _opt("--autotune-steps-per-sample", dest="autotune_steps_per_sample", type=int,
         metavar="N", group=_AUTOTUNE, help="training steps per sample (default: 10)"),
    _opt("--autotune-bayes-opt-max-samples", dest="autotune_bayes_opt_max_samples", type=int,
         metavar="N", group=_AUTOTUNE, help="samples tried before the best is kept (default: 20)"),
    _opt("--autotune-gaussian-process-noise", dest="autotune_gaussian_process_noise",
         type=float, metavar="X", group=_AUTOTUNE,
         help="noise of the Gaussian process, on normalised scores (default: 0.8)"),
    _opt("--min-np", "--min-num-proc", dest="min_np", type=int, metavar="N", group=_ELASTIC,
         help="elastic: fewest ranks to keep running (default: -np)"),
    _opt("--max-np", "--max-num-proc", dest="max_np", type=int, metavar="N", group=_ELASTIC,
         help="elastic: most ranks to run (default: every discovered slot)"),
    _opt("--host-discovery-script", dest="host_discovery_script", type=str, metavar="FILE",
         group=_ELASTIC, help="elastic: executable that prints the current `host:slots`"),
    _opt("--slots-per-host", dest="slots_per_host", type=int, metavar="N", group=_ELASTIC,
         help="elastic: slots of a host the discovery script prints without :SLOTS (default 1)"),
    _opt("--reset-limit", dest="reset_limit", type=int, metavar="N", group=_ELASTIC,
         help="elastic: most times the world may be re-formed (default: no limit)"),
    _opt("--world-file", dest="world_file", type=str, metavar="FILE", group=_ELASTIC,
         help="elastic: write each world as it forms to FILE as JSON: its hosts and workers, and "
              "every worker lost so far with why (the job service reads it)"),
    _opt("--elastic-timeout", dest="elastic_timeout", type=float, metavar="SECONDS",
         group=_ELASTIC, help="elastic: how long to wait for enough slots and for a new world "
         "to form (default: HOROVOD_ELASTIC_TIMEOUT or 600)"),
    _opt("--gloo", dest="gloo", group=_CTRL, help="use Gloo (always; accepted for horovodrun)"),
    _opt("--mpi", dest="mpi", group=_CTRL, help="not available: ringtrain has no MPI"),
    _opt("--horovod-compat", dest="horovod_compat", group=_CTRL,
         help="let workers `import horovod.torch` and get ringtrain"),
    _opt("--config-file", dest="config_file", type=str, metavar="FILE", group=_CTRL,
         help="YAML file of these options (long names, - or _); the command line wins"),
)

BY_DEST: dict[str, Option] = {o.dest: o for o in OPTIONS}
#: Horovod's autotuning options.
AUTOTUNE_DESTS: tuple[str, ...] = tuple(o.dest for o in OPTIONS if o.group == _AUTOTUNE)


class _Parser(argparse.ArgumentParser):
    """An argument parser that raises instead of exiting, so `main` decides the exit code."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        raise ConfigError(f"{message}; see `ringtrain run --help`")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``ringtrain run [OPTIONS] COMMAND...``.

    Every option defaults to "absent" (``argparse.SUPPRESS``), so the parsed namespace holds
    exactly what the user typed and the config file can fill the rest.
    """
    parser = _Parser(
        prog="ringtrain run",
        usage="ringtrain run [OPTIONS] [--] COMMAND [ARGS...]",
        description="Launch COMMAND as the ranks of one distributed job (horovodrun's flags).",
        argument_default=argparse.SUPPRESS,
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for opt in OPTIONS:
        if opt.group not in groups:
            groups[opt.group] = parser.add_argument_group(opt.group)
        group = groups[opt.group]
        if opt.type is None:
            group.add_argument(*opt.flags, dest=opt.dest, action="store_true", help=opt.help)
        else:
            group.add_argument(*opt.flags, dest=opt.dest, type=opt.type, help=opt.help,
                               metavar=opt.metavar)
    parser.add_argument("-v", "--version", action="version", version=_version())
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program every rank runs")
    return parser


def parse_argv(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """Split ``ringtrain run`` arguments into the options given and the command.

    Returns:
        The options the user typed (by ``dest``) and the command (possibly empty).

    Raises:
        ConfigError: an unknown flag or a value of the wrong type.
    """
    namespace = vars(build_parser().parse_args(list(argv)))
    command = namespace.pop("command", [])
    # argparse keeps the `--` that separates flags from the command in a REMAINDER.
    if command[:1] == ["--"]:
        command = command[1:]
    return namespace, command


def config_file_key(key: str) -> str | None:
    """The option ``dest`` a config file key names (``num-proc``, ``num_proc``, ``np``, ...)."""
    return _KEYS.get(key.strip().lstrip("-").replace("-", "_"))


def coerce(dest: str, value: Any, where: str) -> Any:
    """Convert a config file value to what the command line would have produced.

    Raises:
        ConfigError: the value has the wrong type for the option.
    """
    opt = BY_DEST[dest]
    if opt.type is None:
        if isinstance(value, bool) or value in (0, 1):
            return bool(value)
        raise ConfigError(f"{where}: {opt.name} takes true or false, not {value!r}")
    if isinstance(value, list) and dest in ("hosts", "network_interfaces"):
        value = ",".join(str(v) for v in value)
    if isinstance(value, (bool, list, dict)) or value is None:
        raise ConfigError(f"{where}: {opt.name} takes a single value, not {value!r}")
    try:
        return opt.type(str(value))
    except ValueError:
        raise ConfigError(f"{where}: {opt.name} value {value!r} is not valid") from None


def _version() -> str:
    from ringtrain import __version__

    return f"ringtrain {__version__}"


_KEYS: dict[str, str] = {
    flag.lstrip("-").replace("-", "_"): opt.dest for opt in OPTIONS for flag in opt.flags
} | {opt.dest: opt.dest for opt in OPTIONS}

"""Launch planning: which rank runs where, with which environment (pure; nothing is started).

The environment of a rank is, lowest first: the environment of the process that starts it (the
launcher's, or for a rank on another node that node's follower's, which the ssh launch gives
the portable part of the launcher's), the derived socket interfaces, ``PYTHONUNBUFFERED``, the
``horovod`` shim (added by the node that starts the rank, where the shim is), and last the worker
contract of ``env.worker_environ``, which nothing overrides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ringtrain.contract import env as envlib
from ringtrain.contract.slots import SlotInfo
from ringtrain.runner.config import LaunchConfig
from ringtrain.runner.hosts import assign
from ringtrain.runner.rendezvous import NetworkPlan


@dataclass(frozen=True)
class RankSpec:
    """One rank to start: its slot, its environment, and the node that starts it.

    For a rank this process starts (``node`` is ``None``) ``env`` is the process's whole
    environment; for a rank another node's follower starts, it is what is set on top of that
    follower's own environment.
    """

    slot: SlotInfo
    env: Mapping[str, str]
    worker: int | None = None  # an elastic launch's worker id
    #: The node whose follower starts it, when that is not this process (a remote host of an
    #: ssh launch, another node of a per-node launch); ``None``: this process starts it.
    node: int | None = None

    @property
    def rank(self) -> int:
        """The rank's number."""
        return self.slot.rank

    @property
    def number(self) -> int:
        """What output prefixes, ``rank.N`` files and outcomes call this process: its rank, or in
        an elastic launch its worker id (its rank in the first world; later workers count on)."""
        return self.rank if self.worker is None else self.worker

    @property
    def hostname(self) -> str:
        """The host as given in ``-H``."""
        return self.slot.hostname


@dataclass(frozen=True)
class LaunchPlan:
    """Everything needed to start the job."""

    command: tuple[str, ...]
    ranks: tuple[RankSpec, ...]
    master_addr: str
    master_port: int
    run_id: str


def used_hostnames(config: LaunchConfig) -> list[str]:
    """The hosts that get at least one rank, in order."""
    return list(dict.fromkeys(s.hostname for s in assign(config.hosts, config.num_proc)))


def compat_shim_dir() -> str:
    """Where ``--horovod-compat`` finds the ``horovod`` shim package: ringtrain/compat/shim."""
    import ringtrain

    return str(Path(ringtrain.__file__).parent / "compat" / "shim")


def horovod_compat_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables ``--horovod-compat`` adds: the shim directory first on PYTHONPATH, so
    that ``import horovod.torch`` in an unmodified script imports ringtrain, and
    ``KERAS_BACKEND=torch`` when it is unset: a script that imports keras before
    ``horovod.keras`` would otherwise get Keras' default backend, TensorFlow, which ringtrain
    does not run (``ringtrain.keras`` is Keras 3 on torch)."""
    extra = envlib.prepend_pythonpath(compat_shim_dir(), environ)
    if "KERAS_BACKEND" not in environ:
        extra["KERAS_BACKEND"] = "torch"
    return extra


#: Which node starts the rank in a slot: ``None`` for this process, else the node's rank (its
#: follower starts it).
NodeOf = Callable[[SlotInfo], int | None]


class RankPlanner:
    """Builds the :class:`RankSpec` of any slot of one launch (the environment is the same
    recipe for every rank; only the contract's values differ)."""

    def __init__(self, config: LaunchConfig, net: NetworkPlan, master_port: int, run_id: str,
                 environ: Mapping[str, str], node_of: NodeOf):
        """``net``: the addresses ``rendezvous.plan_network`` chose; ``master_port``: the
        launcher's store's; ``run_id``: the store prefix of this launch's workers; ``node_of``:
        the node that starts each slot's rank (it may start that node's follower, as the ssh
        launch does for a host it meets first)."""
        self._node_of = node_of
        self._config = config
        self._net = net
        self._master_port = master_port
        self._run_id = run_id
        self._environ = environ
        sockets = envlib.socket_ifname_environ(net.socket_ifnames) if net.socket_ifnames else {}
        if not net.ifnames_explicit:
            sockets = {k: v for k, v in sockets.items() if k not in environ}
        self._extras = sockets | envlib.unbuffered_environ(environ)
        # The shim's path and the PYTHONPATH it goes before are this machine's; a follower
        # adds its own (it runs with --horovod-compat too).
        self._own_extras = self._extras | (horovod_compat_environ(environ)
                                           if config.horovod_compat else {})

    def rank(self, slot: SlotInfo, elastic: envlib.ElasticWorker | None = None) -> RankSpec:
        """The spec of the rank in ``slot`` (of an elastic worker, when ``elastic`` is given)."""
        node = self._node_of(slot)
        contract = envlib.worker_environ(
            rank=slot.rank, size=slot.size, local_rank=slot.local_rank,
            local_size=slot.local_size, cross_rank=slot.cross_rank, cross_size=slot.cross_size,
            hostname=slot.hostname, master_addr=self._net.master_addr,
            master_port=self._master_port, run_id=self._run_id,
            start_timeout_s=self._config.start_timeout_s, knobs=self._config.knobs,
            elastic=elastic)
        env = (dict(self._environ) | self._own_extras if node is None
               else self._extras)  # the follower's own environment goes below
        return RankSpec(slot, env | contract, None if elastic is None else elastic.worker_id,
                        node)

    def launch_plan(self, ranks: Sequence[RankSpec]) -> LaunchPlan:
        """The plan that starts ``ranks``."""
        return LaunchPlan(self._config.command, tuple(ranks), self._net.master_addr,
                          self._master_port, self._run_id)


def build_plan(config: LaunchConfig, net: NetworkPlan, master_port: int, run_id: str,
               environ: Mapping[str, str], node_of: NodeOf) -> LaunchPlan:
    """Plan every rank of a fixed launch, in rank order (arguments as :class:`RankPlanner`'s)."""
    planner = RankPlanner(config, net, master_port, run_id, environ, node_of)
    return planner.launch_plan([planner.rank(slot)
                                for slot in assign(config.hosts, config.num_proc)])

"""Launch planning: which rank runs where, with which environment (pure; nothing is started).

The environment of a rank is, lowest first: the launcher's environment (only its portable part
for ranks on other hosts), the derived socket interfaces, ``PYTHONUNBUFFERED``, the ``horovod``
shim, and last the worker contract of ``env.worker_environ``, which nothing overrides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ringtrain.runner import env as envlib
from ringtrain.runner.config import LaunchConfig
from ringtrain.runner.hosts import SlotInfo, assign
from ringtrain.runner.rendezvous import NetworkPlan


@dataclass(frozen=True)
class RankSpec:
    """One rank to start: its slot, whether it runs on this machine, and its environment.

    For a local rank ``env`` is the process's whole environment; for a remote rank it is what
    is set on top of the remote login environment.
    """

    slot: SlotInfo
    local: bool
    env: Mapping[str, str]

    @property
    def rank(self) -> int:
        """The rank's number."""
        return self.slot.rank

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
    that ``import horovod.torch`` in an unmodified script imports ringtrain."""
    return envlib.prepend_pythonpath(compat_shim_dir(), environ)


def build_plan(config: LaunchConfig, net: NetworkPlan, master_port: int, run_id: str,
               environ: Mapping[str, str]) -> LaunchPlan:
    """Plan every rank of the launch.

    Args:
        config: the launch configuration.
        net: the addresses chosen by ``rendezvous.plan_network``.
        master_port: the port of the launcher's store.
        run_id: this launch's id (the store prefix of its workers).
        environ: the launcher's environment.

    Returns:
        The plan, ranks in rank order.
    """
    sockets = envlib.socket_ifname_environ(net.socket_ifnames) if net.socket_ifnames else {}
    if not net.ifnames_explicit:
        sockets = {k: v for k, v in sockets.items() if k not in environ}
    extras = sockets | envlib.unbuffered_environ(environ)
    if config.horovod_compat:
        extras |= horovod_compat_environ(environ)
    ranks = []
    for slot in assign(config.hosts, config.num_proc):
        local = slot.hostname in net.local_hosts
        base = dict(environ) if local else envlib.remote_environ(environ)
        contract = envlib.worker_environ(
            rank=slot.rank, size=slot.size, local_rank=slot.local_rank,
            local_size=slot.local_size, cross_rank=slot.cross_rank, cross_size=slot.cross_size,
            hostname=slot.hostname, master_addr=net.master_addr, master_port=master_port,
            run_id=run_id, start_timeout_s=config.start_timeout_s, knobs=config.knobs)
        ranks.append(RankSpec(slot, local, base | extras | contract))
    return LaunchPlan(config.command, tuple(ranks), net.master_addr, master_port, run_id)

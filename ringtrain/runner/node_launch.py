"""A per-node launch (``ringtrain run --nnodes N --node-rank K --rdzv-endpoint HOST:PORT``).

Every node runs the same command line but its ``--node-rank``, as with torchrun. Node 0 serves
the store at the endpoint and drives the job as a launch from one host does (the same agent,
plan, result file and root cause), its hosts being the nodes that registered; the others'
followers (:mod:`ringtrain.runner.node_follower`) start the ranks planned on them
(docs/architecture.md, "A launch"). A fixed launch starts once ``--nnodes`` nodes registered
(within ``--rdzv-timeout``); an elastic one's hosts are the registered nodes whose beat still
moves.
"""

from __future__ import annotations

import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import BinaryIO

from ringtrain.contract.slots import SlotInfo
from ringtrain.errors import ConfigError
from ringtrain.runner import network
from ringtrain.runner import node_rendezvous as nodes
from ringtrain.runner.agent import Agent
from ringtrain.runner.config import LaunchConfig, NodeSpec
from ringtrain.runner.elastic_agent import ElasticAgent
from ringtrain.runner.hosts import HostInfo, assign
from ringtrain.runner.node_follower import FollowerAgent, wait_for_store
from ringtrain.runner.node_output import FramedOutput
from ringtrain.runner.output import OutputSink, RankOutput
from ringtrain.runner.plan import RankPlanner, horovod_compat_environ
from ringtrain.runner.preflight import check_command
from ringtrain.runner.rendezvous import NetworkPlan, StoreServer
from ringtrain.runner.result import RankOutcome, RankState, RunResult
from ringtrain.runner.spawn import SpawnOptions
from ringtrain.runner.task import DEFAULT_GRACE_S

log = logging.getLogger(__name__)

#: How often an elastic driver reads the registrations and beats as its host discovery.
_DISCOVERY_INTERVAL_S = 0.5


StopSignals = Callable[[Agent], AbstractContextManager[None]]


def launch_node(config: LaunchConfig, environ: dict[str, str], cwd: str,
                stop_signals: StopSignals) -> RunResult:
    """Run this node's part of a per-node launch (``config.node`` set) and wait for the job to
    end; ``stop_signals`` routes SIGINT/SIGTERM to an agent while it runs.

    Returns:
        On node 0, the job's result; on the others, this node's ranks' outcomes (with the
        job's failure as its error when the job failed elsewhere).

    Raises:
        ConfigError: the command does not exist, the endpoint cannot be served (node 0) or did
            not answer within ``--rdzv-timeout`` (the others).
    """
    node = config.node
    assert node is not None
    if not node.stdio:
        # A follower of the ssh launch leaves it to each rank's wrapper, whose start failure the
        # launcher reports for that rank, as for a rank it starts itself.
        check_command(config.command, cwd, environ)
    options = SpawnOptions(python=sys.executable, cwd=cwd, token=secrets.token_hex(8),
                           grace_s=DEFAULT_GRACE_S)
    me = nodes.NodeInfo(node.node_rank, node.name, node.nproc_per_node)
    sink: RankOutput
    if node.stdio:
        sink = FramedOutput(_take_stdout())
    else:
        sink = OutputSink({"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer},
                          config.output_filename, config.prefix_output_with_timestamp)
    try:
        if node.is_driver:
            return _drive(config, node, me, environ, options, sink, stop_signals)
        return _follow(config, node, me, environ, options, sink, stop_signals)
    finally:
        sink.close()


def _take_stdout() -> BinaryIO:
    """The process's stdout for the frames alone: anything else printed to it (a library's
    print) goes to stderr from now on."""
    sys.stdout.flush()
    frames = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return frames


def _network(config: LaunchConfig, node: NodeSpec) -> NetworkPlan:
    """The store's address is the endpoint's; interfaces as for a launch from one host."""
    addresses = network.interface_addresses()
    if config.network_interfaces:
        missing = [n for n in config.network_interfaces if n not in addresses]
        if missing:
            raise ConfigError(f"--network-interfaces: {', '.join(missing)} has no IPv4 address "
                              "on this machine")
        return NetworkPlan(node.endpoint_host, config.network_interfaces, True,
                           frozenset({node.name}))
    ifnames = ((network.loopback_interface(addresses),)
               if network.is_loopback(node.endpoint_host) else ())
    return NetworkPlan(node.endpoint_host, ifnames, False, frozenset({node.name}))


def _drive(config: LaunchConfig, node: NodeSpec, me: nodes.NodeInfo, environ: dict[str, str],
           options: SpawnOptions, sink: RankOutput, stop_signals: StopSignals) -> RunResult:
    net = _network(config, node)
    try:
        server = StoreServer(node.endpoint_host, config.start_timeout_s, port=node.endpoint_port)
    except OSError as e:
        raise ConfigError(f"--rdzv-endpoint {node.endpoint_host}:{node.endpoint_port}: cannot "
                          f"serve the rendezvous store there ({e.strerror})") from None
    run_id = secrets.token_hex(6)
    with server:
        registry = nodes.NodeRegistry(server.store, me, config.node_timeout_s)

        def node_of(slot: SlotInfo) -> int | None:
            k = registry.rank_of(slot.hostname)
            return None if k == me.rank else k

        planner = RankPlanner(config, net, node.endpoint_port, run_id, environ, node_of)
        if config.elastic is None:
            found = _wait_for_nodes(registry, node)
            if isinstance(found, RunResult):
                return found
            hosts = [HostInfo(n.name, n.slots) for _, n in sorted(found.items())]
            specs = [planner.rank(slot) for slot in assign(hosts, sum(h.slots for h in hosts))]
            try:
                for spec in specs:
                    if spec.node is None:
                        sink.open_rank(spec.number)
            except OSError as e:
                raise ConfigError(f"--output-filename {config.output_filename}: cannot create "
                                  f"the rank files ({e})") from None
            agent: Agent = Agent(planner.launch_plan(specs), options, sink,
                                 config.start_timeout_s, relay=registry)
        else:
            agent = ElasticAgent(planner, config.elastic, config.num_proc,
                                 _RegisteredHosts(registry), server.store, run_id, options, sink,
                                 config.start_timeout_s, relay=registry)
        log.info("run %s: node 0 of %d, store at %s:%d", run_id, node.nnodes,
                 node.endpoint_host, node.endpoint_port)
        with stop_signals(agent):
            result = agent.run()
        registry.finish(result.exit_code, nodes.BYE_WAIT_S)
        return result


def _wait_for_nodes(registry: nodes.NodeRegistry,
                    node: NodeSpec) -> dict[int, nodes.NodeInfo] | RunResult:
    """Every node of a fixed launch, once all registered; a failed result if they did not."""
    deadline = time.monotonic() + node.rdzv_timeout_s
    while True:
        registry.refresh()
        found = registry.nodes()
        names = [n.name for n in found.values()]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            return _not_started(node, f"two nodes are both named {duplicate!r} (--node-name)")
        wrong = [k for k in found if k >= node.nnodes]
        if wrong:
            return _not_started(node, f"node {wrong[0]} registered, but --nnodes {node.nnodes} "
                                      f"allows node ranks 0-{node.nnodes - 1}")
        if len(found) >= node.nnodes:
            return found
        if time.monotonic() > deadline:
            missing = ", ".join(str(k) for k in range(node.nnodes) if k not in found)
            return _not_started(node, f"nodes {missing} did not join within "
                                      f"{node.rdzv_timeout_s:g} s (--rdzv-timeout)")
        time.sleep(0.05)


def _not_started(node: NodeSpec, why: str) -> RunResult:
    cause = RankOutcome(0, node.name, RankState.START_FAILED, reason=why)
    return RunResult(outcomes=(cause,), root_causes=(cause,), interrupted_by=None, stopped=0)


class _RegisteredHosts:
    """An elastic driver's host discovery: the nodes that registered and still beat."""

    def __init__(self, registry: nodes.NodeRegistry):
        self._registry = registry
        self._latest: dict[str, int] = {}
        self._next = 0.0

    def latest(self) -> dict[str, int]:
        now = time.monotonic()
        if now >= self._next:
            self._latest = self._registry.live_hosts()
            self._next = now + _DISCOVERY_INTERVAL_S
        return dict(self._latest)


def _follow(config: LaunchConfig, node: NodeSpec, me: nodes.NodeInfo, environ: dict[str, str],
            options: SpawnOptions, sink: RankOutput, stop_signals: StopSignals) -> RunResult:
    import torch.distributed as dist  # a follower needs torch only for the store's client

    def connect(within_s: float):  # torch's TCPStore, which the Store protocol describes
        # The client retries its connection for as long as its timeout: give it what is left
        # of --rdzv-timeout, then the store's operations get the launch's own timeout.
        store = dist.TCPStore(node.endpoint_host, node.endpoint_port, is_master=False,
                              timeout=timedelta(seconds=within_s))
        store.set_timeout(timedelta(seconds=max(config.start_timeout_s, 5.0)))
        return store

    where = f"{node.endpoint_host}:{node.endpoint_port}"
    try:
        store = wait_for_store(connect, node.rdzv_timeout_s, where)
    except TimeoutError as e:
        raise ConfigError(str(e)) from None
    nodes.register(store, me)
    if config.horovod_compat:  # the shim of this machine's ringtrain, before its PYTHONPATH
        environ = environ | horovod_compat_environ(environ)
    agent = FollowerAgent(me, store, config.command, options, sink, config.start_timeout_s,
                          environ)
    if node.stdio:
        _thread_until_eof(sys.stdin.fileno(), lambda: agent.lose_driver(
            f"node {me.rank}: the launcher's connection closed; stopping this node's ranks"))
    with stop_signals(agent):
        return agent.run()


def _thread_until_eof(fd: int, then: Callable[[], None]) -> None:
    """Read ``fd`` (the ssh launcher never writes to it) in a thread until end-of-file, then
    call ``then``. Unbuffered: a buffered stream's lock, held by a blocked reader, would stop
    the interpreter's exit."""
    def watch() -> None:
        try:
            while os.read(fd, 1 << 12):
                pass
        except OSError:  # closed: as good as end-of-file
            pass
        then()

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()

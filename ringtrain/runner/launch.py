"""`launch(config)`: the whole of `ringtrain run` after the options are parsed.

Network plan -> command checks -> rendezvous store -> launch plan -> agent; an elastic launch
discovers its hosts first, and its agent plans each world itself. The launcher drives the job as
a per-node launch's node 0 does: it starts the ranks of this machine's hosts, and one follower
per other host over ssh (:mod:`ringtrain.runner.ssh_nodes`) starts that host's. The CLI and any
other caller (tests, the job service through the CLI) go through here.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from ringtrain.errors import ConfigError
from ringtrain.runner import node_rendezvous as nodes
from ringtrain.runner.agent import Agent
from ringtrain.runner.config import LaunchConfig
from ringtrain.runner.discovery import DiscoveryError, HostPoller, fixed_hosts, run_script
from ringtrain.runner.elastic_agent import ElasticAgent
from ringtrain.runner.output import OutputSink
from ringtrain.runner.plan import RankPlanner, build_plan, used_hostnames
from ringtrain.runner.preflight import check_command
from ringtrain.runner.rendezvous import NetworkPlan, StoreServer, plan_network
from ringtrain.runner.result import RunResult
from ringtrain.runner.spawn import SpawnOptions
from ringtrain.runner.ssh_nodes import FollowerLaunch, SshNodes
from ringtrain.runner.task import DEFAULT_GRACE_S
from ringtrain.shm_names import sweep

log = logging.getLogger(__name__)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def launch(config: LaunchConfig, environ: Mapping[str, str] | None = None,
           cwd: str | None = None) -> RunResult:
    """Run the job described by ``config`` and wait for its result.

    Called from the main thread, SIGINT, SIGTERM and SIGHUP stop the job while it runs (a
    second one kills the ranks at once); the previous handlers are restored afterwards. The
    workers inherit ``environ`` (default: ``os.environ``) and start in ``cwd`` (default: the
    current directory; remote hosts need the same path).

    Raises:
        ConfigError: the command or its script does not exist, a network interface is
            unknown, or the output files or the rendezvous store cannot be created; nothing
            was started.
    """
    environ = dict(os.environ if environ is None else environ)
    cwd = os.getcwd() if cwd is None else cwd
    if config.node is not None:
        from ringtrain.runner.node_launch import launch_node

        return launch_node(config, environ, cwd, _stop_signals_to)
    poller = None
    if config.elastic is None:
        hostnames = used_hostnames(config)
    else:
        poller = _host_poller(config, cwd)
        hostnames = list(poller.latest()) or [h.hostname for h in config.hosts]
    try:
        return _launch(config, environ, cwd, hostnames, poller)
    finally:
        if poller is not None:
            poller.stop()


def _launch(config: LaunchConfig, environ: dict[str, str], cwd: str, hostnames: list[str],
            poller: HostPoller | None) -> RunResult:
    net = plan_network(hostnames, config.network_interfaces)
    if net.local_hosts:
        check_command(config.command, cwd, environ)
    run_id = secrets.token_hex(6)
    options = SpawnOptions(python=sys.executable, cwd=cwd, token=secrets.token_hex(8),
                           grace_s=DEFAULT_GRACE_S)
    sink = OutputSink({"stdout": sys.stdout.buffer, "stderr": sys.stderr.buffer},
                      config.output_filename, config.prefix_output_with_timestamp)
    try:
        try:
            for rank in range(config.num_proc):
                sink.open_rank(rank)
        except OSError as e:
            raise ConfigError(f"--output-filename {config.output_filename}: cannot create the "
                              f"rank files ({e})") from None
        try:
            store = StoreServer(net.master_addr, config.start_timeout_s)
        except OSError as e:
            raise ConfigError(f"cannot serve the rendezvous store on {net.master_addr}: "
                              f"{e.strerror}; choose another address with "
                              "--network-interfaces") from None
        with store:
            log.info("run %s: %d ranks on %s; store at %s:%d", run_id, config.num_proc,
                     ",".join(hostnames), store.address, store.port)
            return _drive(config, environ, cwd, hostnames, poller, net, store, run_id, options,
                          sink)
    finally:
        sink.close()


def _drive(config: LaunchConfig, environ: dict[str, str], cwd: str, hostnames: list[str],
           poller: HostPoller | None, net: NetworkPlan, store: StoreServer, run_id: str,
           options: SpawnOptions, sink: OutputSink) -> RunResult:
    """Drive the job as node 0: the ranks of this machine's hosts are started here, those of
    other hosts by one follower per host, started over ssh."""
    registry = nodes.NodeRegistry(store.store, nodes.NodeInfo(0, socket.gethostname(), 0),
                                  config.node_timeout_s)
    launch = FollowerLaunch(config, sys.executable, cwd, environ, f"{store.address}:{store.port}")
    remote_hosts = [h for h in hostnames if h not in net.local_hosts]
    with SshNodes(registry, launch, sink, net.local_hosts, 1 + len(remote_hosts)) as remote:
        if poller is None:
            agent = Agent(build_plan(config, net, store.port, run_id, environ, remote.node_of),
                          options, sink, config.start_timeout_s, relay=remote)
        else:
            assert config.elastic is not None  # a poller is made for elastic launches only
            agent = ElasticAgent(RankPlanner(config, net, store.port, run_id, environ,
                                             remote.node_of),
                                 config.elastic, config.num_proc, poller, store.store, run_id,
                                 options, sink, config.start_timeout_s, relay=remote)
        try:
            with _stop_signals_to(agent):
                result = agent.run()
            remote.finish(result.exit_code)
            return result
        finally:
            # The ranks on this host have exited: whatever shared memory they set up and could
            # not unlink (killed while setting it up) goes now. Remote hosts' ranks unlink theirs.
            if net.local_hosts:
                for path in sweep(run_id):
                    log.info("run %s: removed the shared-memory segment %s", run_id, path)


def _host_poller(config: LaunchConfig, cwd: str) -> HostPoller:
    assert config.elastic is not None  # called for elastic launches only
    script = config.elastic.discovery_script
    poller = HostPoller(fixed_hosts(config.hosts) if script is None
                        else functools.partial(run_script, script, cwd,
                                               config.elastic.slots_per_host))
    try:
        poller.start()
    except DiscoveryError as e:
        raise ConfigError(str(e)) from None
    return poller


@contextmanager
def _stop_signals_to(agent: Agent) -> Iterator[None]:
    """Route SIGINT/SIGTERM/SIGHUP to ``agent`` while the block runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda signum, _frame: agent.interrupt(signum))
                for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""The node rendezvous of a per-node launch on a real in-process store (torch's HashStore): how
node 0 sees the other nodes register, beat, leave, and what they report of their ranks; and the
per-node options, checked once when the configuration is built."""

from __future__ import annotations

import pytest

from ringtrain.contract.slots import SlotInfo
from ringtrain.errors import ConfigError
from ringtrain.runner import node_rendezvous as nodes
from ringtrain.runner.config import load_config
from ringtrain.runner.result import RankOutcome, RankState


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store():
    import torch.distributed as dist

    return dist.HashStore()


def test_nodes_register_beat_and_leave(store) -> None:
    clock = Clock()
    registry = nodes.NodeRegistry(store, nodes.NodeInfo(0, "node0", 2), timeout_s=5.0,
                                  clock=clock)
    nodes.register(store, nodes.NodeInfo(1, "node1", 2))
    nodes.register(store, nodes.NodeInfo(2, "node2", 1))
    assert registry.live_hosts() == {"node0": 2, "node1": 2, "node2": 1}
    clock.now += 4.0
    nodes.beat(store, 1)  # node 2 stays silent
    registry.refresh()
    clock.now += 4.0
    assert registry.live_hosts() == {"node0": 2, "node1": 2}  # node 2's beat stood 8 s
    assert not registry.alive(2) and registry.alive(0)
    nodes.say_bye(store, 1)
    assert registry.live_hosts() == {"node0": 2}  # at once, without waiting for the timeout
    with pytest.raises(KeyError):
        registry.rank_of("node1")


def test_a_name_that_comes_back_maps_to_its_new_node(store) -> None:
    registry = nodes.NodeRegistry(store, nodes.NodeInfo(0, "a", 1), timeout_s=5.0)
    nodes.register(store, nodes.NodeInfo(1, "b", 1))
    registry.refresh()
    assert registry.rank_of("b") == 1
    nodes.say_bye(store, 1)
    nodes.register(store, nodes.NodeInfo(5, "b", 1))
    registry.refresh()
    assert registry.rank_of("b") == 5 and registry.rank_of("a") == 0


def test_start_requests_and_outcomes_round_trip(store) -> None:
    registry = nodes.NodeRegistry(store, nodes.NodeInfo(0, "node0", 1), timeout_s=5.0)
    slot = SlotInfo("node1", 1, 0, 2, 1, 1, 2)
    registry.request_start(1, nodes.StartRequest(1, slot, {"RANK": "1"}))
    registry.request_start(1, nodes.StartRequest(3, slot, {"RANK": "1"}, worker=3))
    first = nodes.start_requests(store, 1, 0)
    assert [(r.number, r.slot, dict(r.env), r.worker) for r in first] == [
        (1, slot, {"RANK": "1"}, None), (3, slot, {"RANK": "1"}, 3)]
    assert nodes.start_requests(store, 1, 2) == []
    assert nodes.start_requests(store, 2, 0) == []  # another node's
    assert not registry.started(1) and registry.outcome(1) is None
    nodes.report_started(store, 1)
    nodes.report_outcome(store, RankOutcome(1, "node1", RankState.FAILED, 7, None, "boom"))
    assert registry.started(1)
    assert registry.outcome(1) == nodes.RelayedOutcome(RankState.FAILED, 7, None, "boom")
    assert nodes.stop_request(store, 3) is None
    registry.request_stop(3, kill=False)
    assert nodes.stop_request(store, 3) == "term"
    registry.request_stop(3, kill=True)
    assert nodes.stop_request(store, 3) == "kill"


def test_the_driver_ends_the_job_once(store) -> None:
    registry = nodes.NodeRegistry(store, nodes.NodeInfo(0, "node0", 1), timeout_s=5.0)
    assert nodes.done(store) is None
    registry.finish(3, wait_s=0.0)
    assert nodes.done(store) == 3


@pytest.mark.parametrize("argv, message", [
    (["--node-rank", "1"], "only for per-node launches; add --nnodes N"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:1", "-np", "2"],
     "-np/--num-proc: a per-node launch"),
    (["--nnodes", "2", "--node-rank", "0"], "--nnodes needs --rdzv-endpoint too"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "nohost"], "is not HOST:PORT"),
    (["--nnodes", "0", "--node-rank", "0", "--rdzv-endpoint", "h:1"], "--nnodes: must be at"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:70000"], "is not a TCP port"),
])
def test_bad_per_node_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config([*argv, "true"], {})


def test_a_per_node_launch_plans_its_node() -> None:
    config = load_config(["--nnodes", "3", "--node-rank", "2", "--nproc-per-node", "4",
                          "--rdzv-endpoint", "10.0.0.1:29400", "--min-np", "4", "true"], {})
    assert config.node is not None and config.num_proc == 12 and config.hosts == ()
    assert (config.node.name, config.node.endpoint_host, config.node.endpoint_port,
            config.node.is_driver) == ("node2", "10.0.0.1", 29400, False)
    assert config.elastic is not None and config.elastic.min_np == 4


def test_node_timeout_and_node_stdio_options() -> None:
    base = ["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:1"]
    config = load_config([*base, "--node-timeout", "2.5", "--node-stdio", "true"], {})
    assert config.node_timeout_s == 2.5 and config.node is not None and config.node.stdio
    assert load_config(["-np", "1", "true"], {}).node_timeout_s == 10.0
    with pytest.raises(ConfigError, match="--node-timeout: must be positive"):
        load_config(["-np", "1", "--node-timeout", "0", "true"], {})
    with pytest.raises(ConfigError, match="--node-stdio: node 0 drives the job"):
        load_config(["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
                     "--node-stdio", "true"], {})
    with pytest.raises(ConfigError, match="--node-stdio: only for per-node launches"):
        load_config(["-np", "1", "--node-stdio", "true"], {})


def test_a_silent_node_fails_its_ranks_and_one_not_yet_joined_is_not_judged(store) -> None:
    clock = Clock()
    registry = nodes.NodeRegistry(store, nodes.NodeInfo(0, "node0", 1), timeout_s=5.0,
                                  clock=clock)
    nodes.register(store, nodes.NodeInfo(1, "node1", 1))
    registry.refresh()
    slot = SlotInfo("node1", 1, 0, 1, 2, 1, 2)
    registry.request_start(1, nodes.StartRequest(1, slot, {}))
    registry.request_start(2, nodes.StartRequest(2, slot, {}))  # node 2 never registers
    nodes.report_started(store, 1)
    clock.now += 6.0  # node 1 never beat
    registry.refresh()
    lost = registry.outcome(1)
    assert lost is not None and lost.state is RankState.FAILED
    assert lost.reason is not None and lost.reason.startswith("node 1 (node1) stopped answering")
    assert registry.outcome(2) is None

"""Another machine for the network tests: a network namespace joined to this one by a veth pair.

A process run in the namespace (:meth:`VethNamespace.run`) reaches this host only at
``host_ip``, through the pair, and arrives from ``peer_ip``: a real non-loopback peer, as a
client on another machine is, with no second machine. Making one needs root and ``ip netns``
(iproute2); :func:`namespace_problem` says why it cannot be made here, for a skip.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass


def namespace_problem() -> str | None:
    """Why a namespace cannot be made here, or ``None``."""
    if os.geteuid() != 0:
        return "needs root for `ip netns`"
    if not shutil.which("ip"):
        return "needs `ip` (iproute2)"
    name = f"rt-probe-{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True,
                           timeout=30)
    if probe.returncode != 0:
        return f"`ip netns` is not permitted here: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
    return None


@dataclass(frozen=True)
class VethNamespace:
    """A namespace whose only way out is a veth pair to this host."""

    name: str
    host_ip: str
    peer_ip: str

    def run(self, argv: list[str], env: Mapping[str, str] | None = None,
            timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the namespace (its output captured as text)."""
        return subprocess.run(["ip", "netns", "exec", self.name, *argv],
                              env=dict(os.environ if env is None else env),
                              capture_output=True, text=True, timeout=timeout_s)


@contextmanager
def veth_namespace() -> Iterator[VethNamespace]:
    """A new namespace and veth pair (a /30 of 10.251.0.0/16 picked at random), removed after."""
    tag = f"{os.getpid() % 10000}{random.randrange(100)}"
    name, host_if, peer_if = f"rt-tls-{tag}", f"rth{tag}", f"rtp{tag}"
    block = random.randrange(1, 16000) * 4
    host_ip = f"10.251.{block // 256}.{block % 256 + 1}"
    peer_ip = f"10.251.{block // 256}.{block % 256 + 2}"
    steps = [["ip", "netns", "add", name],
             ["ip", "link", "add", host_if, "type", "veth", "peer", "name", peer_if],
             ["ip", "link", "set", peer_if, "netns", name],
             ["ip", "addr", "add", f"{host_ip}/30", "dev", host_if],
             ["ip", "link", "set", host_if, "up"],
             ["ip", "netns", "exec", name, "ip", "addr", "add", f"{peer_ip}/30", "dev", peer_if],
             ["ip", "netns", "exec", name, "ip", "link", "set", peer_if, "up"],
             ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True, timeout=30)
        yield VethNamespace(name, host_ip, peer_ip)
    finally:
        # Deleting the namespace deletes its end of the pair, and with it the host's end.
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "delete", host_if], capture_output=True, timeout=30)

"""Host discovery for elastic launches: which hosts, with how many slots, are available now.

``--host-discovery-script`` names an executable that prints one ``HOST:SLOTS`` per line (a host
alone has ``--slots-per-host`` slots); the driver runs it every second, as horovodrun does.
Without a script, the hosts of ``-H``/``--hostfile`` are the fixed answer.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from collections.abc import Callable, Sequence

from ringtrain.runner import hosts as hostlib

log = logging.getLogger(__name__)

#: How often the script runs (Horovod's DISCOVER_HOSTS_FREQUENCY_SECS).
POLL_INTERVAL_S = 1.0
#: How long one run of the script may take.
SCRIPT_TIMEOUT_S = 30.0


class DiscoveryError(RuntimeError):
    """The discovery script failed or printed something that is not a host list."""


def parse_discovered(text: str, source: str, default_slots: int = 1) -> dict[str, int]:
    """Slots by host, in the order printed, of the script's output: one ``HOST[:SLOTS]`` per
    line (``default_slots`` when no slot count is given); blank lines are ignored, and an empty
    output means no host is available.

    Raises:
        DiscoveryError: a line is not a host entry, or a host repeats.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    entries = [line if ":" in line else f"{line}:{default_slots}" for line in lines]
    try:
        return {h.hostname: h.slots for h in hostlib.parse_hosts(",".join(entries), source)}
    except ValueError as e:
        raise DiscoveryError(str(e)) from None


def run_script(script: str, cwd: str | None = None, default_slots: int = 1,
               timeout_s: float = SCRIPT_TIMEOUT_S) -> dict[str, int]:
    """Run the discovery script once, in ``cwd`` (the job's directory), and parse its output.

    Raises:
        DiscoveryError: it could not run, timed out, exited non-zero or printed garbage.
    """
    where = f"--host-discovery-script {script}"
    try:
        done = subprocess.run([os.path.abspath(script)], capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"{where} did not finish within {timeout_s:g} s") from None
    except OSError as e:
        raise DiscoveryError(f"{where} cannot be run ({e.strerror}); it must be an executable "
                             "file (chmod +x, with a #! line)") from None
    if done.returncode != 0:
        raise DiscoveryError(f"{where} exited with code {done.returncode}: "
                             f"{done.stderr.strip()[-500:]}")
    return parse_discovered(done.stdout, f"{where} output", default_slots)


class HostPoller:
    """Runs a discovery function in a background thread and keeps its latest answer.

    The first answer is awaited by :meth:`start`, so that a script that cannot work fails the
    launch at once; later failures are logged and the previous answer kept (Horovod does the
    same), since a script may fail transiently while a cluster changes.
    """

    def __init__(self, discover: Callable[[], dict[str, int]],
                 interval_s: float = POLL_INTERVAL_S):
        self._discover = discover
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._latest: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Discover once (errors propagate), then keep discovering in the background.

        Raises:
            DiscoveryError: the first discovery failed.
        """
        self._latest = self._discover()
        self._thread = threading.Thread(target=self._run, name="host-discovery", daemon=True)
        self._thread.start()

    def latest(self) -> dict[str, int]:
        """The hosts and slots of the latest successful discovery, in the order found."""
        with self._lock:
            return dict(self._latest)

    def stop(self) -> None:
        """Stop polling (waits for a running script at most its timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SCRIPT_TIMEOUT_S)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                found = self._discover()
            except DiscoveryError as e:
                log.warning("host discovery failed, keeping the previous hosts: %s", e)
                continue
            with self._lock:
                self._latest = found


def fixed_hosts(hosts: Sequence[hostlib.HostInfo]) -> Callable[[], dict[str, int]]:
    """Discovery for a launch without a script: the hosts of ``-H``/``--hostfile``."""
    found = {h.hostname: h.slots for h in hosts}
    return lambda: dict(found)

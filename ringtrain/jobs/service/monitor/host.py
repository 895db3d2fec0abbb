"""How busy a machine is: CPU, memory and (through NVML, where present) each GPU.

Read from ``/proc/stat`` and ``/proc/meminfo`` (no psutil needed); CPU use is the share of
non-idle time between two samples. GPUs are read through ``pynvml`` when it is installed and a
driver answers; otherwise the sample has no GPUs. Sampling is lazy: a sample younger than
``max_age_s`` is returned as it is, so any number of dashboards cost one read per period.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

_PROC_STAT = "/proc/stat"
_PROC_MEMINFO = "/proc/meminfo"


def _cpu_times() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot."""
    with open(_PROC_STAT) as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user and nice
    return total - idle, total


def _memory() -> tuple[int, int]:
    """(used, total) bytes of memory; used leaves out what the kernel can reclaim."""
    info = {}
    with open(_PROC_MEMINFO) as f:
        for line in f:
            name, _, rest = line.partition(":")
            info[name] = int(rest.split()[0]) * 1024
    total = info.get("MemTotal", 0)
    return total - info.get("MemAvailable", info.get("MemFree", 0)), total


class _Nvml:
    """GPU readings through NVML, or none when pynvml or the driver is missing."""

    def __init__(self) -> None:
        self._nvml: Any = None
        try:
            import pynvml  # optional: only machines with NVIDIA GPUs have it
            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 - no package, no driver, no device: no GPUs to show
            self._nvml = None

    def sample(self) -> list[dict[str, Any]]:
        if self._nvml is None:
            return []
        nv = self._nvml
        gpus = []
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                name = nv.nvmlDeviceGetName(h)
                gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes)
                             else str(name), "util_percent": float(util.gpu),
                             "memory_used": int(mem.used), "memory_total": int(mem.total)})
        except Exception:  # noqa: BLE001 - a GPU fell off the bus: show none, not an error
            return []
        return gpus


class HostSampler:
    """Samples this machine, at most once per ``max_age_s`` (a sample is served until then)."""

    def __init__(self, max_age_s: float = 2.0):
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._last: dict[str, Any] | None = None
        self._taken = 0.0
        self._cpu = _cpu_times()
        self._nvml: _Nvml | None = None

    def sample(self) -> dict[str, Any]:
        """``{"host", "time", "cpu_percent", "cpus", "memory_used", "memory_total", "gpus"}``."""
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._taken < self.max_age_s:
                return self._last
            if self._nvml is None:
                self._nvml = _Nvml()
            busy, total = _cpu_times()
            d_busy, d_total = busy - self._cpu[0], total - self._cpu[1]
            self._cpu = (busy, total)
            used, mem_total = _memory()
            self._last = {
                "host": socket.gethostname(), "time": time.time(),
                "cpu_percent": round(100.0 * d_busy / d_total, 1) if d_total > 0 else 0.0,
                "cpus": os.cpu_count() or 1, "memory_used": used, "memory_total": mem_total,
                "gpus": self._nvml.sample()}
            self._taken = now
            return self._last

"""Named networks for the scaling forecast, each with the assumptions it stands for.

Achieved bandwidth is below line rate: a ring allreduce over TCP or RoCE reaches about 80 % of
the link's rate in NCCL's and Gloo's own bus-bandwidth tests, InfiniBand about 90 %; latencies are
one message step, software included. Within a host the named profiles assume PCIe between
devices; ``ringtrain doctor`` replaces that with the link it measured when the script trains on
the CPU (processes on one host then talk through loopback or shared memory).
"""

from __future__ import annotations

from ringtrain.doctor.forecast_model import Link, Network

_GB = 1e9

#: Between devices of one host: PCIe 3.0 x16, about 12 GB/s achieved, 5 us per step.
PCIE = Link(5e-6, 12 * _GB)

_PROFILES: dict[str, tuple[Link, str]] = {
    "25gbit": (Link(10e-6, 0.8 * 25e9 / 8),
               ("25 Gbit/s Ethernet (TCP or RoCE) between hosts: 80 % of line rate achieved "
               "(2.5 GB/s per direction), 10 us per message step")),
    "100gbit": (Link(8e-6, 0.8 * 100e9 / 8),
                ("100 Gbit/s Ethernet between hosts: 80 % of line rate achieved (10 GB/s per "
                "direction), 8 us per message step")),
    "ib-hdr": (Link(2e-6, 0.9 * 200e9 / 8),
               ("InfiniBand HDR (200 Gbit/s) between hosts: 90 % of line rate achieved "
               "(22.5 GB/s per direction), 2 us per message step")),
}

#: The profiles ``--network`` accepts besides ``measured``.
NAMES: tuple[str, ...] = tuple(_PROFILES)


def named(name: str, intra: Link | None = None, intra_note: str | None = None) -> Network:
    """The profile ``name``, with ``intra`` (default :data:`PCIE`) within a host.

    Raises:
        ValueError: an unknown name.
    """
    if name not in _PROFILES:
        raise ValueError(f"unknown network {name!r}: use one of {', '.join(NAMES)} or measured")
    inter, text = _PROFILES[name]
    within = intra_note or "within a host: PCIe 3.0 x16, 12 GB/s achieved, 5 us per step"
    return Network(name, intra or PCIE, inter, f"{text}; {within}")


def measured(link: Link, how: str) -> Network:
    """The link measured here, used within and across hosts (as if every host were connected
    the way these processes are); ``how`` says what was measured."""
    return Network("measured", link, link,
                   f"measured here ({how}): {link.latency_s * 1e6:.0f} us per message step, "
                   f"{link.bandwidth_Bps / 1e9:.2f} GB/s, used within and across hosts")


def fit_link(samples: list[tuple[int, float]], workers: int = 2) -> Link:
    """The ring link behind measured allreduce times: the line ``t = a + b n`` through
    ``(nbytes, seconds)`` samples taken with ``workers`` ranks that minimises the relative
    error (small messages weigh as much as large ones), read as ``a = 2 (p-1) alpha`` and
    ``b = 2 (p-1) / (p B)``.

    Raises:
        ValueError: fewer than two distinct sizes, or times that fall as sizes grow.
    """
    if len({n for n, _ in samples}) < 2 or any(t <= 0 for _, t in samples):
        raise ValueError("fitting a link needs positive allreduce times at two sizes at least")
    # Weighted least squares, weights 1 / t^2: the normal equations of sum(((a + b n) / t - 1)^2).
    w = [1.0 / t ** 2 for _, t in samples]
    sw = sum(w)
    swn = sum(wi * n for wi, (n, _) in zip(w, samples))
    swnn = sum(wi * n * n for wi, (n, _) in zip(w, samples))
    swt = sum(wi * t for wi, (_, t) in zip(w, samples))
    swnt = sum(wi * n * t for wi, (n, t) in zip(w, samples))
    det = sw * swnn - swn ** 2
    slope = (sw * swnt - swn * swt) / det
    intercept = (swt - slope * swn) / sw
    if slope <= 0:
        raise ValueError("allreduce times did not grow with size: the measurement was too noisy")
    steps = 2 * (workers - 1)
    return Link(max(0.0, intercept) / steps, steps / workers / slope)

"""What work costs this server, measured as it serves: the figures admission forecasts from.

Two rates, as moving averages: seconds of decoding per byte of a decode's estimated cost (per
kind of decode: an image file, a tensor body; the cost is what
:class:`~ringtrain.serve.admission.Ticket` reserves, about proportional to the pixels or numbers
decoded), and seconds of model time per input of a batch. Both are wall-clock times on the
threads that do the work, so they take in the machine's load as it is.
"""

from __future__ import annotations

import threading

#: Seconds per byte of decoding cost until a decode of that kind was measured: about 2.5 times
#: what a 6300x6300 PNG took on a loaded 2-core machine (4 ns), so that a burst arriving at
#: start-up is not over-admitted.
PRIOR_DECODE_S_PER_BYTE = 10e-9
#: Weight of the newest measure in a moving average: a load that changes shows within a few.
WEIGHT = 0.3


class ServiceTimes:
    """Moving averages of decode and batch times; updated from the decode and batch threads,
    read on the event loop."""

    def __init__(self) -> None:
        self._decode: dict[str, float] = {}
        self._item_s = 0.0
        self._lock = threading.Lock()

    def decode_s(self, kind: str, cost: int) -> float:
        """Seconds a decode of ``kind`` (``"image"``, ``"tensor"``) of ``cost`` bytes takes."""
        return cost * self._decode.get(kind, PRIOR_DECODE_S_PER_BYTE)

    @property
    def item_s(self) -> float:
        """Seconds of model time per input (0 until a batch ran)."""
        return self._item_s

    def observe_decode(self, kind: str, cost: int, seconds: float) -> None:
        """A decode of ``kind`` of ``cost`` bytes took ``seconds``."""
        if cost > 0:
            with self._lock:
                rate = seconds / cost
                last = self._decode.get(kind)
                self._decode[kind] = rate if last is None else last + WEIGHT * (rate - last)

    def observe_batch(self, size: int, seconds: float) -> None:
        """A batch of ``size`` inputs ran in ``seconds``."""
        with self._lock:
            rate, last = seconds / size, self._item_s
            self._item_s = rate if not last else last + WEIGHT * (rate - last)

"""A clock that tests move by hand, for code that takes an injectable clock (the job
scheduler, the engine and its stall inspector)."""

from __future__ import annotations


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

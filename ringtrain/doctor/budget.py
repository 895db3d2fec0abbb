"""The quick check's bounds: how many images and steps `ringtrain doctor FOLDER` measures.

By default the doctor runs the *quick* check, which answers within about
:data:`QUICK_BUDGET_S` seconds: every trial reads a random sample of the folder (as many images
as one trial trains on), measures at most :data:`QUICK_STEPS` steps, and, once its warm-up
shows what a step costs, as many as its even share of the time left allows (never fewer than
:data:`MIN_STEPS`); a fix whose trial no longer fits is advised but not tried. ``--full`` runs
the *full* check: :data:`FULL_STEPS` steps every trial, every image read and packed, no bound.

On a 2-core CPU the full check of 1,000 small images took 94 s on an idle machine and over 5
minutes on a loaded one (five trials of 23 steps, ~0.5-0.9 s each: the training steps are the
time; decoding, packing and the report take seconds). The bound makes the quick check's length
follow the budget, not the load.

The functions are pure (numbers in, numbers out); :class:`Budget` only adds a clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

#: The quick check's bound on the whole run, in seconds (the 2-minute answer, with margin for
#: the last trial's minimum steps and a loaded machine).
QUICK_BUDGET_S = 90.0
#: Measured steps and warm-up steps of each trial in the quick and the full check.
QUICK_STEPS, QUICK_WARMUP = 10, 2
FULL_STEPS, FULL_WARMUP = 20, 3
#: Measured steps a trial keeps however little time is left: from fewer, the spread of its
#: steps says nothing (the 95 % interval of 2 steps uses a Student t of 12.7).
MIN_STEPS = 3
#: Seconds kept at the end of the budget for the report and its chart (matplotlib's import and
#: a PNG take a few seconds on a loaded 2-core machine).
REPORT_RESERVE_S = 5.0


@dataclass(frozen=True)
class Check:
    """The shape of one run of the doctor on a folder: the full check (``--full``) or the quick
    one, measured steps per trial at most, warm-up steps of each, and the bound on the whole run
    in seconds (``None``: none)."""

    full: bool
    steps: int
    warmup: int
    budget_s: float | None


def sample_size(images: int, *, warmup: int, steps: int, batch_size: int, ranks: int) -> int:
    """Images the quick check reads: what one trial trains on at most (each trial then reads
    each sampled image about once, as it would read that many images of the whole folder), and
    no more than the folder's ``images`` (which means every image)."""
    return min(images, (warmup + steps) * batch_size * ranks)


def trial_steps(left_s: float, step_s: float, trials_left: int, *, warmup: int, steps: int,
                min_steps: int = MIN_STEPS) -> int:
    """Measured steps for the trial now past its warm-up: its even share of the ``left_s``
    seconds left (``math.inf``: unbounded) once the warm-ups of the ``trials_left - 1`` later
    trials are set aside, at ``step_s`` seconds a step (its last warm-up step's); between
    ``min(min_steps, steps)`` (kept even when the budget is spent) and ``steps``."""
    floor = min(min_steps, steps)
    if math.isinf(left_s) or step_s <= 0:
        return steps
    later = max(trials_left, 1) - 1
    share = max(left_s - later * warmup * step_s, 0.0) / (later + 1)
    return max(floor, min(steps, math.floor(share / step_s)))


def fits(left_s: float, step_s: float, *, warmup: int, min_steps: int = MIN_STEPS) -> bool:
    """Whether a trial of ``step_s``-second steps fits in ``left_s`` seconds at its fewest
    steps (its warm-up and ``min_steps`` measured)."""
    return (warmup + min_steps) * step_s <= left_s


class Budget:
    """The time left of a run bounded to ``seconds`` (``None``: unbounded) from ``started``
    (on ``clock``'s scale; default: now), less :data:`REPORT_RESERVE_S` for the report."""

    def __init__(self, seconds: float | None, started: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        start = clock() if started is None else started
        self._deadline = math.inf if seconds is None else start + seconds - REPORT_RESERVE_S

    def left_s(self) -> float:
        """Seconds left for trials (negative once spent; ``math.inf`` when unbounded)."""
        return self._deadline - self.clock()

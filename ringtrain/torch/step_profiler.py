"""Where a training step's time goes, per step and per rank, cheap enough to leave on.

A step is cut into consecutive phases: waiting for the next batch (``data``), copying it to the
device (``h2d``), ``forward_backward``, the wait for gradient allreduces not finished by the end
of backward (``communication``: only the exposed part), and the ``optimizer`` update; time
between marked phases is ``other``, so the phases add up to the step. On CUDA each boundary is an
event recorded on the current stream (no synchronisation), so an interval is the device's time
busy with, or idle waiting for, that phase; events are read a few steps later once complete.

Each finished step becomes a JSON line in ``<metrics_dir>/steps.rank<N>.jsonl`` (by default
``$RINGTRAIN_JOB_DIR/metrics``) and, when the timeline is recording, a row of spans in it::

    prof = StepProfiler(device)
    for images, labels in prof.iterate(loader):
        with prof.phase("h2d"):
            images, labels = images.to(device), labels.to(device)
        with prof.phase("forward_backward"):
            loss_fn(model(images), labels).backward()
        prof.optimizer_step(optimizer)
    prof.close()
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal, TypeVar, cast

import torch

from ringtrain.torch import runtime

PHASES = ("data", "h2d", "forward_backward", "communication", "optimizer", "other")
#: The job's metrics folder: this variable, else ``$RINGTRAIN_JOB_DIR/metrics`` (set by the job
#: service for every process of a job).
METRICS_DIR_VAR = "RINGTRAIN_METRICS_DIR"
_JOB_DIR_VAR = "RINGTRAIN_JOB_DIR"
_TIMELINE_ROW = "step phases"

_T = TypeVar("_T")


def default_metrics_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The folder step metrics go to by default (``None``: outside a job, none)."""
    environ = os.environ if environ is None else environ
    if environ.get(METRICS_DIR_VAR):
        return Path(environ[METRICS_DIR_VAR])
    if environ.get(_JOB_DIR_VAR):
        return Path(environ[_JOB_DIR_VAR]) / "metrics"
    return None


class _Step:
    """One step's boundary marks: ``(phase, start mark, end mark)``; marks are host times or
    CUDA events."""

    def __init__(self, index: int, start: Any, host_start: float) -> None:
        self.index = index
        self.start = start
        self.host_start = host_start
        self.spans: list[tuple[str, Any, Any]] = []
        self.end: Any = None
        self.notes: dict[str, Any] = {}


class StepProfiler:
    """Times the phases of training steps on ``device``; see the module's description.

    Args:
        metrics_dir: Where to write ``steps.rank<N>.jsonl``; ``None``: :func:`default_metrics_dir`;
            ``False``: write no file.
        rank: The rank in file names and records (default ``hvd.rank()``, or 0 before init).
        keep: Finished steps kept in memory for :meth:`summary`.
        skip: Steps left out of :meth:`summary` at the start (warm-up).
        clock: Seconds for the CPU's marks (tests move one by hand).
    """

    def __init__(self, device: torch.device | str = "cpu", *,
                 metrics_dir: str | Path | None | Literal[False] = None, rank: int | None = None,
                 keep: int = 10_000, skip: int = 0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.device = torch.device(device)
        self._clock = clock
        self._cuda = self.device.type == "cuda"
        self.rank = rank if rank is not None else (runtime.rank() if runtime.is_initialized()
                                                   else 0)
        folder = default_metrics_dir() if metrics_dir is None else metrics_dir
        self._file: IO[str] | None = None
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            self.metrics_path: Path | None = Path(folder) / f"steps.rank{self.rank}.jsonl"
            self._file = open(self.metrics_path, "a", encoding="utf-8")  # noqa: SIM115 - close()
        else:
            self.metrics_path = None
        self.records: deque[dict[str, float]] = deque(maxlen=keep)
        self._skip = skip
        self._step: _Step | None = None
        self._pending: deque[_Step] = deque()  # finished, CUDA events not yet complete
        self._count = 0

    def mark(self) -> Any:
        """A boundary mark now: a host time, or a CUDA event recorded on the current stream."""
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return event
        return self._clock()

    def iterate(self, batches: Iterable[_T]) -> Iterator[_T]:
        """Yield ``batches``, each one starting a step whose ``data`` phase is the wait for it.

        The previous step ends where the next wait begins; the last one when the iterable is
        exhausted.
        """
        iterator = iter(batches)
        while True:
            self.begin_step()
            with self.phase("data"):
                try:
                    batch = next(iterator)
                except StopIteration:
                    batch = None
            if batch is None:
                self._step = None  # the wait that found no batch is no step
                return
            yield batch

    def begin_step(self) -> None:
        """End the current step (if any) and start the next one here."""
        mark = self.mark()
        if self._step is not None:
            self._step.end = mark
            self._finish(self._step)
        self._step = _Step(self._count, mark, time.monotonic())
        self._count += 1

    def end_step(self) -> None:
        """End the current step without starting another (e.g. before evaluation)."""
        if self._step is not None:
            self._step.end = self.mark()
            self._finish(self._step)
            self._step = None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` of the current step (started if none is).

        Raises:
            ValueError: ``name`` is not one of :data:`PHASES`, or is ``other`` (computed).
        """
        _check_phase(name)
        if self._step is None:
            self.begin_step()
        step = self._step
        assert step is not None  # begun above
        start = self.mark()
        try:
            yield
        finally:
            step.spans.append((name, start, self.mark()))

    def add_span(self, name: str, start: Any, end: Any) -> None:
        """Count the time between two :meth:`mark` results as phase ``name`` of the current
        step, as :meth:`phase` does, for boundaries no ``with`` block can enclose."""
        _check_phase(name)
        if self._step is None:
            self.begin_step()
        assert self._step is not None  # begun above
        self._step.spans.append((name, start, end))

    def note(self, **fields: Any) -> None:
        """Add JSON-serialisable fields (e.g. ``samples=64``) to the current step's record."""
        if self._step is not None:
            self._step.notes.update(fields)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Run ``optimizer.step()``, timing the wait for its allreduces as ``communication``
        and the update as ``optimizer`` (a ``DistributedOptimizer``'s step is split in its
        ``synchronize()`` and the step proper; another optimizer's is all ``optimizer``)."""
        if not hasattr(optimizer, "skip_synchronize"):
            with self.phase("optimizer"):
                optimizer.step()
            return
        with self.phase("communication"):
            cast(Any, optimizer).synchronize()  # a DistributedOptimizer: it has skip_synchronize
        with self.phase("optimizer"), optimizer.skip_synchronize():
            optimizer.step()

    def _finish(self, step: _Step) -> None:
        self._pending.append(step)
        while self._pending and self._ready(self._pending[0]):
            self._record(self._pending.popleft())

    def _ready(self, step: _Step) -> bool:
        return not self._cuda or step.end.query()

    def _elapsed_ms(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) if self._cuda else (b - a) * 1e3

    def _record(self, step: _Step) -> None:
        total = self._elapsed_ms(step.start, step.end)
        record: dict[str, Any] = {"step": step.index, "rank": self.rank, "time": time.time(),
                                  "step_ms": total}
        phases = dict.fromkeys(PHASES, 0.0)
        timeline = _timeline()
        for name, a, b in step.spans:
            ms = self._elapsed_ms(a, b)
            phases[name] += ms
            if timeline is not None:
                begin = step.host_start + self._elapsed_ms(step.start, a) / 1e3
                timeline.span(_TIMELINE_ROW, name, begin, begin + ms / 1e3, step=step.index)
        phases["other"] = max(0.0, total - sum(phases.values()))
        record.update({f"{name}_ms": round(ms, 4) for name, ms in phases.items()})
        record["step_ms"] = round(total, 4)
        record.update(step.notes)
        if step.index >= self._skip:
            self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")

    def summary(self) -> dict[str, float]:
        """Mean milliseconds of the step and of each phase over the kept steps (CUDA: the
        steps whose events have completed), with ``steps``, the number averaged."""
        return summarize(list(self.records))

    def close(self, *, finish_current: bool = True) -> None:
        """End the current step, wait for outstanding CUDA events, and close the metrics file.

        Args:
            finish_current: Record the step in progress; ``False`` drops it (a step that was
                only begun, e.g. after a training loop's last update).
        """
        if finish_current:
            self.end_step()
        self._step = None
        if self._cuda and self._pending:
            self._pending[-1].end.synchronize()
        while self._pending:
            self._record(self._pending.popleft())
        if self._file is not None:
            self._file.close()
            self._file = None


def summarize(records: list[Mapping[str, Any]]) -> dict[str, float]:
    """Mean milliseconds of the step and of each phase over step records (as written to
    ``steps.rank<N>.jsonl``), with ``steps``, the number averaged, and ``step_ms_sd``, the
    steps' sample standard deviation (0 for fewer than 2 steps)."""
    out: dict[str, float] = {"steps": float(len(records))}
    for key in ("step_ms", *(f"{p}_ms" for p in PHASES)):
        out[key] = sum(r[key] for r in records) / len(records) if records else 0.0
    n = len(records)
    out["step_ms_sd"] = (math.sqrt(sum((r["step_ms"] - out["step_ms"]) ** 2 for r in records)
                                   / (n - 1)) if n > 1 else 0.0)
    return out


def _check_phase(name: str) -> None:
    if name not in PHASES or name == "other":
        raise ValueError(f"phase must be one of {PHASES[:-1]}, got {name!r}")


def _timeline():
    """The engine's timeline while it records, else ``None``."""
    if not runtime.is_initialized():
        return None
    timeline = runtime.current().engine.timeline
    return timeline if timeline.active else None

"""From measurements to advice with numbers, and the trial that tests each piece of advice.

Pure: the numbers come in, the advice goes out, so the rules are tested without training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: A gap to synthetic data, a data wait or a slowdown of the compute above this fraction of the
#: step is worth advice.
THRESHOLD = 0.05
#: Exposed communication above this fraction of the step gets its own advice.
COMMUNICATION_THRESHOLD = 0.10


@dataclass(frozen=True)
class TrialSpec:
    """One configuration to measure: where batches come from and with how many workers.

    ``data`` is ``synthetic`` (a fixed batch on the device), ``torchvision`` (ImageFolder, PIL,
    DataLoader: the common baseline), ``folder`` (ringtrain's pipeline on the image files),
    ``packed`` (ringtrain's pipeline on a pre-resized packed file) or ``gpu`` (files decoded with
    nvjpeg). ``workers`` ``None``: chosen by :func:`ringtrain.data.tuning.choose_loader_settings`.
    """

    name: str
    data: str
    workers: int | None = None


@dataclass(frozen=True)
class Measurements:
    """What the doctor measured before advising.

    ``synthetic`` and ``real``: the mean phases, in ms, of the synthetic trial (the step without
    data) and of the baseline trial (``step``, ``data``, ``h2d``, ``forward_backward``, ...).
    ``decode_ms``: CPU milliseconds per image for ``torchvision``, ``folder`` and ``packed``.
    ``budget``: the loader workers a rank can run beside training
    (:func:`ringtrain.data.tuning.worker_budget`).
    """

    batch_size: int
    cores_per_rank: int
    budget: int
    baseline_workers: int
    cuda: bool
    synthetic: dict[str, float]
    real: dict[str, float]
    decode_ms: dict[str, float]
    pack_size: int
    #: Differences smaller than this fraction of the step are noise (two runs of one trial
    #: differ by this much), however they come out.
    noise: float = 0.0


@dataclass(frozen=True)
class Advice:
    """One finding: the message, and the trial that tries it (``None``: nothing to try)."""

    message: str
    trial: TrialSpec | None = None


def workers_needed(decode_ms: float, batch_size: int, step_ms: float) -> int:
    """Workers that decode one batch per step: ``ceil(decode_ms * batch_size / step_ms)``."""
    return max(1, math.ceil(decode_ms * batch_size / max(step_ms, 1e-6)))


def _workers(n: int) -> str:
    return f"{n} worker(s)" if n else "decoded in the training process (no spare core)"


def advise(m: Measurements) -> list[Advice]:
    """The advice for these measurements, most effective first.

    The gap to synthetic data shows in two places: waiting for batches (``data``), and, where
    loader workers share the cores with training, a slower ``forward_backward``.
    """
    advice: list[Advice] = []
    step = max(m.real.get("step", 0.0), 1e-6)
    compute = m.synthetic.get("step", 0.0)
    gap = 1 - compute / step
    data_frac = m.real.get("data", 0.0) / step
    slowdown = (m.real.get("forward_backward", 0.0) - m.synthetic.get("forward_backward", 0.0))
    budget = m.budget
    threshold = max(THRESHOLD, m.noise)
    if gap > threshold:
        if data_frac > THRESHOLD:
            need = workers_needed(m.decode_ms["torchvision"], m.batch_size, compute)
            tail = ("" if need <= budget else
                    f", but a rank has only {m.cores_per_rank} core(s): decode less, not more")
            advice.append(Advice(
                f"data wait is {data_frac:.0%} of the step ({m.real['data']:.1f} of {step:.1f} "
                f"ms): decoding takes {m.decode_ms['torchvision']:.2f} ms/image, so a "
                f"{compute:.1f} ms step of {m.batch_size} images needs {need} worker(s) instead "
                f"of {m.baseline_workers}{tail}"))
        if slowdown / step > threshold:
            advice.append(_slowdown_advice(m.real, m.synthetic, m.baseline_workers,
                                           m.cores_per_rank))
        if "packed" in m.decode_ms:
            n = workers_needed(m.decode_ms["packed"], m.batch_size, compute)
            advice.append(Advice(
                f"pre-resize the data set to {m.pack_size} px (`ringtrain data pack SRC OUT "
                f"--size {m.pack_size}`) and read it with PackedImages: "
                f"{m.decode_ms['packed']:.2f} ms/image, {_workers(min(budget, n))}",
                TrialSpec("packed", "packed", min(budget, n))))
        if m.cuda:
            advice.append(Advice(
                "decode on the GPU (nvjpeg, batched): workers only read the files "
                "(DeviceLoader(..., decoder=GpuDecoder(device)))", TrialSpec("gpu decode", "gpu")))
        n = workers_needed(m.decode_ms["folder"], m.batch_size, compute)
        advice.append(Advice(
            f"decode with ringtrain.data (libjpeg-turbo at reduced DCT scale, uint8 crops): "
            f"{m.decode_ms['folder']:.2f} ms/image instead of {m.decode_ms['torchvision']:.2f}; "
            f"{_workers(min(budget, n))}" + (f" of the {n} needed" if 0 < budget < n else ""),
            TrialSpec("ringtrain folder", "folder", min(budget, n))))
    if m.cuda and m.real.get("h2d", 0.0) / step > THRESHOLD:
        advice.append(Advice(
            f"the host-to-device copy is {m.real['h2d'] / step:.0%} of the step: pin memory "
            "and prefetch on a side stream (ringtrain.data.loader.DeviceLoader does both)"))
    advice += _communication_advice(m.real)
    if not advice:
        advice.append(_keeps_up(gap, data_frac, m.noise))
    return advice


def _ms(phases: dict[str, float], halves: dict[str, float], phase: str) -> str:
    """A phase's milliseconds, with the half-width of their interval when known."""
    value = f"{phases[phase]:.1f}"
    return f"{value} ± {halves[phase]:.1f}" if phase in halves else value


def _slowdown_advice(real: dict[str, float], synthetic: dict[str, float], workers: int,
                     cores: int, real_half: dict[str, float] | None = None,
                     synthetic_half: dict[str, float] | None = None) -> Advice:
    slowdown = real["forward_backward"] - synthetic["forward_backward"]
    return Advice(
        f"loader workers slow training down: forward+backward takes "
        f"{_ms(real, real_half or {}, 'forward_backward')} ms instead of "
        f"{_ms(synthetic, synthetic_half or {}, 'forward_backward')} ms "
        f"with synthetic data ({slowdown / real['step']:.0%} of the step): {workers} worker(s) "
        f"share {cores} core(s) with training; decode less per image")


def _communication_advice(real: dict[str, float]) -> list[Advice]:
    comm = real.get("communication", 0.0) / max(real.get("step", 0.0), 1e-6)
    if comm <= COMMUNICATION_THRESHOLD:
        return []
    return [Advice(f"exposed allreduce wait is {comm:.0%} of the step: compress gradients "
                   "(compression=hvd.Compression.fp16) or raise the batch size per rank")]


def _keeps_up(gap: float, data_frac: float, noise: float = 0.0) -> Advice:
    within = f" (within the ±{noise:.0%} noise)" if gap <= noise and noise > 0 else ""
    return Advice(f"the input pipeline keeps up: real data runs at {1 - gap:.0%} of synthetic "
                  f"data's speed{within}, data wait is {data_frac:.0%} of the step")


@dataclass(frozen=True)
class ScriptMeasurements:
    """What the doctor measured of a user's script (``ringtrain doctor -- SCRIPT``).

    ``real`` and ``synthetic``: mean phases in ms (``step``, ``data``, ...) of the script as it
    is and with its first batch fed again every step (``None``: the script's batches were not
    seen, so there is nothing to compare). ``workers``: the data loader's worker processes
    (``None``: no torch ``DataLoader`` was seen).
    """

    real: dict[str, float]
    synthetic: dict[str, float] | None
    workers: int | None
    cores_per_rank: int
    budget: int
    noise: float = 0.0  # as in Measurements
    #: The half-widths (ms) of the 95 % intervals of ``real``'s and ``synthetic``'s phases;
    #: empty: not known.
    real_half: dict[str, float] = field(default_factory=dict)
    synthetic_half: dict[str, float] = field(default_factory=dict)


def advise_script(m: ScriptMeasurements) -> list[Advice]:
    """Advice for a user's script: the data wait in workers, the compute slowed by them, the
    exposed communication. Nothing here is tried: the script is the user's to change.

    With ``W`` workers keeping a rank waiting, each takes about ``W`` real steps to make a
    batch (``data`` of one step with none), so a synthetic-speed step needs
    ``ceil(batch time / synthetic step)`` of them.
    """
    advice: list[Advice] = []
    step = max(m.real.get("step", 0.0), 1e-6)
    data_frac = m.real.get("data", 0.0) / step
    if m.synthetic is None:
        advice.append(Advice(
            "no batch was seen: the script's batches do not come from a torch DataLoader, so "
            "there is no data wait to measure and no synthetic run to compare; iterate them "
            "through ringtrain.torch.auto_profile.profiled_batches(...)"))
        return advice + _communication_advice(m.real)
    compute = m.synthetic.get("step", 0.0)
    gap = 1 - compute / step
    # Slower beyond the noise (the relative interval of the speed ratio 1 - gap) and by more
    # than THRESHOLD: only then is there a gap to advise on.
    slower = gap > THRESHOLD and (1 - gap) * (1 + m.noise) < 1
    # The data wait's low end, so a wait that is mostly noise is not called one.
    wait_low = (m.real.get("data", 0.0) - m.real_half.get("data", 0.0)) / step
    if slower and wait_low > THRESHOLD and m.workers is not None:
        batch_ms = m.workers * step if m.workers else m.real["data"]
        need = workers_needed(batch_ms, 1, compute)
        tail = ("" if need <= m.budget else
                f", more than the {m.budget} a rank of {m.cores_per_rank} core(s) can run "
                "beside training: decode less per image (ringtrain.data's pipeline, or "
                "`ringtrain data pack` to pre-resize; `ringtrain doctor FOLDER` measures both "
                "on your images)")
        advice.append(Advice(
            f"data wait is {data_frac:.0%} of the step ({_ms(m.real, m.real_half, 'data')} of "
            f"{_ms(m.real, m.real_half, 'step')} ms): "
            f"a batch takes about {batch_ms:.0f} ms to load, so a {compute:.1f} ms step needs "
            f"{need} loader worker(s) (DataLoader(num_workers=...)) instead of {m.workers}"
            f"{tail}"))
    slowdown = m.real.get("forward_backward", 0.0) - m.synthetic.get("forward_backward", 0.0)
    # A slower compute is called only outside its own interval, not just the speed's.
    slowdown_noise = math.hypot(m.real_half.get("forward_backward", 0.0),
                                m.synthetic_half.get("forward_backward", 0.0))
    if slower and slowdown / step > THRESHOLD and slowdown > slowdown_noise and m.workers:
        advice.append(_slowdown_advice(m.real, m.synthetic, m.workers, m.cores_per_rank,
                                       m.real_half, m.synthetic_half))
    advice += _communication_advice(m.real)
    if not advice and (1 - gap) * (1 - m.noise) < 1 - 3 * THRESHOLD:
        # As the verdict: a speed that may be 15 % lower, or more, is not "keeping up".
        advice.append(Advice(
            f"nothing stands out of the noise: real data runs at {1 - gap:.0%} of synthetic "
            f"data's speed ± {m.noise:.0%}; measure longer (--steps), more often (--repeats) "
            "or on a quieter machine"))
    if not advice:
        advice.append(_keeps_up(gap, data_frac, m.noise))
    return advice

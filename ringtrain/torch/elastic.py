"""Elastic training (``hvd.elastic``): the worker's half, with Horovod's semantics
(docs/horovod-compat.md, "Elastic training").

States commit, restore and sync models, optimizers, samplers and plain attributes;
:class:`ElasticSampler` shards an epoch and resumes it without repeating samples; :func:`run`
retries the training function in the next world, formed by the launcher's elastic agent
(:mod:`ringtrain.runner.elastic_agent`).
"""

from __future__ import annotations

import copy
import functools
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any, TypeVar

import torch

from ringtrain.contract.elastic_rendezvous import HostUpdate
from ringtrain.errors import HorovodInternalError, UnsupportedOperationError
from ringtrain.torch import functions, lifecycle, runtime

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run"]

_F = TypeVar("_F", bound=Callable[..., Any])


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``commit()`` on every rank when the launcher's discovery found hosts added or
    removed: :func:`run` then moves to the next world.

    Args:
        skip_sync: whether the state may skip the next ``sync()``: hosts were only removed, so
            every rank of the next world holds the state just committed.
    """

    def __init__(self, skip_sync: bool = False):
        super().__init__("the set of hosts changed")
        self.skip_sync = skip_sync


def _broadcast_from_root(obj: Any) -> Any:
    return functions.broadcast_object(obj, root_rank=0)


class State:
    """A training state that is committed, restored and synchronised as a whole.

    Subclasses define ``save``, ``restore`` and ``sync``, and may define ``reset``.

    Args:
        bcast_object: broadcasts a Python object from rank 0 and returns it on every rank.
        get_rank: unused; Horovod's state classes take it, so code passing it positionally
            still works.
    """

    def __init__(self, bcast_object: Callable[[Any], Any] = _broadcast_from_root,
                 get_rank: Callable[[], int] = runtime.rank):
        self._bcast_object = bcast_object
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Add functions to call, in order, after the world is re-formed (see ``on_reset``)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Adapt to a re-formed world: ``reset()``, then the registered callbacks."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the current values as the ones ``restore()`` goes back to, then check for new
        hosts. Call it on every rank at the same point (e.g. every N batches)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank if the launcher reported new or lost
        hosts (in an elastic launch a collective: rank 0's answer is broadcast; outside one,
        nothing is sent)."""
        if not runtime.is_initialized() or not runtime.is_elastic():
            return
        update = self._bcast_object(lifecycle.elastic_host_update() if runtime.rank() == 0
                                    else None)
        if update is not None:
            raise HostsUpdatedInterrupt(skip_sync=update is HostUpdate.REMOVED)

    def save(self) -> None:
        """Remember the current values."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the values of the last ``save()``."""
        raise NotImplementedError

    def sync(self) -> None:
        """Give every rank rank 0's values (a collective: every rank calls it)."""
        raise NotImplementedError

    def reset(self) -> None:
        """Adapt to a new world size; nothing to do for most states."""


class ObjectState(State):
    """A state made of named Python values, kept as attributes: ``state.epoch``.

    As in Horovod, values are kept by reference, not copied: meant for values that are replaced
    rather than changed in place (a copy would cut an LR scheduler off from its optimizer).
    """

    def __init__(self, bcast_object: Callable[[Any], Any] = _broadcast_from_root,
                 get_rank: Callable[[], int] = runtime.rank, **kwargs: Any):
        self._saved_state = dict(kwargs)
        self._set_attrs()
        super().__init__(bcast_object, get_rank)

    def save(self) -> None:
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        """Give every rank rank 0's last saved values (as Horovod: ``sync`` runs right after a
        start or a restore, when the attributes are the saved values)."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)


class _Handler:
    """Commits, restores and synchronises one value of a :class:`TorchState` by its kind."""

    def __init__(self, value: Any):
        self.value = value
        self.save()

    def set_value(self, value: Any) -> None:
        """A new object took this attribute's place: it becomes the committed value."""
        self.value = value
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        # A copy: optimizers and samplers keep what they load and change it in place, which
        # would otherwise change the saved state too and break a second restore.
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Adapt to a new world (before it synchronises)."""


class _ModelHandler(_Handler):
    def sync(self) -> None:
        functions.broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def sync(self) -> None:
        functions.broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        # Samples processed on any rank count as processed: after a failure the survivors must
        # not repeat what the lost rank already trained on before the commit.
        processed = set().union(*functions.allgather_object(self.value.processed_indices))
        state = self.value.state_dict()
        state["processed_indices"] = processed
        self.value.load_state_dict(_broadcast_from_root(state))

    def reset(self) -> None:
        self.value.reset()  # shard for the new world, even when sync() is skipped


def _handler_for(value: Any) -> _Handler | None:
    if isinstance(value, torch.nn.Module):
        return _ModelHandler(value)
    if isinstance(value, torch.optim.Optimizer):
        return _OptimizerHandler(value)
    if isinstance(value, ElasticSampler):
        return _SamplerHandler(value)
    return None


class TorchState(ObjectState):
    """The state of a PyTorch training loop: a model, an optimizer, samplers and plain values.

    Models and optimizers are committed as copies of their ``state_dict()``; an
    :class:`ElasticSampler` is synchronised to the union of every rank's processed samples. Any
    other keyword value is handled as by :class:`ObjectState`.
    """

    _handlers: dict[str, _Handler]  # set first in __init__ (__setattr__ consults it)

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any):
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, _Handler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = _handler_for(value)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        # Set before anything else: __setattr__ consults it.
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(**plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handler = self.__dict__.get("_handlers", {}).get(name)
        if handler is not None:
            handler.set_value(value)
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def reset(self) -> None:
        for handler in self._handlers.values():
            handler.reset()


def run(func: _F) -> _F:
    """Decorate a training function ``func(state, *args, **kwargs)`` for elastic training.

    As Horovod's: sync ``state``, call ``func``; on a peer failure restore the last commit, on
    changed hosts keep the state; join the next world, ``state.on_reset()`` and call again,
    after a sync unless hosts were only removed (the launcher's ``--reset-limit`` bounds how
    often). Outside an elastic launch a peer failure restores the last commit and re-raises.

    Raises:
        HorovodInternalError: outside an elastic launch, a peer failed; ``state`` holds its last
            committed values. Also ``UnsupportedOperationError`` (a request no world can run).
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except UnsupportedOperationError:
                raise  # bad input: every world would refuse it again
            except HorovodInternalError as e:
                state.restore()
                if not runtime.is_elastic():
                    raise HorovodInternalError(
                        f"{e}\nThis launch is not elastic, so no new world can form and "
                        "training stops instead of retrying. The state was restored to its last "
                        "commit: save it (e.g. in an except clause) and relaunch to resume from "
                        "there, or launch with `ringtrain run --min-np N` (or "
                        "--host-discovery-script) to go on without the failed rank.") from e
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            lifecycle.shutdown()
            lifecycle.init()
            state.on_reset()

    return wrapper  # type: ignore[return-value]


class ElasticSampler(torch.utils.data.Sampler):
    """Shards a dataset over the ranks and resumes an epoch without repeating samples.

    Each epoch the indices are shuffled with ``seed`` + epoch (ranks must agree on ``seed``),
    the ones recorded as processed are dropped, the rest padded by repetition to a multiple of
    the world size, and rank ``r`` takes every ``size()``-th index from position ``r``
    (``hvd.init()`` first).
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_indices: set[int] = set()
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch``: a new order, nothing processed yet."""
        self.epoch = epoch
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """Record that the ranks processed their ``batch_idx``-th batches of ``batch_size``.

        Ranks train in lockstep, so every rank records the batches of all of them (Horovod
        counts ``batch_size * size()`` samples): the record survives the loss of any rank.
        """
        start = batch_idx * batch_size
        for rank in range(self.num_replicas):
            self.record_indices(self._shard(rank)[start:start + batch_size])

    def record_indices(self, indices: Iterable[int]) -> None:
        """Record dataset indices as processed in this epoch."""
        self.processed_indices.update(indices)

    def get_indices(self, batch_idx: int, batch_size: int) -> list[int]:
        """The dataset indices of this rank's ``batch_idx``-th batch of ``batch_size``."""
        start = batch_idx * batch_size
        return self.indices[start:start + batch_size]

    def state_dict(self) -> dict[str, Any]:
        """The epoch and the indices processed in it (a copy)."""
        return {"epoch": self.epoch, "processed_indices": set(self.processed_indices)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict()``; the shard is recomputed for the current world."""
        self.epoch = state_dict["epoch"]
        self.processed_indices = set(state_dict["processed_indices"])
        self.reset()

    def reset(self) -> None:
        """Recompute this rank's shard from the epoch, the processed indices and the world."""
        self.num_replicas = runtime.size()
        self.rank = runtime.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = [i for i in order if i not in self.processed_indices]
        self.num_samples = -(-len(self.remaining_indices) // self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        # Cycling pads even when fewer indices remain than there are ranks (Horovod's slice
        # padding fails there).
        self._padded = list(itertools.islice(itertools.cycle(self.remaining_indices),
                                             self.total_size))
        self.indices = self._shard(self.rank)

    def _shard(self, rank: int) -> list[int]:
        return self._padded[rank:self.total_size:self.num_replicas]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples

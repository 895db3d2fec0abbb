"""The backends a job service can run, found by name: each a plug-in in a folder of its own.

A backend is a folder of this package (``local/``, ``ray/``) whose module ``backend`` holds a
:class:`BackendPlugin` named ``PLUGIN``: the backend's name, the flags it adds to ``ringtrain
server``, and how it builds its :class:`~ringtrain.jobs.service.executors.backend.ClusterBackend`
(which owns its executor and describes its machines). The service, the API, the page and the
command line go through these and never name a backend; adding one is its folder and its line in
:data:`PLUGIN_MODULES` (docs/architecture.md walks through it).

Plug-in modules are light: what a backend needs (``ray``, say) is imported when it is built.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ringtrain.jobs.service.executors.backend import ClusterBackend
    from ringtrain.jobs.service.share import Share
    from ringtrain.jobs.service.storage_plans import StorageSettings

#: Every backend's plug-in, by module; the service runs them all, in this order.
PLUGIN_MODULES = (
    "ringtrain.jobs.service.executors.local.backend",
    "ringtrain.jobs.service.executors.ray.backend",
)


@dataclass(frozen=True)
class BackendContext:
    """What the service gives a backend to build itself with.

    Attributes:
        share: the job folders.
        state_dir: a folder of the service's home for the backend's own files (its name).
        address_of: a cluster's address by the cluster's name ("" if it has none).
        storage: the secrets, node cache and plans of object storage (docs/storage.md).
    """

    share: Share
    state_dir: Path
    address_of: Callable[[str], str]
    storage: StorageSettings | None = None


class BackendPlugin(Protocol):
    """One backend in the registry."""

    @property
    def name(self) -> str:
        """The backend's name (``ClusterSpec.backend``)."""
        ...

    @property
    def summary(self) -> str:
        """What a cluster of this backend is, for ``ringtrain server --help``."""
        ...

    def add_options(self, group: argparse._ArgumentGroup) -> None:
        """Add the backend's flags to ``ringtrain server`` (names that say the backend)."""
        ...

    def create(self, context: BackendContext, options: Mapping[str, Any]) -> ClusterBackend:
        """The backend, built from the service's context and the parsed flags (by ``dest``)."""
        ...


def plugins(modules: tuple[str, ...] = PLUGIN_MODULES) -> list[BackendPlugin]:
    """The plug-ins of ``modules``, in order.

    Raises:
        ValueError: two of them have one name.
    """
    found: list[BackendPlugin] = [importlib.import_module(m).PLUGIN for m in modules]
    names = [p.name for p in found]
    if len(set(names)) != len(names):
        raise ValueError(f"two backend plug-ins share a name: {names}")
    return found


def add_server_options(parser: argparse.ArgumentParser,
                       modules: tuple[str, ...] = PLUGIN_MODULES) -> None:
    """Each backend's flags, in a group of its own of ``parser``'s help."""
    for plugin in plugins(modules):
        plugin.add_options(parser.add_argument_group(f"the {plugin.name} backend: "
                                                     f"{plugin.summary}"))


def create_backends(context: Callable[[str], BackendContext], options: Mapping[str, Any],
                    modules: tuple[str, ...] = PLUGIN_MODULES) -> list[ClusterBackend]:
    """Every backend of the registry, built.

    Args:
        context: the context of the backend of a name.
        options: the parsed flags of ``ringtrain server``, by ``dest`` (absent: defaults).
    """
    return [p.create(context(p.name), options) for p in plugins(modules)]

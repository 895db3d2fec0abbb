"""Durable records of clusters, nodes, jobs and scoped tokens: the Store protocol and its SQLite
implementation."""

from ringtrain.jobs.service.store.base import Store
from ringtrain.jobs.service.store.sqlite import SQLiteStore

__all__ = ["SQLiteStore", "Store"]

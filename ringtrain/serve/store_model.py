"""`ringtrain serve URL`: a model saved in object storage, staged into this host's cache first.

The model's folder (or file) is fetched once into the node cache (:mod:`ringtrain.storage`) and
held there while the server runs; a second server of the same model version starts from the
cache. Credentials come from the store library's standard sources, or from a named secret of
the job service's home (``--secret``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ringtrain.errors import RingtrainError
from ringtrain.storage import transfers
from ringtrain.storage.locations import redacted, url_problem
from ringtrain.storage.node_cache import NodeCache
from ringtrain.storage.secrets import SecretError, SecretStore
from ringtrain.storage.stage import stage_input

#: The cache's default bound: models, not data sets.
DEFAULT_CACHE_BYTES = 50 * 10**9


def default_cache() -> Path:
    """``$RINGTRAIN_CACHE``, else ``~/.cache/ringtrain``."""
    return Path(os.environ.get("RINGTRAIN_CACHE") or Path.home() / ".cache" / "ringtrain")


def fetch_store_model(url: str, secret: str | None, cache_root: Path,
                      secrets_folder: Path) -> Path:
    """The local path of the model at ``url``, staged into ``cache_root`` if not there yet.

    Raises:
        RingtrainError: the URL, the secret or the store's answer is wrong (no secret value in
            the message).
    """
    problem = url_problem(url)
    if problem:
        raise RingtrainError(problem)
    try:
        options = SecretStore(secrets_folder).get(secret) if secret else {}
    except SecretError as e:
        raise RingtrainError(str(e)) from None
    cache = NodeCache(cache_root, DEFAULT_CACHE_BYTES)
    try:
        return stage_input("model", url, options, cache, f"serve-{os.getpid()}", os.getpid(),
                           lambda line: print(redacted(line, options.values()), flush=True))
    except Exception as e:  # the store libraries raise their own types
        raise RingtrainError(redacted(f"cannot fetch the model from {url}: "
                                      f"{transfers.describe(e)}", options.values())) from None

"""Store URLs: which library each scheme needs, and the filesystem that reads one.

A URL is anything with ``://``; every other value is a local path. Opening a store never caches
a client between calls (fsspec would otherwise hand a later caller with other credentials the
first caller's client), and errors are passed through :func:`redacted` before anyone sees them.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from typing import Any

EXTRA = "storage"
INSTALL_HINT = f"pip install 'ringtrain[{EXTRA}]'"

#: scheme -> (fsspec protocol, the module it needs, what the store is called in messages)
SCHEMES: dict[str, tuple[str, str, str]] = {
    "s3": ("s3", "s3fs", "S3"),
    "az": ("az", "adlfs", "Azure Blob"),
    "abfs": ("abfs", "adlfs", "Azure Blob"),
    "gs": ("gs", "gcsfs", "Google Cloud Storage"),
    "gcs": ("gcs", "gcsfs", "Google Cloud Storage"),
    "https": ("https", "aiohttp", "HTTPS"),
    "http": ("http", "aiohttp", "HTTP"),
}
#: Connection and read timeouts in seconds, and few retries: a store that stopped answering
#: fails the transfer with its library's message in well under a minute.
_S3_TIMEOUTS = {"connect_timeout": 10, "read_timeout": 60,
                "retries": {"max_attempts": 3, "mode": "standard"}}
_AZURE_TIMEOUTS = {"connection_timeout": 10, "read_timeout": 60}
#: What a redacted secret reads as.
MASK = "***"


def is_url(value: str) -> bool:
    """True for a store URL, False for a local path."""
    return "://" in value


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower()


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be read here (unknown scheme, no bucket, library missing), or None."""
    scheme = scheme_of(url)
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        return f"{url!r}: unknown scheme {scheme}://; use one of {known} or a local path"
    if not url.split("://", 1)[1].strip("/"):
        return f"{url!r}: names no container or bucket"
    _, module, store = SCHEMES[scheme]
    if importlib.util.find_spec(module) is None or importlib.util.find_spec("fsspec") is None:
        return f"{url!r}: reading {store} needs the {EXTRA} extra ({module}): {INSTALL_HINT}"
    return None


def open_store(url: str, options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """The fsspec filesystem for ``url`` and the path within it.

    ``options`` are the filesystem's keyword arguments (credentials, ``endpoint_url``); without
    them the library reads its standard sources (environment variables, profiles, metadata).
    """
    problem = url_problem(url)
    if problem:
        raise ValueError(problem)
    import fsspec.core

    kwargs = dict(options or {})
    scheme = scheme_of(url)
    if scheme == "s3":
        if "endpoint_url" in kwargs:  # s3fs takes the endpoint only inside client_kwargs
            kwargs.setdefault("client_kwargs", {})["endpoint_url"] = kwargs.pop("endpoint_url")
        # botocore's defaults retry a store that is down for minutes
        kwargs["config_kwargs"] = {**_S3_TIMEOUTS, **kwargs.get("config_kwargs", {})}
    elif scheme in ("az", "abfs"):
        kwargs = {**_AZURE_TIMEOUTS, **kwargs}
    fs, path = fsspec.core.url_to_fs(url, skip_instance_cache=True, **kwargs)
    if scheme in ("az", "abfs"):
        _send_blobs_in_parts(fs)
    return fs, path


def _send_blobs_in_parts(fs: Any) -> None:
    """Make the Azure SDK send a blob above ``PART_BYTES`` in blocks of that size instead of
    reading up to 64 MB whole. adlfs passes no client options through, so this sets them on
    the client's configuration, which every blob client it makes shares."""
    from ringtrain.storage.transfers import PART_BYTES

    config = getattr(getattr(fs, "service_client", None), "_config", None)
    if config is not None:
        config.max_single_put_size = PART_BYTES
        config.max_block_size = PART_BYTES


def redacted(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret value (and every part of a connection string's) masked."""
    for value in _secret_parts(secrets):
        text = text.replace(value, MASK)
    return text


def _secret_parts(secrets: Iterable[str]) -> list[str]:
    parts: set[str] = set()
    for value in secrets:
        if len(value) < 4:
            continue  # too short to mask without masking ordinary words
        parts.add(value)
        for field in value.split(";"):  # Azure connection strings: Name=value;...
            _, _, v = field.partition("=")
            if len(v) >= 8:
                parts.add(v)
    return sorted(parts, key=len, reverse=True)

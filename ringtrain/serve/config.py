"""``ServeConfig``: how ``ringtrain serve`` serves, validated once where it is made."""

from __future__ import annotations

from dataclasses import dataclass, field

from ringtrain.errors import ConfigError
from ringtrain.web.connection_limits import ConnectionLimits


@dataclass(frozen=True)
class ServeConfig:
    """Settings of one model server.

    Attributes:
        host: Address to bind; loopback unless ``token`` is set.
        port: Port; 0 picks a free one.
        token: Bearer token every request must carry (required off loopback).
        model_name: The name in ``/v2/models/{name}``.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        max_batch_size: Most inputs run together; 1 turns batching off.
        max_wait_ms: How long the first input of a batch waits for others to join it.
        queue_size: Inputs waiting at most; beyond it requests are refused with 503.
        timeout_s: How long a request may take from its arrival: one forecast to take longer is
            refused at once with 503 and ``Retry-After``, as is, as a last resort, one still
            unanswered by then (its input is dropped if not begun).
        max_body_bytes: Larger request bodies get 413 unread.
        max_memory_bytes: What the requests admitted may hold decoded (images, tensors); a
            request that would exceed it gets 503 before it is decoded.
        drain_s: On stop, how long requests already accepted may take to finish.
        threads: Torch's intra-op threads for the model; ``None``: one less than the cores this
            process may use (at least one), so that the event loop keeps a core while a batch
            runs instead of fighting torch's threads for it.
        cert_file: A certificate (PEM) to serve HTTPS with; with ``key_file``, its key.
        key_file: The certificate's private key (PEM, no passphrase).
        connections: The request header timeout and the caps on connections, overall and per
            client address (:mod:`ringtrain.web.connection_limits`).
    """

    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    model_name: str = "model"
    device: str = "cpu"
    max_batch_size: int = 32
    max_wait_ms: float = 5.0
    queue_size: int = 256
    timeout_s: float = 10.0
    max_body_bytes: int = 16 << 20
    max_memory_bytes: int = 1 << 30
    drain_s: float = 10.0
    threads: int | None = None
    cert_file: str | None = None
    key_file: str | None = None
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)

    def __post_init__(self) -> None:
        bad = []
        if (self.cert_file is None) != (self.key_file is None):
            bad.append("--cert and --key go together: the certificate (PEM) and its key")
        if not 0 <= self.port <= 65535:
            bad.append(f"port {self.port} is not in 0..65535")
        if self.max_batch_size < 1:
            bad.append(f"max batch size {self.max_batch_size} must be at least 1")
        if self.max_wait_ms < 0:
            bad.append(f"max wait {self.max_wait_ms} ms must not be negative")
        if self.queue_size < 1:
            bad.append(f"queue size {self.queue_size} must be at least 1")
        if self.timeout_s <= 0 or self.drain_s < 0:
            bad.append("the request timeout must be positive and the drain time not negative")
        if self.threads is not None and self.threads < 1:
            bad.append(f"threads {self.threads} must be at least 1")
        if self.max_memory_bytes < 1 << 20:
            bad.append(f"max memory {self.max_memory_bytes} bytes is below 1 MiB")
        if self.max_body_bytes < 1024:
            bad.append(f"max body {self.max_body_bytes} bytes is below 1 KiB")
        if not self.model_name or "/" in self.model_name:
            bad.append(f"model name {self.model_name!r} must be non-empty, without '/'")
        if bad:
            raise ConfigError("; ".join(bad))

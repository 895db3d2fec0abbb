"""Running the model server: bind, serve with uvicorn until SIGTERM/SIGINT, drain, exit.

On a stop signal uvicorn stops accepting connections and lets the requests in flight finish (up
to ``drain_s``); the app's lifespan then lets the batcher run what is still queued.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

from ringtrain.errors import ConfigError
from ringtrain.serve.config import ServeConfig
from ringtrain.web.connection_limits import limited_server
from ringtrain.web.exposure import bind_socket, check_bind, client_url
from ringtrain.web.tls_files import tls_files

log = logging.getLogger(__name__)


def model_threads(asked: int | None) -> int:
    """Torch's intra-op threads: ``asked``, else one less than this process's cores (at least 1).

    The model's batch runs on one thread and the event loop on another; with as many torch
    threads as cores they fight over the cores, and torch's threads spin while they wait.
    """
    return asked if asked is not None else max(1, len(os.sched_getaffinity(0)) - 1)


def serve(model: Path, config: ServeConfig,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Load ``model`` (a saved model's folder or weights file, :mod:`ringtrain.models.saved`)
    and serve it until a stop signal; ``on_ready`` gets the server's URL once it listens.

    Raises:
        ConfigError: A non-loopback host without a token, a port in use, a certificate
            and key that cannot serve HTTPS, or connection limits that leave the server too few
            open files.
        SavedModelError: The model cannot be loaded.
        OSError: The address cannot be bound.
    """
    import torch

    from ringtrain.serve.app import create_app
    from ringtrain.serve.predictor import Predictor

    check_bind(config.host, config.token, "the model server",
               "anyone could then spend this host's processors on it")
    tls = tls_files(config.cert_file, config.key_file)  # checked before the model loads
    budget = config.connections.resolved()
    torch.set_num_threads(model_threads(config.threads))
    predictor = Predictor.load(model, config.device)
    app = create_app(predictor, config)
    try:
        sock = bind_socket(config.host, config.port)
    except OSError as e:
        if e.errno != errno.EADDRINUSE:
            raise
        raise ConfigError(f"port {config.port} of {config.host} is in use (another server "
                          "listens there): pick another with --port, or --port 0 for a free "
                          "one") from None
    url = client_url(config.host, sock.getsockname()[1], tls=tls is not None)
    server = limited_server(app, budget, log_level="warning",
                            timeout_graceful_shutdown=int(config.drain_s),
                            **(tls.uvicorn_options() if tls else {}))
    if on_ready is not None:
        startup = server.startup

        async def announce(sockets: list[socket.socket] | None = None) -> None:
            await startup(sockets)
            on_ready(url)

        server.startup = announce  # type: ignore[method-assign]
    server.run(sockets=[sock])

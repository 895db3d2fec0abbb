"""Fixtures of the model server tests: tiny real models saved as training saves them, and a real
server (uvicorn on a loopback port, in a thread) around an app."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from ringtrain.models.cifar_cnn import CifarCNN
from ringtrain.models.saved import ModelInfo, save_model
from ringtrain.serve.app import create_app
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.predictor import Predictor
from ringtrain.web.exposure import bind_socket

CLASSES = ["cat", "dog", "fish"]
# A grey 12x12 input: the smallest size the tutorial CNN takes with a 1x1 map after two blocks.
TINY = {"num_classes": 3, "in_channels": 1, "image_size": 12}


@pytest.fixture(scope="session")
def tiny_classifier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("classifier")
    save_model(out, CifarCNN(**TINY), ModelInfo(arch="cifar_cnn", task="classification",
                                                classes=CLASSES, kwargs=TINY,
                                                input_shape=[1, 12, 12]))
    return out


class SlowPredictor(Predictor):
    """The real model, plus a fixed delay per batch: saturation and timeouts made repeatable."""

    delay_s = 0.3

    def predict(self, items: list[torch.Tensor]) -> list[object]:
        time.sleep(self.delay_s)
        return super().predict(items)


@contextmanager
def running(predictor: Predictor, config: ServeConfig) -> Iterator[httpx.Client]:
    """Serve ``predictor`` on a free loopback port; yields a client for it; stops it (the
    drain included) on exit, within bounded time."""
    import uvicorn

    app = create_app(predictor, config)
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                           timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        with httpx.Client(base_url=url, timeout=30) as client:
            client.app = app  # type: ignore[attr-defined]
            client.server = server  # type: ignore[attr-defined]
            yield client
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "server did not stop"

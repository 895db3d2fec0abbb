"""The round-robin front of a deployment's replicas: requests alternate between two real model
servers, a replica that goes away is skipped at once and, after its failed health check, no
longer tried; with none left the front answers 503."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn

from ringtrain.jobs.service.front_proxy import Backends, create_front
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.predictor import Predictor
from ringtrain.web.exposure import bind_socket

from .conftest import running


@contextmanager
def _front(backends: Backends) -> Iterator[str]:
    sock = bind_socket("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_front(backends, health_every_s=0.2),
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "front did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)


def test_round_robin_skips_a_replica_that_went_away(tiny_classifier) -> None:
    with running(Predictor.load(tiny_classifier), ServeConfig()) as a, \
            running(Predictor.load(tiny_classifier), ServeConfig()) as b:
        backends = Backends([str(a.base_url), str(b.base_url)])
        with _front(backends) as front:
            image = {"inputs": [{"name": "input", "shape": [1, 1, 12, 12], "datatype": "FP32",
                                 "data": [0.5] * 144}]}
            for _ in range(4):
                r = httpx.post(f"{front}/v2/models/model/infer", json=image, timeout=30)
                assert r.status_code == 200 and r.json()["outputs"]
            served = [_requests(a), _requests(b)]
            assert served[0] >= 2 and served[1] >= 2, served  # both took their turn
            b.server.should_exit = True  # type: ignore[attr-defined]
            time.sleep(1.0)
            for _ in range(4):  # all to the replica left, none failed
                assert httpx.post(f"{front}/v2/models/model/infer", json=image,
                                  timeout=30).status_code == 200
            assert backends.pick(set()) == str(a.base_url).rstrip("/")
        backends.set_urls([])
        with _front(backends) as front:
            r = httpx.get(f"{front}/v2/health/ready")
            assert r.status_code == 503 and "no replica is healthy" in r.text


def _requests(client: httpx.Client) -> int:
    """Inference requests a replica answered, from its own Prometheus metrics."""
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("ringtrain_serve_requests_total{") and "infer" in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)

"""Admission before work (issues 22 and 35): huge images are refused with 503 before they are
decoded when the memory budget is in use, decoded at most one per core at a time; more large
images than can be decoded before their timeout are refused with 503 and ``Retry-After``, never
left to time out (504); KServe v2 requests naming an unknown input or output get 400."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from ringtrain.runner.threads import usable_cores
from ringtrain.serve.admission import Admission
from ringtrain.serve.batching import QueueFullError
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.predictor import Predictor
from ringtrain.serve.problems import HTTPProblem
from tests.clock import FakeClock

from .conftest import running

SIDE = 6300  # the image: a 115 KB PNG that decodes to 119 MB of RGB


class CountingPredictor(Predictor):
    """The real model and decoder, counting how many images are decoded at once."""

    lock = threading.Lock()
    now = most = decoded = 0

    def decode_image(self, data: bytes) -> torch.Tensor:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            return super().decode_image(data)
        finally:
            with self.lock:
                self.now -= 1
                self.decoded += 1


@pytest.fixture(scope="module")
def huge_png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (SIDE, SIDE)).save(out, format="PNG")
    return out.getvalue()


def test_twenty_huge_images_get_200_or_503_never_504(tiny_classifier: Path,
                                                      huge_png: bytes) -> None:
    predictor = CountingPredictor.load(tiny_classifier)
    cost = predictor.decode_cost(huge_png)
    assert cost >= SIDE * SIDE * 4  # RGB decoded, then converted to grey at full size
    # Room for two images decoded at once, whatever the cores.
    config = ServeConfig(port=0, queue_size=64, timeout_s=30,
                         max_memory_bytes=int(2.5 * cost))
    answers: list[httpx.Response] = []
    peak = [0]
    with running(predictor, config) as client:
        admission: Admission = client.app.state.admission  # type: ignore[attr-defined]
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.005):
                peak[0] = max(peak[0], admission.reserved_bytes)

        def post() -> None:
            answers.append(client.post("/v2/models/model/image", content=huge_png,
                                       headers={"content-type": "image/png"}))

        watcher = threading.Thread(target=watch)
        watcher.start()
        posters = [threading.Thread(target=post) for _ in range(20)]
        for t in posters:
            t.start()
        for t in posters:
            t.join(120)
        stop.set()
        watcher.join()
        assert admission.reserved_bytes == 0  # all given back
    statuses = sorted(r.status_code for r in answers)
    assert len(statuses) == 20 and set(statuses) <= {200, 503}, statuses
    assert 200 in statuses and 503 in statuses, statuses
    refused = [r for r in answers if r.status_code == 503]
    assert all(r.headers.get("retry-after") for r in refused)
    assert "memory budget" in refused[0].json()["error"]
    # Refused images were never decoded; the others one per core at most, within the budget.
    assert predictor.decoded == statuses.count(200)
    assert predictor.most <= min(2, usable_cores())
    assert peak[0] <= config.max_memory_bytes


def test_an_image_that_could_never_fit_gets_413_undecoded(tiny_classifier: Path,
                                                          huge_png: bytes) -> None:
    predictor = CountingPredictor.load(tiny_classifier)
    config = ServeConfig(port=0, max_memory_bytes=64 << 20)
    with running(predictor, config) as client:
        r = client.post("/v2/models/model/image", content=huge_png,
                        headers={"content-type": "image/png"})
    assert r.status_code == 413 and "--max-memory-mib" in r.json()["error"], r.text
    assert predictor.decoded == 0


def test_places_and_budget_are_given_back() -> None:
    admission = Admission(places=2, max_memory_bytes=100, decoders=1)
    try:
        with admission.place() as a, admission.place() as b:
            a.reserve(60)
            with pytest.raises(QueueFullError, match="holds 2 requests"), admission.place():
                pass
            with pytest.raises(QueueFullError, match="memory budget"):
                b.reserve(50)
            with pytest.raises(HTTPProblem, match="more than the server's memory budget"):
                b.reserve(101)
            a.shrink_to(10)
            b.reserve(50)
            assert admission.reserved_bytes == 60
        assert admission.reserved_bytes == 0
        with admission.place(), admission.place():
            pass
    finally:
        admission.close()


@pytest.fixture(scope="module")
def large_png() -> bytes:
    """A 4000x4000 RGB gradient as PNG: a small body that decodes to 48 MB."""
    import numpy as np
    from PIL import Image

    ramp = np.arange(4000, dtype=np.uint8)  # wraps at 256: a gradient repeated
    pixels = np.broadcast_to(ramp[None, :, None], (4000, 4000, 3))
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(out, format="PNG")
    return out.getvalue()


def test_images_that_cannot_be_decoded_in_time_get_503_with_retry_after_never_504(
        tiny_classifier: Path, large_png: bytes) -> None:
    predictor = Predictor.load(tiny_classifier)
    begun = time.perf_counter()
    predictor.decode_image(large_png)
    one = time.perf_counter() - begun
    # The default memory budget admits 16 of these at once, and 2 decoders take 8 rounds of at
    # least `one` each to decode them: without the time gate the later ones ran past a timeout
    # of 4 decodes and were answered 504, as in the issue (20 clients, 2 images each).
    config = ServeConfig(port=0, timeout_s=4 * one)
    answers: list[httpx.Response] = []
    with running(predictor, config) as client:
        def post_twice() -> None:
            for _ in range(2):
                answers.append(client.post("/v2/models/model/image", content=large_png,
                                           headers={"content-type": "image/png"}))

        posters = [threading.Thread(target=post_twice) for _ in range(20)]
        for t in posters:
            t.start()
        for t in posters:
            t.join(300)
        admission: Admission = client.app.state.admission  # type: ignore[attr-defined]
        assert admission.reserved_bytes == 0
    statuses = sorted(r.status_code for r in answers)
    assert len(statuses) == 40 and set(statuses) <= {200, 503}, statuses
    assert 200 in statuses, statuses
    refused = [r for r in answers if r.status_code == 503]
    assert refused and all(r.headers.get("retry-after", "").isdigit() for r in refused)
    assert any("in time" in r.json()["error"] for r in refused), refused[0].text


def test_a_request_is_refused_when_the_work_ahead_ends_past_its_deadline() -> None:
    clock = FakeClock()
    waiting = [0]
    admission = Admission(places=8, max_memory_bytes=1 << 30, decoders=1,
                          queued=lambda: waiting[0], clock=clock)
    try:
        admission.times.observe_batch(2, 1.0)  # 0.5 s per input
        admission.check_time(clock.now + 0.1, 1)  # nothing ahead: tried, whatever its forecast
        waiting[0] = 9  # 4.5 s of inputs ahead, 5 s with its own
        admission.check_time(clock.now + 10, 1)
        with pytest.raises(HTTPProblem, match="too busy to answer this request in time") as e:
            admission.check_time(clock.now + 6, 1)  # 5 s, with the margin: too late
        assert e.value.status == 503 and e.value.headers == {"Retry-After": "5"}
    finally:
        admission.close()


@pytest.mark.parametrize("body,says", [
    ({"inputs": [{"name": "pixels", "shape": [1, 1, 12, 12], "datatype": "FP32",
                  "data": [0.0] * 144}]}, "no input named 'pixels'"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 12, 12], "datatype": "FP32",
                  "data": [0.0] * 144}], "outputs": [{"name": "logits"}]},
     "no output named 'logits'"),
])
def test_unknown_input_or_output_names_get_400(tiny_classifier: Path, body: dict[str, object],
                                               says: str) -> None:
    with running(Predictor.load(tiny_classifier), ServeConfig(port=0)) as client:
        r = client.post("/v2/models/model/infer", json=body)
        assert r.status_code == 400 and says in r.json()["error"], r.text
        ok = {**body, "inputs": [{**body["inputs"][0], "name": "input"}],  # type: ignore[index]
              "outputs": [{"name": "probabilities"}]}
        r = client.post("/v2/models/model/infer", json=ok)
        assert r.status_code == 200 and [o["name"] for o in r.json()["outputs"]] == [
            "probabilities"]

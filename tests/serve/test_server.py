"""`ringtrain serve`'s app on a real server: the protocol, bad input, saturation, drain, tokens."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from ringtrain.errors import ConfigError
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.infer_route import INLINE_BYTES
from ringtrain.serve.predictor import Predictor
from ringtrain.serve.server import model_threads, serve
from tests.serve.conftest import CLASSES, SlowPredictor, running

pytestmark = pytest.mark.fast  # in-process: the tier of `scripts/test.sh --fast`


def _tensor(n: int, value: float = 0.5, shape: tuple[int, ...] = (1, 12, 12),
            datatype: str = "FP32") -> dict[str, object]:
    count = n * torch.Size(shape).numel()
    return {"inputs": [{"name": "input", "shape": [n, *shape], "datatype": datatype,
                        "data": [value] * count}]}


def _png(size: tuple[int, int] = (20, 16)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def client(tiny_classifier: Path):
    with running(Predictor.load(tiny_classifier), ServeConfig(max_body_bytes=64 * 1024)) as c:
        yield c


def test_health_and_metadata(client: httpx.Client) -> None:
    assert client.get("/v2/health/live").json() == {"live": True}
    assert client.get("/v2/health/ready").json() == {"ready": True}
    meta = client.get("/v2/models/model").json()
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 1, 12, 12]}]
    assert meta["outputs"][0]["shape"] == [-1, 3] and meta["classes"] == CLASSES
    schema = client.get("/openapi.json").json()
    infer = schema["paths"]["/v2/models/{name}/infer"]["post"]
    body = infer["requestBody"]["content"]
    assert body["application/json"]["schema"]["$ref"] == "#/components/schemas/InferRequest"
    assert "application/octet-stream" in body and {"200", "400", "503"} <= set(infer["responses"])
    for name in ("InferRequest", "InferResponse", "TensorInput", "ErrorBody"):
        assert name in schema["components"]["schemas"], name


def test_infer_answers_the_models_own_probabilities(client: httpx.Client,
                                                    tiny_classifier: Path) -> None:
    predictor = Predictor.load(tiny_classifier)
    x = torch.rand(2, 1, 12, 12)
    body = {"id": "r1", "inputs": [{"name": "input", "shape": [2, 1, 12, 12],
                                    "datatype": "FP32", "data": x.tolist()}]}  # nested is fine
    r = client.post("/v2/models/model/infer", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == "r1" and out["outputs"][0]["shape"] == [2, 3]
    got = torch.tensor(out["outputs"][0]["data"]).view(2, 3)
    expected = torch.softmax(predictor.model(x), dim=1)
    assert torch.allclose(got, expected, atol=1e-5)


def test_image_route_answers_classes(client: httpx.Client) -> None:
    r = client.post("/v2/models/model/image?top_k=2", content=_png(),
                    headers={"content-type": "image/png"})
    assert r.status_code == 200, r.text
    classes = r.json()["classes"]
    assert len(classes) == 2 and {c["label"] for c in classes} <= set(CLASSES)
    assert classes[0]["score"] >= classes[1]["score"]


def _binary(header: dict, *tensors: torch.Tensor) -> tuple[bytes, dict[str, str]]:
    text = json.dumps(header).encode()
    raw = b"".join(t.numpy().tobytes() for t in tensors)
    return text + raw, {"Inference-Header-Content-Length": str(len(text)),
                        "content-type": "application/octet-stream"}


def test_binary_tensors_in_and_out_match_the_json_answer(client: httpx.Client) -> None:
    x = torch.rand(3, 1, 12, 12)
    as_json = client.post("/v2/models/model/infer", json={"inputs": [
        {"name": "input", "shape": [3, 1, 12, 12], "datatype": "FP32",
         "data": x.flatten().tolist()}]})
    expected = torch.tensor(as_json.json()["outputs"][0]["data"])
    x16 = x.to(torch.float16)
    content, headers = _binary({"inputs": [{"name": "input", "shape": [3, 1, 12, 12],
                                            "datatype": "FP16",
                                            "parameters": {"binary_data_size": x16.numel() * 2}}],
                                "parameters": {"binary_data_output": True}}, x16)
    r = client.post("/v2/models/model/infer", content=content, headers=headers)
    assert r.status_code == 200, r.text
    n = int(r.headers["inference-header-content-length"])
    (out,) = json.loads(r.content[:n])["outputs"]
    assert out["shape"] == [3, 3] and "data" not in out
    assert out["parameters"]["binary_data_size"] == len(r.content) - n == 36
    got = torch.frombuffer(bytearray(r.content[n:]), dtype=torch.float32)
    assert torch.allclose(got, expected, atol=2e-3)  # FP16 inputs: close, not equal
    # Binary in, JSON out (nothing asked for binary output).
    content, headers = _binary({"inputs": [{"name": "input", "shape": [3, 1, 12, 12],
                                            "datatype": "FP32",
                                            "parameters": {"binary_data_size": 3 * 144 * 4}}]}, x)
    r = client.post("/v2/models/model/infer", content=content, headers=headers)
    assert torch.allclose(torch.tensor(r.json()["outputs"][0]["data"]), expected, atol=1e-5)


@pytest.mark.parametrize("header, length, words", [
    ({"inputs": [{"name": "input", "shape": [1, 1, 12, 12], "datatype": "FP32",
                  "parameters": {"binary_data_size": 100}}]}, None, "needs 576 bytes"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 12, 12], "datatype": "FP32",
                  "parameters": {"binary_data_size": 576}}]}, "9999", "Inference-Header"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 12, 12], "datatype": "FP32",
                  "parameters": {"binary_data_size": 500}}]}, None, "does not match the 576"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 12, 12], "datatype": "FP32",
                  "data": [0.0] * 144, "parameters": {"binary_data_size": 576}}]}, None,
     "not both"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 12, 12], "datatype": "FP32"}]}, None,
     "either data or a binary_data_size"),
])
def test_bad_binary_requests_are_400_naming_the_problem(client: httpx.Client, header: dict,
                                                        length: str | None, words: str) -> None:
    size = header["inputs"][0].get("parameters", {}).get("binary_data_size", 0)
    raw = torch.zeros(576 // 4 if size in (576, 500, 0) else size // 4)
    content, headers = _binary(header, raw)
    if length is not None:
        headers["Inference-Header-Content-Length"] = length
    r = client.post("/v2/models/model/infer", content=content, headers=headers)
    assert r.status_code == 400 and words in r.json()["error"], r.text


@pytest.mark.parametrize("body, status, words", [
    (_tensor(1, shape=(3, 12, 12)), 400, "each input must have shape [1, 12, 12], got [3, 12, 12]"),
    (_tensor(1, datatype="INT64"), 400, "datatype INT64"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 12, 12], "datatype": "FP32",
                  "data": [1.0, 2.0]}]}, 400, "needs 144 values, data has 2"),
    ({"inputs": [{"name": "input", "shape": [1, 1, 12, 12], "datatype": "FP32",
                  "data": ["a"] * 144}]}, 400, "data must be numbers"),
    ({"inputs": []}, 400, "inputs"),
    (_tensor(1, value=float("nan")), 400, "NaN"),
])
def test_bad_tensors_are_400_naming_the_problem(client: httpx.Client, body: dict, status: int,
                                                words: str) -> None:
    # NaN is not JSON: send it as Python's json writes it, as a careless client would.
    r = client.post("/v2/models/model/infer", content=json.dumps(body),
                    headers={"content-type": "application/json"})
    assert r.status_code == status and words in r.json()["error"], r.text


def test_other_bad_requests_and_the_server_stays_up(client: httpx.Client) -> None:
    r = client.post("/v2/models/other/infer", json=_tensor(1))
    assert r.status_code == 404 and "'model'" in r.json()["error"]
    r = client.post("/v2/models/model/infer", content=b"{not json",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = client.post("/v2/models/model/image", content=b"hello",
                    headers={"content-type": "image/png"})
    assert r.status_code == 400 and "not an image file" in r.json()["error"]
    r = client.post("/v2/models/model/image", content=_png()[:60],
                    headers={"content-type": "image/png"})
    assert r.status_code == 400, r.text
    r = client.post("/v2/models/model/image", content=_png(),
                    headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "image/png" in r.json()["error"]
    for route in ("image", "infer"):
        r = client.post(f"/v2/models/model/{route}", content=b"x" * (65 * 1024),
                        headers={"content-type": "image/png"})
        assert r.status_code == 413 and "larger than" in r.json()["detail"]
    r = client.post("/v2/models/model/infer", content=b"{}",
                    headers={"content-type": "application/json"})
    assert r.status_code == 400 and "inputs: Field required" in r.json()["error"], r.text
    assert client.get("/v2/health/ready").status_code == 200
    assert client.post("/v2/models/model/infer", json=_tensor(1)).status_code == 200


def test_concurrent_requests_are_batched_and_metrics_show_it(tiny_classifier: Path) -> None:
    # A slow model: the inputs that arrive while one batch runs form the next.
    config = ServeConfig(max_batch_size=8, max_wait_ms=100)
    with running(SlowPredictor.load(tiny_classifier), config) as c:
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(lambda _: c.post("/v2/models/model/infer",
                                                   json=_tensor(1)).status_code, range(8)))
        assert codes == [200] * 8
        text = c.get("/metrics").text
    count = _sample(text, "ringtrain_serve_batch_size_count")
    total = _sample(text, "ringtrain_serve_batch_size_sum")
    assert total == 8 and count < 8, text  # fewer model calls than inputs
    assert 'ringtrain_serve_requests_total{code="200",route="/v2/models/{name}/infer"} 8.0' in text
    assert "ringtrain_serve_queue_depth 0.0" in text


def _sample(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


def test_a_full_queue_is_503_with_retry_after_never_500(tiny_classifier: Path) -> None:
    config = ServeConfig(max_batch_size=1, queue_size=2, timeout_s=20)
    with running(SlowPredictor.load(tiny_classifier), config) as c:
        with ThreadPoolExecutor(10) as pool:
            responses = list(pool.map(lambda _: c.post("/v2/models/model/infer",
                                                       json=_tensor(1)), range(10)))
    codes = sorted(r.status_code for r in responses)
    assert set(codes) == {200, 503} and codes.count(200) >= 2, codes
    refused = [r for r in responses if r.status_code == 503]
    assert all(r.headers["retry-after"] == "1" and "queue" in r.json()["error"] for r in refused)


def test_a_request_past_its_timeout_is_503_with_retry_after_not_504(tiny_classifier: Path
                                                                    ) -> None:
    with running(SlowPredictor.load(tiny_classifier), ServeConfig(timeout_s=0.1)) as c:
        r = c.post("/v2/models/model/infer", json=_tensor(1))
        assert r.status_code == 503 and "not answered within" in r.json()["error"], r.text
        assert r.headers["retry-after"] == "1"
        assert c.get("/v2/health/live").status_code == 200


def test_stopping_lets_accepted_requests_finish(tiny_classifier: Path) -> None:
    results: list[int] = []
    with running(SlowPredictor.load(tiny_classifier), ServeConfig(max_batch_size=1)) as c:
        def call() -> None:
            results.append(c.post("/v2/models/model/infer", json=_tensor(1)).status_code)

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        # One input running, two waiting: then stop.
        while c.app.state.batcher.depth < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.app.state.batcher.depth == 2
        c.server.should_exit = True  # what SIGTERM does
        for t in threads:
            t.join(30)
    assert results == [200, 200, 200]


def test_a_token_is_required_when_set_and_needed_off_loopback(tiny_classifier: Path) -> None:
    with running(Predictor.load(tiny_classifier), ServeConfig(token="s3cret")) as c:
        assert c.get("/v2/health/ready").status_code == 401
        ok = c.get("/v2/health/ready", headers={"authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        r = c.post("/v2/models/model/infer", json=_tensor(1))
        assert r.status_code == 401 and "Bearer" in r.json()["error"]
        r = c.post("/v2/models/model/infer", json=_tensor(1),
                   headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = c.post("/v2/models/model/infer", json=_tensor(1),
                   headers={"authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.json()["outputs"][0]["shape"] == [1, 3]
        # The scheme's name is case-insensitive (RFC 9110); the token is not.
        for given, status in (("bearer s3cret", 200), ("BEARER s3cret", 200),
                              ("bearer S3CRET", 401), ("Basic s3cret", 401)):
            r = c.get("/v2/health/ready", headers={"authorization": given})
            assert r.status_code == status, given
    with pytest.raises(ConfigError, match="pass --token"):
        serve(tiny_classifier, ServeConfig(host="0.0.0.0"))


def test_config_refuses_impossible_settings() -> None:
    with pytest.raises(ConfigError, match="max batch size 0"):
        ServeConfig(max_batch_size=0)
    with pytest.raises(ConfigError, match="threads 0"):
        ServeConfig(threads=0)


def test_torch_threads_leave_the_event_loop_a_core() -> None:
    cores = len(os.sched_getaffinity(0))
    assert model_threads(None) == max(1, cores - 1)
    assert model_threads(3) == 3


def test_a_body_above_the_inline_size_is_answered_as_a_small_one(tiny_classifier: Path) -> None:
    # 60 inputs as JSON numbers: a body over INLINE_BYTES, decoded and encoded off the loop.
    predictor = Predictor.load(tiny_classifier)
    x = torch.rand(60, 1, 12, 12)
    body = {"inputs": [{"name": "input", "shape": [60, 1, 12, 12], "datatype": "FP32",
                        "data": x.flatten().tolist()}]}
    assert len(json.dumps(body)) > INLINE_BYTES
    with running(predictor, ServeConfig()) as c:
        r = c.post("/v2/models/model/infer", json=body)
        assert r.status_code == 200, r.text
    got = torch.tensor(r.json()["outputs"][0]["data"]).view(60, 3)
    assert torch.allclose(got, torch.softmax(predictor.model(x), dim=1), atol=1e-5)


class _FailingPredictor(Predictor):
    def predict(self, items: list[torch.Tensor]) -> list[object]:
        raise RuntimeError("out of memory (on purpose)")


def test_a_failing_model_is_500_for_that_request_and_the_server_stays_up(
        tiny_classifier: Path) -> None:
    with running(_FailingPredictor.load(tiny_classifier), ServeConfig()) as c:
        r = c.post("/v2/models/model/infer", json=_tensor(1))
        assert r.status_code == 500 and "out of memory (on purpose)" in r.json()["error"]
        assert c.get("/v2/health/ready").status_code == 200
        text = c.get("/metrics").text
    assert 'ringtrain_serve_requests_total{code="500",route="/v2/models/{name}/infer"} 1.0' in text

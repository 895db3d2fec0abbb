"""`ringtrain serve` on a saved Keras 3 model (``model.keras``): the same KServe v2 routes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

keras = pytest.importorskip("ringtrain.keras.backend").import_keras()

from ringtrain.jobs.models.deployment import find_model_folder
from ringtrain.jobs.models.info import FileInfo
from ringtrain.models.saved import SavedModelError
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.predictor import Predictor
from tests.serve.conftest import running

CLASSES = ["cat", "dog", "fish"]


def _classifier(softmax: bool) -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((10, 8, 3)), keras.layers.Conv2D(4, 3, activation="relu"),
        keras.layers.Flatten(), keras.layers.Dense(3),
        *([keras.layers.Activation("softmax")] if softmax else [])])


@pytest.fixture(scope="module")
def keras_folder(tmp_path_factory) -> Path:
    """A folder as examples/keras_cifar_cnn.py leaves it: model.keras and model.json."""
    out = tmp_path_factory.mktemp("keras")
    model = _classifier(softmax=True)
    model.compile(loss="categorical_crossentropy", optimizer="rmsprop")
    model.save(out / "model.keras")
    (out / "model.json").write_text(json.dumps({
        "arch": "keras", "task": "classification", "classes": CLASSES,
        "input_shape": [3, 10, 8], "extra": {"outputs": "probabilities"}}))
    return out


def _infer(client, x: torch.Tensor) -> torch.Tensor:
    body = {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                        "data": x.flatten().tolist()}]}
    r = client.post("/v2/models/model/infer", json=body)
    assert r.status_code == 200, r.text
    return torch.tensor(r.json()["outputs"][0]["data"]).view(x.shape[0], -1)


def test_served_keras_model_answers_its_own_probabilities(keras_folder):
    with running(Predictor.load(keras_folder), ServeConfig()) as client:
        meta = client.get("/v2/models/model").json()
        assert meta["inputs"][0]["shape"] == [-1, 3, 10, 8] and meta["classes"] == CLASSES
        assert meta["platform"] == "keras"
        x = torch.rand(4, 3, 10, 8)
        got = _infer(client, x)
        # the Keras model on the same images, channels last
        expected = keras.saving.load_model(keras_folder / "model.keras")(
            x.permute(0, 2, 3, 1).numpy())
        np.testing.assert_allclose(got.numpy(), keras.ops.convert_to_numpy(expected), atol=1e-5)
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (16, 20), (200, 30, 30)).save(buf, format="PNG")
        r = client.post("/v2/models/model/image?top_k=2", content=buf.getvalue(),
                        headers={"content-type": "image/png"})
        assert r.status_code == 200, r.text
        assert {c["label"] for c in r.json()["classes"]} <= set(CLASSES)
        r = client.post("/v2/models/model/infer", json={"inputs": [{
            "name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.0] * 192}]})
        assert r.status_code == 400 and "[3, 10, 8]" in r.text


def test_a_lone_keras_file_of_logits_is_served_with_numbered_classes(tmp_path):
    model = _classifier(softmax=False)
    model.save(tmp_path / "logits.keras")
    predictor = Predictor.load(tmp_path / "logits.keras")
    assert predictor.info.classes == ["0", "1", "2"] and predictor.item_shape == [3, 10, 8]
    x = torch.rand(2, 3, 10, 8)
    probs = torch.stack(predictor.predict(list(x)))
    logits = keras.ops.convert_to_numpy(model(x.permute(0, 2, 3, 1).numpy()))
    np.testing.assert_allclose(probs.numpy(), torch.softmax(torch.tensor(logits), 1).numpy(),
                               atol=1e-5)


def test_bad_keras_models_are_refused_with_the_reason(tmp_path, keras_folder):
    (tmp_path / "broken.keras").write_bytes(b"not a zip")
    with pytest.raises(SavedModelError, match="does not load as a Keras model"):
        Predictor.load(tmp_path / "broken.keras")
    flat = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
    flat.save(tmp_path / "flat.keras")
    with pytest.raises(SavedModelError, match="takes images"):
        Predictor.load(tmp_path / "flat.keras")
    meta = json.loads((keras_folder / "model.json").read_text())
    (tmp_path / "two.keras").write_bytes((keras_folder / "model.keras").read_bytes())
    (tmp_path / "two.json").write_text(json.dumps({**meta, "classes": ["a", "b"]}))
    with pytest.raises(SavedModelError, match="answers 3 classes"):
        Predictor.load(tmp_path / "two.keras")


def test_a_jobs_keras_outputs_count_as_a_servable_model():
    files = [FileInfo(path=f"outputs/model/{name}", size=1, modified_at=0.0)
             for name in ("model.keras", "model.json", "checkpoint-1.keras")]
    assert find_model_folder(files) == "outputs/model"
    assert find_model_folder(files[:1]) is None

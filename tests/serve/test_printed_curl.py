"""The curl line that `job deploy` / `deployment show` print works as printed against a real
`ringtrain serve` (it names the image's content type), and is not printed on the way down; the
server's /docs page works offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from ringtrain.jobs.cli.output import deployment_text
from ringtrain.jobs.models.deployment import DeploymentInfo, DeploymentState
from ringtrain.jobs.service.executors.node_launch import free_port

ROOT = Path(__file__).resolve().parents[2]


class _Job:
    cluster = "local"


def _text(state: DeploymentState, url: str) -> str:
    info = DeploymentInfo.model_construct(id="m-serve-1", serves="m-1", state=state, replicas=1,
                                          urls=[url], model="outputs/model", message="",
                                          job=_Job())
    return deployment_text(info)


def test_only_a_ready_deployment_suggests_a_request():
    assert "try:" in _text(DeploymentState.READY, "http://127.0.0.1:1")
    for state in (DeploymentState.STOPPING, DeploymentState.STOPPED, DeploymentState.FAILED):
        assert "try:" not in _text(state, "http://127.0.0.1:1")


def test_the_printed_curl_gets_an_answer(tiny_classifier: Path, tmp_path: Path):
    port = free_port("127.0.0.1")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen([sys.executable, "-m", "ringtrain.cli", "serve",
                               str(tiny_classifier), "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                pytest.fail("ringtrain serve did not become ready")
            time.sleep(0.2)
        docs = httpx.get(f"{url}/docs")  # Swagger UI from the package, no CDN
        assert docs.status_code == 200 and "cdn" not in docs.text.lower()
        assert httpx.get(f"{url}/docs/assets/swagger-ui-bundle.js").status_code == 200
        Image.new("L", (20, 20), 128).save(tmp_path / "IMAGE.jpg")
        line = next(x for x in _text(DeploymentState.READY, url).splitlines()
                    if x.startswith("try:"))
        answer = subprocess.run(["bash", "-c", line.removeprefix("try:").strip() + " -sS -f"],
                                cwd=tmp_path, capture_output=True, text=True, timeout=60,
                                check=False)
        assert answer.returncode == 0, answer.stderr
        assert json.loads(answer.stdout)["model_name"] == "model"
    finally:
        server.terminate()
        server.wait(30)

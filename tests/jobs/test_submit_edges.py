"""Smaller edges of submitting (issue 22): a named pipe as the spec file, a long plain YAML list,
the Idempotency-Key rule, one command-size limit, and answers lost on the way back."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.errors import ServiceUnavailableError, SpecError
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import JobSpec, load_job_spec
from ringtrain.jobs.models.spec import MAX_ARG_BYTES
from ringtrain.jobs.service.api.auth import home_token
from tests.jobs.conftest import bearer


@pytest.fixture(scope="module")
def http(served: tuple[Home, str]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[1], timeout=30, headers=bearer(served[0])) as client:
        assert client.post("/v1/clusters", json={"name": "idle", "nodes": 0}).status_code == 201
        yield client


def test_a_named_pipe_as_the_spec_file_is_refused_at_once(tmp_path: Path) -> None:
    pipe = tmp_path / "spec.yaml"
    os.mkfifo(pipe)
    raised: list[BaseException] = []

    def load() -> None:
        try:
            load_job_spec(pipe)
        except SpecError as e:
            raised.append(e)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(20)
    if t.is_alive():  # blocked in open(): give it a writer so that the thread ends
        with open(pipe, "w"):
            pass
        t.join(5)
        pytest.fail("loading a named pipe as a spec blocked")
    assert raised and "is a named pipe, socket or device, not a file" in str(raised[0])


def test_a_long_plain_list_is_not_blamed_on_aliases(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("node_count: 1\ncommand: x\noutputs:\n" + "".join(
        f"  - o{i}\n" for i in range(40_000)))
    with pytest.raises(SpecError) as e:
        load_job_spec(spec)
    assert "more than 10000 values" in str(e.value) and "alias" not in str(e.value)


@pytest.mark.parametrize("key", ["a b", "x" * 129, "é", ""])
def test_a_bad_idempotency_key_is_refused_naming_the_rule(http: httpx.Client, key: str) -> None:
    r = http.post("/v1/jobs", json={"cluster": "idle", "spec": {"node_count": 1, "command": "x"}},
                  headers={"Idempotency-Key": key.encode()})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "Idempotency-Key"
    assert "1 to 128 characters among A-Z a-z 0-9 . _ : -" in r.json()["detail"]


def test_one_command_size_limit_in_bytes(http: httpx.Client) -> None:
    schema = JobSpec.model_json_schema()["properties"]["command"]
    assert schema["maxLength"] == MAX_ARG_BYTES
    docs = (Path(__file__).parents[2] / "docs" / "jobs.md").read_text()
    assert str(MAX_ARG_BYTES) in docs and "524288" not in docs and "512 KiB" not in docs
    for command in ("x" * (MAX_ARG_BYTES + 1), "é" * (MAX_ARG_BYTES // 2 + 1)):
        r = http.post("/v1/jobs", json={"cluster": "idle",
                                        "spec": {"node_count": 1, "command": command}})
        assert r.status_code == 422 and f"at most {MAX_ARG_BYTES}" in r.text, r.text[:300]
        assert r.json()["errors"][0]["field"] == "command"


def test_lost_answers_name_the_key_that_finds_the_job(served: tuple[Home, str]) -> None:
    home, url = served

    class LosingAnswers(httpx.HTTPTransport):
        """Delivers every submit to the server, then loses its answer."""

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            if request.method == "POST" and request.url.path == "/v1/jobs":
                response.read()
                raise httpx.ReadError("connection reset by peer")
            return response

    client = JobsClient(url, home_token(home), reconnect_s=1)
    client._http._transport = LosingAnswers()  # the fault injection
    spec = JobSpec(node_count=1, command="true", name="lost")
    with pytest.raises(ServiceUnavailableError) as e:
        client.submit("idle", spec, "lost-key-1")
    assert "ringtrain job list --idempotency-key lost-key-1" in str(e.value)
    found = JobsClient(url, home_token(home)).find_job("lost-key-1")
    assert found is not None and found.spec.name == "lost"
    with httpx.Client(base_url=url, headers=bearer(home)) as http:
        listed = http.get("/v1/jobs", params={"idempotency_key": "lost-key-1"}).json()
    assert [j["id"] for j in listed] == [found.id]  # created once, however many tries

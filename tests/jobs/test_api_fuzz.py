"""A fuzz test of the REST API (issue 15): no request gets a 5xx, none takes a second.

Schemathesis draws requests from the service's own OpenAPI document, ones that fit it and ones
that do not; besides, any path or query parameter may be replaced by a hostile string (traversal,
NUL bytes, over-long names) or by the id of a job that exists, so that the file routes get past
the id check. A real server on loopback answers, with a fixed number of examples per operation
(about 30 s in all on a 2-core machine).

No drawn job ever runs: the only clusters have no nodes (every drawn node count is set to 0), and
a drawn working_dir that exists on this host is replaced by a small folder, so that no drawn
request copies, say, ``/``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis.generation.modes import GenerationMode

from ringtrain.jobs.home import Home
from ringtrain.jobs.models.spec import expand_path
from tests.jobs.conftest import bearer

EXAMPLES = 25
#: The bound on the wait for any answer: a handler that freezes or goes quadratic on hostile
#: input takes far longer, while a loaded host (a shared CI runner) may take over a second for a
#: fair one. How fast answers are is measured in benchmarks/ (jobs_load.py).
SLOW_S = 5.0
HOSTILE = st.sampled_from([
    "..", ".", "../clusters/victim", "..%2F..", "/etc/passwd", "outputs/..", "a\x00b",
    "a" * 256, "outputs/" + "a" * 300, "x/" * 2100, "~nosuchuser_rt/x", "é" * 200, " ",
])
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=300)
#: Integers past every range a parameter can have: the platform's (off_t, int64), and beyond.
EXTREME_INTS = ["-1", "0", "2147483648", "9223372036854775807", "9223372036854775808",
                "-9223372036854775809", "99999999999999999999999", "1" + "0" * 4000, "1e400"]


@pytest.fixture(scope="module")
def fuzzed(served: tuple[Home, str], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, Any]]:
    """The server's URL and OpenAPI schema, a queued job with files, and a small folder."""
    home, url = served
    with httpx.Client(base_url=url, timeout=30, headers=bearer(home)) as http:
        assert http.post("/v1/clusters", json={"name": "fuzz", "nodes": 0}).status_code == 201
        r = http.post("/v1/jobs", json={"cluster": "fuzz", "spec": {
            "name": "fuzzed", "node_count": 1, "command": "true", "outputs": ["o"]}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
    (home.share_root / "jobs" / job_id / "outputs" / "o" / "f.txt").write_text("f")
    small = tmp_path_factory.mktemp("small_wd")
    (small / "a.txt").write_text("a")
    yield {"url": url, "job_id": job_id, "job_dir": home.share_root / "jobs" / job_id,
           "small": str(small), "headers": bearer(home),
           "schema": schemathesis.openapi.from_url(f"{url}/openapi.json", headers=bearer(home))}


def operations() -> list[tuple[str, str, GenerationMode]]:
    """(method, path, mode) of every route; negative cases only where there is input to spoil."""
    plain = {("GET", "/v1/health"), ("GET", "/v1/clusters"), ("GET", "/v1/deployments"),
             ("GET", "/v1/host"), ("GET", "/v1/deployment-metrics"), ("GET", "/v1/progress"),
             ("GET", "/v1/tokens"), ("POST", "/v1/dashboard/login-codes")}
    routes = [("GET", "/v1/health"), ("GET", "/v1/clusters"), ("POST", "/v1/clusters"),
              ("GET", "/v1/clusters/{name}"), ("PATCH", "/v1/clusters/{name}"),
              ("DELETE", "/v1/clusters/{name}"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs"),
              ("GET", "/v1/jobs/{job_id}"), ("POST", "/v1/jobs/{job_id}/terminate"),
              ("DELETE", "/v1/jobs/{job_id}"), ("GET", "/v1/jobs/{job_id}/files"),
              ("GET", "/v1/jobs/{job_id}/download"), ("GET", "/v1/jobs/{job_id}/logs"),
              ("GET", "/v1/jobs/{job_id}/archive"),
              # No drawn deploy starts: the only job never succeeds.
              ("POST", "/v1/jobs/{job_id}/deploy"), ("GET", "/v1/deployments"),
              ("GET", "/v1/deployments/{deployment_id}"),
              ("POST", "/v1/deployments/{deployment_id}/stop"),
              ("GET", "/v1/jobs/{job_id}/scalars"), ("GET", "/v1/host"),
              ("GET", "/v1/deployment-metrics"), ("GET", "/v1/progress"),
              # The only job never runs: no drawn stack dump reaches a process.
              ("GET", "/v1/jobs/{job_id}/ranks"), ("POST", "/v1/jobs/{job_id}/ranks/{rank}/stack"),
              # Scoped tokens (the admin's routes): drawn ones are made, listed and revoked.
              ("POST", "/v1/tokens"), ("GET", "/v1/tokens"),
              ("POST", "/v1/tokens/{token_id}/revoke"),
              # Uploads of a remote submit: drawn ones hold no archive, or a refused one.
              ("GET", "/v1/uploads/{key}"), ("PUT", "/v1/uploads/{key}"),
              # A dashboard login code for the caller: each drawn one expires unused.
              ("POST", "/v1/dashboard/login-codes")]
    return [(m, p, mode) for m, p in routes for mode in GenerationMode
            if mode == GenerationMode.POSITIVE or (m, p) not in plain]


def test_the_schema_covers_every_route(fuzzed: dict[str, Any]) -> None:
    documented = {(op.ok().method.upper(), op.ok().path)
                  for op in fuzzed["schema"].get_all_operations()}
    assert documented == {(m, p) for m, p, _ in operations()}


def test_every_integer_and_path_parameter_takes_extreme_values(fuzzed: dict[str, Any]) -> None:
    """Not drawn at random: each route's every path and integer query parameter, in turn, set to
    each extreme value, the others valid (the job that exists, which has files and a log). Routes
    that change something get extreme path parameters only, which name nothing that exists.

    Before the drawn requests of the next test (pytest keeps a module's order): those may create
    what an extreme value names (an upload under the key 2147483648), which then exists."""
    job_id = fuzzed["job_id"]
    log = fuzzed["job_dir"] / "stdouterr" / "rank.0" / "stdout"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("a log line\n")
    valid = {"job_id": job_id, "deployment_id": job_id, "name": "fuzz", "path": "outputs",
             "follow": "false", "rank": "0", "token_id": "0123456789ab",
             "key": "fuzz-upload"}  # a token never made
    schema = httpx.get(f"{fuzzed['url']}/openapi.json", headers=fuzzed["headers"]).json()
    sent = 0
    # SLOW_S bounds the wait for each answer (a read timeout fails the test).
    with httpx.Client(base_url=fuzzed["url"], headers=fuzzed["headers"], timeout=SLOW_S) as http:
        for route, methods in schema["paths"].items():
            for method, op in methods.items():
                params = op.get("parameters", [])
                for p in params:
                    is_int = "integer" in str(p.get("schema"))
                    if p["in"] not in ("path", "query") or not (is_int or p["in"] == "path"):
                        continue
                    if method.upper() != "GET" and p["in"] != "path":
                        continue  # a change must not reach the job that exists
                    for value in EXTREME_INTS + ([".."] if p["in"] == "path" else []):
                        query = {q["name"]: valid[q["name"]] for q in params
                                 if q["in"] == "query" and q["name"] in valid}
                        path_values = {q["name"]: valid[q["name"]] for q in params
                                       if q["in"] == "path"}
                        (path_values if p["in"] == "path" else query)[p["name"]] = value
                        url = route.format(**{k: quote(str(v), safe="")
                                              for k, v in path_values.items()})
                        r = http.request(method.upper(), url, params=query)
                        sent += 1
                        # 0 is in range for offset and rank; every other value is out of every
                        # range.
                        low = 200 if value == "0" else 400
                        assert low <= r.status_code < 500, (route, p["name"], value[:30],
                                                            r.status_code, r.text[:300])
                        assert len(r.text) < 5000, (route, p["name"])
    assert sent >= 100  # offset, rank, limit and every route's path parameters were tried


@pytest.mark.parametrize("method,path,mode", operations(),
                         ids=[f"{m} {p} {mode.value}" for m, p, mode in operations()])
def test_no_request_gets_a_5xx_or_takes_a_second(fuzzed: dict[str, Any], method: str, path: str,
                                                mode: GenerationMode) -> None:
    operation = fuzzed["schema"][path][method]
    answers: list[tuple[int, str]] = []

    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    def fuzz(case: Any, data: st.DataObject) -> None:
        harmless(case, fuzzed)
        # Reads may name the job that exists; a terminate or delete of it would end it.
        known = [fuzzed["job_id"]] if method == "GET" else []
        for params in (case.path_parameters, case.query):
            for key in list(params or {}):
                params[key] = data.draw(st.sampled_from([params[key], *known]) | HOSTILE | TEXT
                                        | st.sampled_from(EXTREME_INTS), label=key)
        if case.query and fuzzed["job_id"] in (case.path_parameters or {}).values():
            case.query["follow"] = "false"  # the job never ends: following it would not either
        if mode == GenerationMode.POSITIVE and isinstance(case.body, dict) and "spec" in case.body:
            case.body["cluster"] = data.draw(st.sampled_from(["fuzz", case.body["cluster"]]))
        # SLOW_S bounds the wait for each answer (a read timeout fails the case).
        response = case.call(base_url=fuzzed["url"], timeout=SLOW_S, headers=fuzzed["headers"])
        answers.append((response.status_code, case.as_curl_command()))
        assert response.status_code < 500, (response.status_code, response.text[:500],
                                            case.as_curl_command())

    fuzz()
    assert answers  # requests were drawn and sent


def harmless(case: Any, fuzzed: dict[str, Any]) -> None:
    """Make a drawn request safe to send: no cluster gets nodes, no Ray head is started, no big
    folder gets copied."""
    body = case.body
    if not isinstance(body, dict):
        return
    if isinstance(body.get("nodes"), int):
        body["nodes"] = 0
    if body.get("address") == "local":
        body["address"] = "127.0.0.1:1"  # the ray path, where nothing answers
    spec = body.get("spec")
    if isinstance(spec, dict) and isinstance(spec.get("working_dir"), str):
        try:
            folder = expand_path(spec["working_dir"]).is_dir()
        except (ValueError, OSError):
            folder = False
        if folder:
            spec["working_dir"] = fuzzed["small"]

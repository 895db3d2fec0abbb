"""Scoped tokens (issue 38, least privilege): a read token watches but cannot change anything, a
token limited to one experiment does not see the others' jobs, a submit token runs jobs in its
experiment only, a revoke ends a token at once (its open streams too), the store keeps no token,
and only the admin token makes, lists and revokes them. A real server on loopback, its real
SQLite store, the CLI in-process."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.home import Home
from ringtrain.jobs.models.tokens import TokenInfo, TokenScope
from ringtrain.jobs.service.api.caller import Caller
from ringtrain.jobs.service.api.guard import CSRF_HEADER
from ringtrain.jobs.service.api.scope_guard import refusal

from .conftest import CLI, bearer

IDLE = "idle"  # a cluster without nodes: jobs submitted to it stay queued, and never run


@pytest.fixture(scope="module")
def svc(served: tuple[Home, str]) -> Iterator[tuple[Home, str]]:
    """The module's server, with a cluster where jobs wait forever."""
    home, url = served
    r = httpx.post(f"{url}/v1/clusters", json={"name": IDLE, "nodes": 0}, headers=bearer(home))
    assert r.status_code == 201, r.text
    yield home, url


@pytest.fixture
def env(svc: tuple[Home, str], monkeypatch: pytest.MonkeyPatch) -> tuple[Home, str]:
    """The CLI talks to the module's server (its home's admin token, unless --token)."""
    home, url = svc
    monkeypatch.setenv("RINGTRAIN_HOME", str(home.root))
    for name in ("RINGTRAIN_URL", "RINGTRAIN_TOKEN", "RINGTRAIN_TOKEN_FILE",
                 "RINGTRAIN_FINGERPRINT"):
        monkeypatch.delenv(name, raising=False)
    return svc


def _make(svc: tuple[Home, str], scope: str, experiment: str | None = None,
          **more: Any) -> tuple[str, str]:
    """A new token of the admin's making: its text and its id."""
    home, url = svc
    r = httpx.post(f"{url}/v1/tokens", headers=bearer(home), timeout=30,
                   json={"scope": scope, "experiment": experiment, **more})
    assert r.status_code == 201, r.text
    return r.json()["token"], r.json()["info"]["id"]


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _submit(svc: tuple[Home, str], headers: dict[str, str], experiment: str | None,
            name: str = "w", cluster: str = IDLE, command: str = "true",
            key: str | None = None) -> httpx.Response:
    spec: dict[str, Any] = {"name": name, "node_count": 1, "command": command}
    if experiment is not None:
        spec["experiment"] = experiment
    extra = {"Idempotency-Key": key} if key else {}
    return httpx.post(f"{svc[1]}/v1/jobs", json={"cluster": cluster, "spec": spec},
                      headers={**headers, **extra}, timeout=30)


def _events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event name, its data as sent) of a server-sent event stream."""
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name is not None:
            yield name, line[6:]
            name = None


def test_only_the_admin_token_makes_lists_and_revokes_tokens(env: tuple[Home, str],
                                                              cli: CLI) -> None:
    home, url = env
    rc, out, err = cli("token", "create", "--scope", "read", "--name", "alice")
    assert rc == 0, err
    token = out.strip()
    assert token.startswith("rt_") and len(out.splitlines()) == 1  # the token alone on stdout
    token_id = token.split("_")[1]
    assert f"token {token_id}: read (every experiment)" in err and "shown this once" in err
    rc, _, err = cli("token", "create", "--scope", "submit")
    assert rc == 2 and "a submit token needs an experiment" in err
    submit, _ = _make(env, "submit", "alpha")
    for scoped in (token, submit):
        for args in (("token", "create", "--scope", "read"), ("token", "list"),
                     ("token", "revoke", token_id)):
            rc, _, err = cli(*args, "--url", url, "--token", scoped)
            assert rc == 1 and "only the admin token may create, list or revoke tokens" in err
        r = httpx.get(f"{url}/v1/tokens", headers=_as(scoped))
        assert r.status_code == 403 and "scope is" in r.json()["detail"]
    rc, out, err = cli("token", "list", "-o", "json")
    assert rc == 0, err
    listed = {t["id"]: t for t in json.loads(out)}
    assert listed[token_id]["label"] == "alice" and listed[token_id]["scope"] == "read"
    assert token not in out and "token" not in listed[token_id]
    rc, out, _ = cli("token", "list")
    assert rc == 0 and token_id in out and "alice" in out and token not in out
    rc, _, err = cli("token", "revoke", "../tokens")
    assert rc == 2 and "invalid token id" in err


def test_the_token_table_holds_no_token_text(env: tuple[Home, str]) -> None:
    home, url = env
    made = [_make(env, "read"), _make(env, "read", "alpha", label="bob"),
            _make(env, "submit", "alpha", expires_days=3)]
    for token, _ in made:  # used, so that "last used" is written too
        assert httpx.get(f"{url}/v1/jobs", headers=_as(token)).status_code == 200
    with sqlite3.connect(home.db_path) as db:
        rows = db.execute("SELECT * FROM tokens").fetchall()
        dump = "\n".join(db.iterdump())
    cells = " ".join(str(c) for row in rows for c in row)
    files = b"".join(p.read_bytes() for p in home.db_path.parent.glob(home.db_path.name + "*"))
    for token, token_id in made:
        secret = token.split("_", 2)[2]
        assert token_id in cells  # the record is there, with the token's hash ...
        assert hashlib.sha256(token.encode()).hexdigest() in cells
        for text in (token, secret):  # ... and no token, in a cell, a dump or the files' bytes
            assert text not in cells and text not in dump
            assert text.encode() not in files


def test_a_read_token_watches_a_job_but_cannot_end_it(env: tuple[Home, str], cli: CLI) -> None:
    home, url = env
    admin = bearer(home)
    assert httpx.post(f"{url}/v1/clusters", json={"name": "run", "nodes": 1},
                      headers=admin).status_code == 201
    ticker = (f"{sys.executable} -c \"import time\nfor i in range(30):\n    print('line', i, "
              "flush=True); time.sleep(0.1)\"")
    r = _submit(env, admin, "watched", name="ticker", cluster="run", command=ticker)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    token, _ = _make(env, "read")
    reader = JobsClient(url, token)
    try:
        assert job_id in [j.id for j in reader.list_jobs()]
        # It may not terminate, delete, or change anything else; the 403 says what it may do.
        for method, path in (("POST", f"/v1/jobs/{job_id}/terminate"),
                             ("DELETE", f"/v1/jobs/{job_id}"),
                             ("POST", "/v1/clusters"), ("PATCH", "/v1/clusters/run"),
                             ("DELETE", "/v1/clusters/run"), ("POST", "/v1/jobs")):
            r = httpx.request(method, f"{url}{path}", headers=_as(token), json={})
            assert r.status_code == 403, (method, path)
            detail = r.json()["detail"]
            assert "this token's scope is read (every experiment)" in detail, detail
            assert "read only: GET routes" in detail
        rc, _, err = cli("job", "terminate", job_id, "--url", url, "--token", token)
        assert rc == 1 and "scope is read" in err and "needs a submit token" in err
        # ... but it follows the log to the end of the job.
        out = b"".join(reader.logs(job_id, follow=True))
        assert out.decode().splitlines() == [f"line {i}" for i in range(30)]
        assert reader.get_job(job_id).state.value == "succeeded"
        assert any(f.path.endswith("stdout") for f in reader.list_files(job_id))
    finally:
        reader.close()


def test_the_dashboard_signs_in_with_a_read_token_and_shows_why_a_control_fails(
        env: tuple[Home, str]) -> None:
    home, url = env
    job_id = _submit(env, bearer(home), "shown", name="shown").json()["id"]
    token, _ = _make(env, "read")
    with httpx.Client(base_url=url, timeout=30) as browser:
        r = browser.get("/dashboard", params={"token": token})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"
        assert token not in r.headers["set-cookie"] and "HttpOnly" in r.headers["set-cookie"]
        assert "<title>ringtrain dashboard</title>" in browser.get("/dashboard").text
        assert browser.get("/dashboard/static/app.js").status_code == 200
        with browser.stream("GET", "/v1/events") as stream:
            assert stream.status_code == 200
            name, data = next(_events(stream.iter_lines()))
        assert name == "snapshot" and job_id in [j["id"] for j in json.loads(data)["jobs"]]
        # The page's Terminate button: the cookie and the page's header, refused with the reason
        # the page shows.
        r = browser.post(f"/v1/jobs/{job_id}/terminate", headers={CSRF_HEADER.decode(): "1"})
        assert r.status_code == 403
        assert "this token's scope is read" in r.json()["detail"]
    assert httpx.get(f"{url}/v1/jobs/{job_id}", headers=bearer(home)).json()["state"] == "queued"


def test_a_read_token_s_login_code_signs_a_browser_in_as_that_token(
        env: tuple[Home, str]) -> None:
    home, url = env
    token, token_id = _make(env, "read", "coded")
    r = httpx.post(f"{url}/v1/dashboard/login-codes", timeout=30,
                   headers={"Authorization": f"bearer {token}"})  # the scheme in any case
    assert r.status_code == 201, r.text
    with httpx.Client(base_url=url, timeout=30) as browser:
        r = browser.get(r.json()["url_path"])
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"
        assert r.headers["set-cookie"].split(";")[0].split("=", 1)[1].startswith(token_id + ".")
        # Signed in as the read token, not as the admin: its scope holds.
        r = browser.post("/v1/clusters", json={"name": "x", "nodes": 1},
                         headers={CSRF_HEADER.decode(): "1"})
        assert r.status_code == 403 and "this token's scope is read" in r.json()["detail"]


def test_a_token_of_one_experiment_sees_none_of_the_others_jobs(env: tuple[Home, str]) -> None:
    home, url = env
    admin = bearer(home)
    mine = _submit(env, admin, "alpha", name="mine", key="key-mine").json()["id"]
    theirs = _submit(env, admin, "beta", name="theirs", key="key-theirs").json()["id"]
    loose = _submit(env, admin, None, name="loose").json()["id"]
    token, _ = _make(env, "read", "alpha")
    reader = _as(token)
    with httpx.Client(base_url=url, headers=reader, timeout=30) as http:
        listed = [j["id"] for j in http.get("/v1/jobs").json()]
        assert mine in listed and theirs not in listed and loose not in listed
        assert {j["spec"]["experiment"] for j in http.get("/v1/jobs").json()} == {"alpha"}
        assert http.get("/v1/jobs", params={"experiment": "beta"}).json() == []
        assert http.get("/v1/jobs", params={"idempotency_key": "key-theirs"}).json() == []
        assert [j["id"] for j in http.get("/v1/jobs",
                                          params={"idempotency_key": "key-mine"}).json()] == [mine]
        unknown = http.get("/v1/jobs/nosuch-abcdef")
        for job in (theirs, loose):
            for path in (f"/v1/jobs/{job}", f"/v1/jobs/{job}/files", f"/v1/jobs/{job}/logs",
                         f"/v1/jobs/{job}/scalars", f"/v1/deployments/{job}"):
                r = http.get(path)
                assert r.status_code == 404, path
                # Worded as for an id that does not exist: not even its existence shows.
                assert r.json()["detail"] == unknown.json()["detail"].replace("nosuch-abcdef",
                                                                              job)
        assert http.get(f"/v1/jobs/{mine}").status_code == 200
        assert all(d["job"]["spec"]["experiment"] == "alpha"
                   for d in http.get("/v1/deployments").json())
        # The event stream: the snapshot, then changes, never another experiment's job.
        with http.stream("GET", "/v1/events") as stream:
            events = _events(stream.iter_lines())
            name, data = next(events)
            assert name == "snapshot" and mine in data
            assert theirs not in data and loose not in data
            later_theirs = _submit(env, admin, "beta", name="later").json()["id"]
            assert httpx.post(f"{url}/v1/jobs/{theirs}/terminate", headers=admin
                              ).status_code == 200
            assert httpx.delete(f"{url}/v1/jobs/{theirs}", headers=admin).status_code == 204
            later_mine = _submit(env, admin, "alpha", name="later").json()["id"]
            seen = []
            for _, data in events:
                seen.append(data)
                if later_mine in data:
                    break
        assert not any(job in data for data in seen
                       for job in (theirs, later_theirs, loose)), seen


def test_a_submit_token_runs_jobs_in_its_experiment_only(env: tuple[Home, str],
                                                         cli: CLI, tmp_path: Any) -> None:
    home, url = env
    token, _ = _make(env, "submit", "alpha")
    submitter = _as(token)
    r = _submit(env, submitter, "beta")
    assert r.status_code == 403
    assert ("this token's scope is submit (experiment alpha): it submits into experiment alpha "
            "only, and this spec names experiment beta") in r.json()["detail"]
    r = _submit(env, submitter, None, name="defaulted")  # no experiment: the token's
    assert r.status_code == 201 and r.json()["spec"]["experiment"] == "alpha"
    own = r.json()["id"]
    spec = tmp_path / "job.yaml"
    spec.write_text("name: by-cli\nnode_count: 1\ncommand: 'true'\nexperiment: alpha\n")
    rc, out, err = cli("job", "submit", str(spec), "--cluster", IDLE, "--url", url,
                       "--token", token)
    assert rc == 0, err
    assert httpx.get(f"{url}/v1/jobs/{out.strip()}", headers=bearer(home)
                     ).json()["spec"]["experiment"] == "alpha"
    other = _submit(env, bearer(home), "beta", name="other", key="beta-key").json()["id"]
    # A key of another experiment's job is refused without naming that job.
    r = _submit(env, submitter, "alpha", key="beta-key")
    assert r.status_code == 409 and other not in r.json()["detail"]
    with httpx.Client(base_url=url, headers=submitter, timeout=30) as http:
        for path in (f"/v1/jobs/{other}/terminate", f"/v1/deployments/{other}/stop"):
            assert http.post(path).status_code == 404, path
        assert http.delete(f"/v1/jobs/{other}").status_code == 404
        for method, path, body in (("POST", "/v1/clusters", {"name": "x", "nodes": 1}),
                                   ("PATCH", f"/v1/clusters/{IDLE}", {"nodes": 2}),
                                   ("DELETE", f"/v1/clusters/{IDLE}", None),
                                   ("POST", "/v1/tokens", {"scope": "read"})):
            r = http.request(method, path, json=body)
            assert r.status_code == 403, path
            assert "this token's scope is submit (experiment alpha)" in r.json()["detail"]
        assert http.post(f"/v1/jobs/{own}/terminate").json()["state"] == "terminated"
        assert http.delete(f"/v1/jobs/{own}").status_code == 204
    assert httpx.get(f"{url}/v1/jobs/{other}", headers=bearer(home)).json()["state"] == "queued"
    assert httpx.get(f"{url}/v1/clusters/{IDLE}", headers=bearer(home)).json()[
        "target_nodes"] == 0


def test_a_revoked_token_is_refused_at_once_and_its_streams_end(env: tuple[Home, str],
                                                                 cli: CLI) -> None:
    home, url = env
    token, token_id = _make(env, "read")
    with httpx.Client(base_url=url, timeout=30) as browser, \
            httpx.Client(base_url=url, headers=_as(token), timeout=30) as http:
        assert browser.get("/dashboard", params={"token": token}).status_code == 303
        assert http.get("/v1/jobs").status_code == 200
        with http.stream("GET", "/v1/events") as stream:
            events = _events(stream.iter_lines())
            assert next(events)[0] == "snapshot"
            rc, out, err = cli("token", "revoke", token_id)
            assert rc == 0 and f"token {token_id} revoked" in out, err
            # The open stream ends at its next event (host usage comes every 2 s).
            ended = threading.Event()

            def drain() -> None:
                for _ in events:
                    pass
                ended.set()

            threading.Thread(target=drain, daemon=True).start()
            assert ended.wait(30), "the revoked token's event stream did not end"
        for client, path in ((http, "/v1/jobs"), (browser, "/v1/events"), (browser, "/dashboard")):
            r = client.get(path)
            assert r.status_code == 401, path
            assert f"this token (id {token_id}) was revoked" in r.json()["detail"]
        r = browser.get("/dashboard", params={"token": token})  # nor can it sign in again
        assert r.status_code == 401 and "set-cookie" not in r.headers
    rc, out, _ = cli("token", "list", "-o", "json")
    assert [t["revoked_at"] is not None for t in json.loads(out) if t["id"] == token_id] == [True]


def test_an_expired_token_is_refused_saying_so(env: tuple[Home, str]) -> None:
    home, url = env
    token, token_id = _make(env, "read", expires_days=1)
    assert httpx.get(f"{url}/v1/jobs", headers=_as(token)).status_code == 200
    with sqlite3.connect(home.db_path) as db:  # a day later, as far as the record goes
        db.execute("UPDATE tokens SET expires_at=? WHERE id=?", (time.time() - 1, token_id))
    r = httpx.get(f"{url}/v1/jobs", headers=_as(token))
    assert r.status_code == 401 and f"this token (id {token_id}) expired at" in r.json()["detail"]
    # A wrong secret with a real id learns nothing of the token's state.
    r = httpx.get(f"{url}/v1/jobs", headers=_as(f"rt_{token_id}_wrong"))
    assert r.status_code == 401 and "expired" not in r.json()["detail"]


def test_every_route_of_the_schema_is_ruled_for_each_scope(env: tuple[Home, str]) -> None:
    home, url = env
    schema = httpx.get(f"{url}/openapi.json", headers=bearer(home)).json()
    now = time.time()
    reader = Caller(TokenInfo(id="0" * 12, scope=TokenScope.READ, created_at=now))
    submitter = Caller(TokenInfo(id="1" * 12, scope=TokenScope.SUBMIT, experiment="a",
                                 created_at=now))
    acts = {("POST", "/v1/jobs"), ("POST", "/v1/jobs/{job_id}/terminate"),
            ("DELETE", "/v1/jobs/{job_id}"), ("POST", "/v1/jobs/{job_id}/deploy"),
            ("POST", "/v1/jobs/{job_id}/ranks/{rank}/stack"),
            ("POST", "/v1/deployments/{deployment_id}/stop"), ("PUT", "/v1/uploads/{key}")}
    own = {("POST", "/v1/dashboard/login-codes")}  # for the caller itself: every scope
    routes = [(m.upper(), p) for p, ops in schema["paths"].items() for m in ops]
    assert ("POST", "/v1/tokens") in routes and len(routes) > 20
    for method, path in routes:
        concrete = path.replace("{rank}", "0").replace("{", "").replace("}", "")
        admin_only = path.startswith("/v1/tokens")
        assert (refusal(reader, method, concrete) is None) == (
            not admin_only and (method == "GET" or (method, path) in own)), path
        assert (refusal(submitter, method, concrete) is None) == (
            not admin_only and (method == "GET" or (method, path) in acts | own)), path
    # What no router declares follows the same rule: reads only.
    assert refusal(reader, "GET", "/metrics") is None
    assert refusal(reader, "POST", "/v1/no-such-route") is not None


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not os.path.exists(CHROMIUM) or importlib.util.find_spec("playwright") is None,
                    reason="needs Debian's chromium and playwright (scripts/setup.sh has them)")
def test_a_read_token_s_dashboard_watches_shows_why_terminate_fails_and_a_revoke(
        env: tuple[Home, str], cli: CLI) -> None:
    from playwright.sync_api import sync_playwright

    home, url = env
    job_id = _submit(env, bearer(home), "paged", name="paged").json()["id"]
    token, token_id = _make(env, "read")
    dialogs: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_page()
            page.on("dialog", lambda d: (dialogs.append(d.message), d.accept()))
            page.goto(f"{url}/dashboard?token={token}")
            assert "token=" not in page.url
            page.wait_for_selector("#live.on")
            page.wait_for_selector(f'tr[data-job="{job_id}"]')  # it watches
            page.goto(f"{url}/dashboard#/jobs/{job_id}")
            page.wait_for_function("() => document.querySelector('#job-state').textContent"
                                   " === 'queued'")
            page.click("#terminate")  # confirmed; then the refusal, with its reason
            deadline = time.monotonic() + 30
            while len(dialogs) < 2 and time.monotonic() < deadline:
                page.wait_for_timeout(100)
            assert dialogs[-1].startswith("Could not terminate: refused: this token's scope is "
                                          "read"), dialogs
            assert cli("token", "revoke", token_id)[0] == 0
            page.wait_for_function("() => document.querySelector('#banner').textContent"
                                   ".includes('was revoked')", timeout=30_000)
        finally:
            browser.close()
    assert httpx.get(f"{url}/v1/jobs/{job_id}", headers=bearer(home)).json()["state"] == "queued"

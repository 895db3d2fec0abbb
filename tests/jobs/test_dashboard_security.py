"""Who may see the dashboard: the page, its assets, its API calls, its event stream and
``/metrics`` all refuse a missing or wrong token (401) and a foreign Host (403); the token in the
page's URL becomes an HttpOnly, SameSite=Strict cookie; a change made with that cookie needs the
dashboard's header; the browser `--open` starts gets a single-use login code, never the token. A
real server on loopback."""

from __future__ import annotations

import webbrowser

import httpx
import pytest

from ringtrain.jobs.client.connection import connect, read_server_file
from ringtrain.jobs.home import Home
from ringtrain.jobs.service.api.guard import cookie_name, cookie_value
from ringtrain.jobs.service.api.login_codes import (
    LOGIN_CODE_TTL_S,
    MAX_OUTSTANDING,
    Grant,
    LoginCodes,
)
from tests.clock import FakeClock

from .conftest import CLI, bearer

GUARDED = ("/dashboard", "/dashboard/static/app.js", "/v1/events", "/v1/jobs",
           "/v1/jobs/x-1/scalars", "/v1/host", "/metrics")


def test_no_token_wrong_token_or_foreign_host_is_refused(home: Home) -> None:
    connect(home=home).close()
    info = read_server_file(home)
    token = info.token
    good = bearer(home)
    with httpx.Client(base_url=info.url, timeout=10) as http:
        for path in GUARDED:
            assert http.get(path).status_code == 401, path
            assert http.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401
            for wrong in ("nope", token):  # the token itself is not the cookie's value
                assert http.get(path, headers={"Cookie": f"{cookie_name(token)}={wrong}"}
                                ).status_code == 401, path
            assert http.get(path, headers={**good, "Host": f"evil.example:{info.port}"}
                            ).status_code == 403, path
        assert http.get("/dashboard", params={"token": "nope"}).status_code == 401
        # The token is taken from the query of the page only.
        assert http.get("/v1/jobs", params={"token": token}).status_code == 401
        r = http.get("/dashboard", params={"token": token},
                     headers={"Host": f"evil.example:{info.port}"})
        assert r.status_code == 403 and "set-cookie" not in r.headers
        # A stream that is refused sends no event.
        with http.stream("GET", "/v1/events") as r:
            assert r.status_code == 401
            assert b"event:" not in r.read()


def test_the_page_url_signs_in_with_a_strict_cookie(home: Home) -> None:
    client = connect(home=home)
    url = client.dashboard_url()
    client.close()
    info = read_server_file(home)
    with httpx.Client(timeout=10) as http:
        r = http.get(url)
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"{cookie_name(info.token)}={cookie_value(info.token)};")
        assert info.token not in cookie
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        page = http.get(f"{info.url}/dashboard")  # the client kept the cookie
        assert page.status_code == 200 and "<title>ringtrain dashboard</title>" in page.text
        csp = page.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert http.get(f"{info.url}/v1/jobs").json() == []
        with http.stream("GET", f"{info.url}/v1/events") as events:
            assert events.status_code == 200
            first = next(events.iter_lines())
            assert first == "event: snapshot"
        # A change with the cookie alone, as a form of another local page could send it.
        r = http.post(f"{info.url}/v1/clusters", json={"name": "c", "nodes": 1})
        assert r.status_code == 403 and "x-ringtrain-request" in r.json()["detail"]
        r = http.post(f"{info.url}/v1/clusters", json={"name": "c", "nodes": 1},
                      headers={"X-Ringtrain-Request": "1"})
        assert r.status_code == 201


def test_open_gives_the_browser_a_single_use_code_never_the_token(
        home: Home, cli: CLI, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url: opened.append(url) or True)
    rc, out, err = cli("dashboard", "--open")
    assert rc == 0, err
    info = read_server_file(home)
    assert out.strip() == f"{info.url}/dashboard?token={info.token}"  # the terminal gets it
    [url] = opened
    assert info.token not in url and url.startswith(f"{info.url}/dashboard/login?code=")
    with httpx.Client(timeout=10) as browser:
        r = browser.get(url)
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"
        assert r.headers["set-cookie"].startswith(
            f"{cookie_name(info.token)}={cookie_value(info.token)};")
        assert browser.get(f"{info.url}/dashboard").status_code == 200
    # Once only: whoever read the command line is refused, with a page that says why.
    with httpx.Client(timeout=10) as other:
        for wrong in (url, f"{info.url}/dashboard/login?code=nope", f"{info.url}/dashboard/login"):
            r = other.get(wrong)
            assert r.status_code == 403 and "set-cookie" not in r.headers
            assert "no longer valid" in r.text and "ringtrain dashboard --open" in r.text
            assert r.headers["content-type"].startswith("text/html")
            assert other.get(f"{info.url}/dashboard").status_code == 401


def test_a_login_code_works_once_and_for_a_minute_only() -> None:
    clock = FakeClock()
    codes = LoginCodes(clock)
    first, second = codes.issue(Grant(None)), codes.issue(Grant("0" * 12))
    assert codes.redeem(first) == Grant(None)
    assert codes.redeem(first) is None  # used
    clock.advance(LOGIN_CODE_TTL_S)
    assert codes.redeem(second) is None  # expired
    third = codes.issue(Grant(None))
    clock.advance(LOGIN_CODE_TTL_S - 1)
    assert codes.redeem(third) == Grant(None)
    # A caller asking in a loop keeps the newest codes, never more than the bound.
    made = [codes.issue(Grant(None)) for _ in range(MAX_OUTSTANDING + 5)]
    assert codes.redeem(made[4]) is None  # the oldest five made room
    assert codes.redeem(made[5]) == Grant(None) and codes.redeem(made[-1]) == Grant(None)


def test_metrics_count_jobs_nodes_ticks_and_requests(home: Home) -> None:
    client = connect(home=home)
    from ringtrain.jobs.models import ClusterSpec

    client.create_cluster(ClusterSpec(name="m", nodes=3))
    client.list_jobs()
    info = read_server_file(home)
    text = httpx.get(f"{info.url}/metrics", headers=bearer(home), timeout=10).text
    client.close()
    assert 'ringtrain_nodes{cluster="m",state="idle"} 3.0' in text
    assert "ringtrain_jobs_scheduler_tick_seconds_count" in text
    assert 'ringtrain_jobs_api_request_seconds_count{method="GET",route="/v1/jobs",status="200"}' \
        in text
    assert "ringtrain_jobs_queue_wait_seconds_count 0.0" in text

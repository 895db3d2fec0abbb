"""Who may see the dashboard: the page, its assets, its API calls, its event stream and
``/metrics`` all refuse a missing or wrong token (401) and a foreign Host (403); the token in the
page's URL becomes an HttpOnly, SameSite=Strict cookie; a change made with that cookie needs the
dashboard's header. A real server on loopback."""

from __future__ import annotations

import httpx

from ringtrain.jobs.client.connection import connect, read_server_file
from ringtrain.jobs.home import Home
from ringtrain.jobs.service.api.guard import cookie_name, cookie_value

from .conftest import bearer

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

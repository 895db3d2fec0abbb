"""The API pages in a browser, offline: the job service's `/docs` takes the token once from a
`?token=` link (then a cookie, for reading only), and Swagger UI's files come from the package,
not a CDN; the same for `ringtrain serve`."""

from __future__ import annotations

from fastapi.testclient import TestClient

from ringtrain.jobs.service.api.app import create_app
from ringtrain.jobs.service.executors.local.backend import LocalBackend
from ringtrain.jobs.service.job_service import JobService

TOKEN = "t0ken-for-the-test"


def test_docs_take_the_token_once_then_a_cookie_and_load_no_cdn(store, share, fake_executor,
                                                                  clock) -> None:
    app = create_app(JobService(store, share, [LocalBackend(fake_executor)], clock),
                     token=TOKEN)
    with TestClient(app, base_url="http://127.0.0.1") as browser:
        assert browser.get("/docs").status_code == 401
        assert browser.get("/docs?token=wrong").status_code == 401
        first = browser.get(f"/docs?token={TOKEN}", follow_redirects=False)
        assert first.status_code == 303 and first.headers["location"] == "/docs"
        assert "HttpOnly" in first.headers["set-cookie"] and TOKEN not in first.headers["location"]
        page = browser.get("/docs")  # the cookie now
        assert page.status_code == 200 and "cdn" not in page.text.lower()
        assert "/docs/assets/swagger-ui-bundle.js" in page.text
        js = browser.get("/docs/assets/swagger-ui-bundle.js")
        assert js.status_code == 200 and len(js.content) > 100_000
        assert browser.get("/openapi.json").json()["info"]["title"] == "ringtrain job service"
        assert browser.get("/docs/assets/..%2Fswagger-ui.css").status_code == 404
        # the cookie reads; a change needs the header a form of another page cannot send
        assert browser.post("/v1/clusters", json={"name": "x", "nodes": 1}).status_code == 403
    with TestClient(app, base_url="http://127.0.0.1") as stranger:
        assert stranger.get("/v1/clusters",
                            headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


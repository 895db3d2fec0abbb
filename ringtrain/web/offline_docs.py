"""``/docs`` without the internet: Swagger UI's files served by the app itself.

FastAPI's own ``/docs`` page loads Swagger UI from a CDN, and is blank on a machine without
internet access; the ``fastapi-offline`` package ships the same files, served here under
``/docs/assets/``. It ships Swagger UI 5, the first to render OpenAPI 3.1, which is what FastAPI
writes (Swagger UI 4 shows "Unable to render this definition" for it).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
          "favicon.png": "image/png"}


def _assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def add_offline_docs(app: FastAPI, title: str) -> None:
    """Serve Swagger UI, titled ``title``, at ``/docs`` from local files for the OpenAPI
    document at ``app.openapi_url`` (build ``app`` with ``docs_url=None``)."""
    assets = _assets_dir()  # at start-up: a missing package fails here, not at the first page

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title=title,
                                   swagger_js_url="/docs/assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs/assets/swagger-ui.css",
                                   swagger_favicon_url="/docs/assets/favicon.png")

    @app.get("/docs/assets/{name}", include_in_schema=False)
    def asset(name: str) -> FileResponse:
        if name not in ASSETS:  # a fixed list: no path from the request reaches the disk
            raise HTTPException(404, f"no asset {name!r}")
        return FileResponse(assets / name, media_type=ASSETS[name],
                            headers={"Cache-Control": "max-age=86400"})

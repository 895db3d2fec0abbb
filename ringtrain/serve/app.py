"""The model server's routes: the Open Inference Protocol (KServe v2), an image route, metrics.

``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{name}`` (metadata),
``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer`` (tensors in JSON, or as raw bytes
with the binary tensor data extension, see :mod:`ringtrain.serve.tensors`; served by the lean
:mod:`ringtrain.serve.infer_route` in front of FastAPI), ``POST /v2/models/{name}/image`` (a JPEG
or PNG body: classes or boxes), ``/metrics`` (Prometheus), ``/docs``. Every input goes through the
:class:`~ringtrain.serve.batching.DynamicBatcher`, whose worker thread runs the model: the event
loop only parses and answers. Errors are JSON ``{"error", "detail"}``: 400 bad input (naming the
problem), 401 no token, 404 unknown model, 413 body too large, 415 not an image type, 503 with
``Retry-After`` when the queue is full, the memory budget is in use, the request cannot be
answered within its timeout or the server drains (decided before a body is decoded, see
:mod:`ringtrain.serve.admission`; a request that still runs out of time gets the same, never
504), 500 if the model itself fails (the server stays up).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ringtrain import __version__
from ringtrain.serve.admission import Admission
from ringtrain.serve.batching import ClosedError, DynamicBatcher, QueueFullError
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.infer_route import InferRoute, add_infer_operation, run_inputs
from ringtrain.serve.metrics import ServeMetrics
from ringtrain.serve.predictor import InputError, Predictor
from ringtrain.serve.problems import (
    HTTPProblem,
    check_model,
    check_token,
    error_json,
    problem_of,
    validation_message,
)
from ringtrain.serve.schemas import ErrorBody, ModelMetadata, TensorSpec
from ringtrain.web.body_limit import BodyLimit
from ringtrain.web.offline_docs import add_offline_docs
from ringtrain.web.request_timing import RequestTiming

_IMAGE_TYPES = ("image/", "application/octet-stream")
_ERROR_CODES = (400, 401, 404, 413, 503)


def _error(problem: HTTPProblem) -> Response:
    return Response(error_json(str(problem)), status_code=problem.status,
                    media_type="application/json", headers=problem.headers)


def create_app(predictor: Predictor, config: ServeConfig) -> FastAPI:
    """The server's app for the loaded model (``app.state.batcher`` and ``app.state.metrics``
    hold the parts); its lifespan starts the batcher and drains it on shutdown."""
    # The gauge reads the batcher at scrape time, after both exist.
    metrics = ServeMetrics(lambda: batcher.depth)
    admission = Admission(config.queue_size, config.max_memory_bytes,
                          queued=lambda: batcher.depth)

    def on_batch(size: int, seconds: float) -> None:
        metrics.observe_batch(size, seconds)
        admission.times.observe_batch(size, seconds)  # what admission forecasts from

    batcher = DynamicBatcher(predictor.predict, config.max_batch_size,
                             config.max_wait_ms / 1000, config.queue_size, on_batch=on_batch)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            # uvicorn has already let the requests in flight finish; what is still queued runs.
            await run_in_threadpool(batcher.close, config.drain_s)
            admission.close()

    app = FastAPI(title="ringtrain model server", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None,  # /docs: offline (add_offline_docs)
                  description="The Open Inference Protocol (KServe v2) for one trained model, "
                              "an image route, Prometheus metrics.")
    app.state.batcher, app.state.metrics, app.state.admission = batcher, metrics, admission
    add_offline_docs(app, "ringtrain model server")
    # Outermost last: metrics see every answer, the body limit holds for the lean route too.
    app.add_middleware(InferRoute, predictor=predictor, batcher=batcher, config=config,
                       admission=admission)
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes,
                       hint="send one image or a smaller batch per request")
    app.add_middleware(RequestTiming, observe=metrics.observe_request)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            add_infer_operation(schema, _ERROR_CODES)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    _add_error_handlers(app, config.timeout_s)

    def token(request: Request) -> None:  # every route's, /metrics' too
        check_token(config, request.headers.get("authorization", ""))

    for router in (_status_routes(predictor, config, batcher, metrics),
                   _image_route(predictor, config, batcher, admission)):
        app.include_router(router, dependencies=[Depends(token)],
                           responses={c: {"model": ErrorBody} for c in _ERROR_CODES})
    return app


def _add_error_handlers(app: FastAPI, timeout_s: float) -> None:
    @app.exception_handler(HTTPProblem)
    @app.exception_handler(InputError)
    @app.exception_handler(QueueFullError)
    @app.exception_handler(ClosedError)
    async def _problem(_r: Request, e: Exception) -> Response:
        return _error(problem_of(e, timeout_s))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_r: Request, e: RequestValidationError) -> Response:
        return _error(HTTPProblem(400, validation_message(e.errors())))


def _status_routes(predictor: Predictor, config: ServeConfig, batcher: DynamicBatcher,
                   metrics: ServeMetrics) -> APIRouter:
    """Health, the server's and the model's metadata and readiness, and ``/metrics``."""
    r = APIRouter()

    @r.get("/v2/health/live")
    def live() -> dict[str, bool]:
        return {"live": True}

    @r.get("/v2/health/ready")
    def ready() -> JSONResponse:
        ok = batcher.accepting
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @r.get("/v2")
    def server_metadata() -> dict[str, Any]:
        return {"name": "ringtrain", "version": __version__,
                "extensions": ["binary_tensor_data"]}

    @r.get("/v2/models/{name}")
    def model_metadata(name: str) -> ModelMetadata:
        check_model(config, name)
        return ModelMetadata(
            name=name, versions=["1"],
            platform="keras" if predictor.info.arch == "keras" else "pytorch",
            task=predictor.info.task,
            classes=predictor.info.classes,
            inputs=[TensorSpec(name="input", datatype="FP32", shape=[-1, *predictor.item_shape])],
            outputs=[TensorSpec(**spec) for spec in predictor.output_specs()])

    @r.get("/v2/models/{name}/ready")
    def model_ready(name: str) -> JSONResponse:
        check_model(config, name)
        return ready()

    @r.get("/metrics", include_in_schema=False)
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return r


def _image_route(predictor: Predictor, config: ServeConfig, batcher: DynamicBatcher,
                 admission: Admission) -> APIRouter:
    """``POST /v2/models/{name}/image``: one image file in, classes or boxes out."""
    r = APIRouter()

    @r.post("/v2/models/{name}/image", openapi_extra={"requestBody": {"required": True, "content": {
        "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
        "image/png": {"schema": {"type": "string", "format": "binary"}}}}})
    async def image(name: str, request: Request,
                    top_k: Annotated[int, Query(ge=1, le=1000)] = 5,
                    min_score: Annotated[float, Query(ge=0, le=1)] = 0.3) -> dict[str, Any]:
        """An image file as the body (``curl --data-binary @photo.jpg -H 'Content-Type:
        image/jpeg'``): the ``top_k`` classes, or the boxes scoring at least ``min_score``."""
        started = time.perf_counter()
        check_model(config, name)
        kind = request.headers.get("content-type", "")
        if not kind.startswith(_IMAGE_TYPES):
            raise HTTPProblem(415, f"Content-Type {kind or '(none)'} is not an image: send the "
                                  "file's bytes with Content-Type image/jpeg or image/png")
        # A place, then the decoding memory, then a decoder: 503 before any pixel is decoded.
        with admission.place() as ticket:
            with batcher.incoming():  # a batch forming now waits for this image
                data = await request.body()
                if not data:
                    raise InputError("the body is empty: send the image file's bytes")
                ticket.reserve(predictor.decode_cost(data))
                item = await admission.decode(partial(predictor.decode_image, data), "image",
                                              ticket.bytes, started + config.timeout_s)
                del data
                ticket.shrink_to(item.element_size() * item.nelement())
            (result,) = await run_inputs(batcher, admission, config, [item], started)
        answer = predictor.describe(result, top_k, min_score)
        if predictor.detection:  # boxes are in these pixels
            answer = {"width": int(item.shape[-1]), "height": int(item.shape[-2]), **answer}
        return {"model_name": name, **answer}

    return r

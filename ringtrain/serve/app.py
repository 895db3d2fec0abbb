"""The model server's routes: the Open Inference Protocol (KServe v2), an image route, metrics.

``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{name}`` (metadata),
``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer`` (tensors in JSON, or as raw bytes
with the binary tensor data extension, see :mod:`ringtrain.serve.tensors`), ``POST
/v2/models/{name}/image`` (a JPEG or PNG body: classes or boxes), ``/metrics`` (Prometheus),
``/docs``. Every input goes through the :class:`~ringtrain.serve.batching.DynamicBatcher`, whose
worker thread runs the model: the event loop only parses and answers. Errors are JSON
``{"error", "detail"}``: 400 bad input (naming the problem), 401 no token, 404 unknown model, 413
body too large, 415 not an image type, 503 with ``Retry-After`` when the queue is full or the
server drains, 504 past the request timeout, 500 if the model itself fails (the server stays up).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import torch
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from ringtrain import __version__
from ringtrain.errors import RingtrainError
from ringtrain.serve.batching import ClosedError, DynamicBatcher, QueueFullError
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.metrics import ServeMetrics
from ringtrain.serve.predictor import InputError, Predictor
from ringtrain.serve.schemas import (
    ErrorBody,
    InferRequest,
    InferResponse,
    ModelMetadata,
    TensorOutput,
    TensorSpec,
)
from ringtrain.serve.tensors import (
    HEADER_LENGTH,
    binary_sizes,
    input_tensor,
    json_tensor,
    output_parts,
    split_body,
    wants_binary_output,
)
from ringtrain.web.body_limit import BodyLimit
from ringtrain.web.exposure import bearer_matches

_IMAGE_TYPES = ("image/", "application/octet-stream")
_RETRY_AFTER_S = "1"


class _HTTPError(RingtrainError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(ErrorBody(error=message, detail=message).model_dump(), status_code=status,
                        headers=headers)


def _infer_body() -> dict[str, Any]:
    """The infer route's body in OpenAPI terms: it reads the body itself (JSON, or JSON then raw
    bytes), so FastAPI cannot describe it."""
    schema = InferRequest.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rsplit("/", 1)[-1]])
            return {k: inline(v) for k, v in node.items()}
        return [inline(v) for v in node] if isinstance(node, list) else node

    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": inline(schema)},
        "application/octet-stream": {"schema": {
            "type": "string", "format": "binary",
            "description": "Inference-Header-Content-Length bytes of the JSON request, then the "
                           "raw bytes of each input with parameters.binary_data_size"}}}}}


def create_app(predictor: Predictor, config: ServeConfig) -> FastAPI:
    """Build the server's app; its lifespan starts the batcher and drains it on shutdown.

    Args:
        predictor: The loaded model.
        config: The server's settings.

    Returns:
        The app (``app.state.batcher`` and ``app.state.metrics`` hold the parts).
    """
    # The gauge reads the batcher at scrape time, after both exist.
    metrics = ServeMetrics(lambda: batcher.depth)
    batcher = DynamicBatcher(predictor.predict, config.max_batch_size,
                             config.max_wait_ms / 1000, config.queue_size,
                             on_batch=metrics.observe_batch)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            # uvicorn has already let the requests in flight finish; what is still queued runs.
            await run_in_threadpool(batcher.close, config.drain_s)

    app = FastAPI(title="ringtrain model server", version=__version__, lifespan=lifespan,
                  description="The Open Inference Protocol (KServe v2) for one trained model, "
                              "an image route, Prometheus metrics.")
    app.state.batcher, app.state.metrics = batcher, metrics
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes,
                       hint="send one image or a smaller batch per request")

    @app.middleware("http")
    async def _measure(request: Request, call_next: Any) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        path = getattr(route, "path", "unmatched")
        metrics.requests.labels(path, str(response.status_code)).inc()
        metrics.latency.labels(path).observe(time.perf_counter() - started)
        return response

    @app.exception_handler(_HTTPError)
    async def _http_error(_r: Request, e: _HTTPError) -> JSONResponse:
        return _error(e.status, str(e))

    @app.exception_handler(InputError)
    async def _bad_input(_r: Request, e: InputError) -> JSONResponse:
        return _error(400, str(e))

    @app.exception_handler(QueueFullError)
    @app.exception_handler(ClosedError)
    async def _busy(_r: Request, e: RingtrainError) -> JSONResponse:
        return _error(503, str(e), {"Retry-After": _RETRY_AFTER_S})

    @app.exception_handler(RequestValidationError)
    async def _invalid(_r: Request, e: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
                             for err in list(e.errors())[:10])
        return _error(400, f"invalid request: {problems}")

    def check_token(request: Request) -> None:
        if config.token and not bearer_matches(request.headers.get("authorization", ""),
                                               config.token):
            raise _HTTPError(401, "this server requires `Authorization: Bearer <token>`")

    def check_model(name: str) -> None:
        if name != config.model_name:
            raise _HTTPError(404, f"no model {name!r}; this server serves {config.model_name!r}")

    async def run(items: list[torch.Tensor], started: float) -> list[Any]:
        if len(items) > config.queue_size:
            raise InputError(f"{len(items)} inputs in one request exceed the queue of "
                             f"{config.queue_size}; send at most {config.queue_size}")
        futures = []
        try:
            for item in items:
                futures.append(batcher.submit(item, config.timeout_s))
        except (QueueFullError, ClosedError):
            for f in futures:
                f.cancel()
            raise
        waiting = [asyncio.wrap_future(f) for f in futures]
        left = config.timeout_s - (time.perf_counter() - started)
        try:
            return await asyncio.wait_for(asyncio.gather(*waiting), timeout=max(left, 0.001))
        except (asyncio.TimeoutError, TimeoutError):
            for f in futures:
                f.cancel()
            raise _HTTPError(504, f"no answer within {config.timeout_s:g} s: the server is "
                                  "overloaded; try again or lower the load") from None
        except (QueueFullError, ClosedError, InputError, _HTTPError):
            raise
        except Exception as e:  # noqa: BLE001 - the model failed; this request fails, not the server
            raise _HTTPError(500, f"inference failed: {type(e).__name__}: {e}") from None

    r = APIRouter(dependencies=[Depends(check_token)],
                  responses={c: {"model": ErrorBody} for c in (400, 401, 404, 413, 503, 504)})

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
        check_model(name)
        return ModelMetadata(
            name=name, versions=["1"], platform="pytorch", task=predictor.info.task,
            classes=predictor.info.classes,
            inputs=[TensorSpec(name="input", datatype="FP32", shape=[-1, *predictor.item_shape])],
            outputs=[TensorSpec(**spec) for spec in predictor.output_specs()])

    @r.get("/v2/models/{name}/ready")
    def model_ready(name: str) -> JSONResponse:
        check_model(name)
        return ready()

    @r.post("/v2/models/{name}/infer", response_model=InferResponse,
            response_model_exclude_none=True, openapi_extra=_infer_body())
    async def infer(name: str, request: Request) -> Response:
        """Tensors in, tensors out: JSON ``data``, or raw bytes after the JSON with
        ``Inference-Header-Content-Length`` (KServe v2's binary data extension)."""
        started = time.perf_counter()
        check_model(name)
        header, raw = split_body(await request.body(), request.headers.get(HEADER_LENGTH))
        try:
            body = InferRequest.model_validate_json(header)
        except ValidationError as e:
            raise RequestValidationError(e.errors()) from None
        if len(body.inputs) != 1:
            raise InputError(f"the model takes one input tensor, got {len(body.inputs)}")
        (size,) = binary_sizes(body)
        if size is not None and size != len(raw):
            raise InputError(f"binary_data_size {size} does not match the {len(raw)} bytes "
                             "after the JSON part")
        spec = body.inputs[0]
        tensor = await run_in_threadpool(
            json_tensor if size is None else lambda s: input_tensor(s, raw), spec)
        if tensor.dim() == len(predictor.item_shape):
            tensor = tensor.unsqueeze(0)  # one input without the batch dimension
        items = list(tensor)
        for item in items:
            predictor.check_item(item)
        if not items:
            raise InputError("the input holds no item (batch dimension 0)")
        results = await run(items, started)
        binary = wants_binary_output(body)
        entries, tail = await run_in_threadpool(
            lambda: output_parts(_output_tensors(results), binary))
        answer = InferResponse(model_name=name, model_version="1", id=body.id,
                               outputs=[TensorOutput(**e) for e in entries])
        text = answer.model_dump_json(exclude_none=True).encode()
        if not binary:
            return Response(text, media_type="application/json")
        return Response(text + tail, media_type="application/octet-stream",
                        headers={HEADER_LENGTH: str(len(text))})

    def _output_tensors(results: list[Any]) -> list[tuple[str, str, torch.Tensor]]:
        if not predictor.detection:
            return [("probabilities", "FP32", torch.stack(results))]
        index = torch.cat([torch.full((len(r["scores"]),), i) for i, r in enumerate(results)])
        return [("boxes", "FP32", torch.cat([r["boxes"] for r in results]).reshape(-1, 4)),
                ("scores", "FP32", torch.cat([r["scores"] for r in results])),
                ("labels", "INT64", torch.cat([r["labels"] for r in results])),
                ("batch_index", "INT64", index)]

    @r.post("/v2/models/{name}/image", openapi_extra={"requestBody": {"required": True, "content": {
        "image/jpeg": {"schema": {"type": "string", "format": "binary"}},
        "image/png": {"schema": {"type": "string", "format": "binary"}}}}})
    async def image(name: str, request: Request,
                    top_k: Annotated[int, Query(ge=1, le=1000)] = 5,
                    min_score: Annotated[float, Query(ge=0, le=1)] = 0.3) -> dict[str, Any]:
        """An image file as the body (``curl --data-binary @photo.jpg -H 'Content-Type:
        image/jpeg'``): the ``top_k`` classes, or the boxes scoring at least ``min_score``."""
        started = time.perf_counter()
        check_model(name)
        kind = request.headers.get("content-type", "")
        if not kind.startswith(_IMAGE_TYPES):
            raise _HTTPError(415, f"Content-Type {kind or '(none)'} is not an image: send the "
                                  "file's bytes with Content-Type image/jpeg or image/png")
        data = await request.body()
        if not data:
            raise InputError("the body is empty: send the image file's bytes")
        item = await run_in_threadpool(predictor.decode_image, data)
        (result,) = await run([item], started)
        answer = predictor.describe(result, top_k, min_score)
        if predictor.detection:  # boxes are in these pixels
            answer = {"width": int(item.shape[-1]), "height": int(item.shape[-2]), **answer}
        return {"model_name": name, **answer}

    @r.get("/metrics", include_in_schema=False)
    def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(r)
    return app

"""``POST /v2/models/{name}/infer`` as a lean ASGI route, in front of FastAPI's routing.

This route carries the load, and on a small model the work around the model is most of a
request: FastAPI's routing, dependency solving, response models and thread hand-offs cost
several times what the Fashion-MNIST CNN does per input. Here a request is matched by its path,
its body parsed once (one pydantic validation of the JSON part, the tensor straight from JSON
numbers or raw bytes), checked, queued for the batcher, and answered with bytes built directly.
Bodies are decoded and answers encoded on the event loop when small (a thread hop costs more
than the work); above :data:`INLINE_BYTES` in a worker thread, so that one large request does not
stall the others. Errors are the server's usual JSON (:mod:`ringtrain.serve.problems`); the route
is described in the OpenAPI schema by :func:`add_infer_operation`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from ringtrain.serve.admission import Admission
from ringtrain.serve.batching import DynamicBatcher
from ringtrain.serve.config import ServeConfig
from ringtrain.serve.predictor import InputError, Predictor
from ringtrain.serve.problems import (
    HTTPProblem,
    check_model,
    check_token,
    error_json,
    problem_of,
    validation_message,
)
from ringtrain.serve.schemas import ErrorBody, InferRequest, InferResponse
from ringtrain.serve.tensors import (
    HEADER_LENGTH,
    binary_sizes,
    input_tensor,
    json_tensor,
    output_parts,
    split_body,
    wants_binary_output,
)

log = logging.getLogger(__name__)

#: The route's path as the OpenAPI schema and the request metrics name it.
INFER_PATH = "/v2/models/{name}/infer"
#: Bodies up to this size are decoded (and their answers encoded) on the event loop.
INLINE_BYTES = 64 << 10
_PREFIX, _SUFFIX = "/v2/models/", "/infer"
_HEADER_LENGTH = HEADER_LENGTH.encode()
#: The model's one input, as its metadata names it.
INPUT_NAME = "input"


@dataclass(frozen=True)
class RouteName:
    """Put in the ASGI scope as ``route``, as Starlette's routes are: metrics read its path."""

    path: str


_ROUTE = RouteName(INFER_PATH)


async def run_inputs(batcher: DynamicBatcher, admission: Admission, config: ServeConfig,
                     items: list[torch.Tensor], started: float) -> list[Any]:
    """One result per input of a request, run through the batcher within what is left of its
    timeout (``started``: ``time.perf_counter()`` when the request arrived), if ``admission``
    forecasts they can be.

    Raises:
        HTTPProblem: 400 more inputs than the queue holds; 503 with ``Retry-After`` when the
            queue is full or draining, when they are forecast to be answered too late, and as
            a last resort when the timeout passes before they are (never 504: a client told to
            come back knows more than one left waiting); 500 the model failed.
    """
    if len(items) > config.queue_size:
        raise HTTPProblem(400, f"{len(items)} inputs in one request exceed the queue of "
                               f"{config.queue_size}; send at most {config.queue_size}")
    deadline = started + config.timeout_s
    admission.check_time(deadline, len(items))
    try:
        return await batcher.run(items, max(deadline - time.perf_counter(), 0.001))
    except Exception as e:  # noqa: BLE001 - every failure becomes an answer, the server stays up
        raise problem_of(e, config.timeout_s) from None


class InferRoute:
    """ASGI middleware: answers ``POST /v2/models/*/infer``, passes everything else to ``app``
    (the rest of the server); ``admission`` holds the gates a request passes before its body
    is decoded."""

    def __init__(self, app: ASGIApp, predictor: Predictor, batcher: DynamicBatcher,
                 config: ServeConfig, admission: Admission) -> None:
        self.app = app
        self.predictor = predictor
        self.batcher = batcher
        self.config = config
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (scope.get("method") == "POST" and path.startswith(_PREFIX)
                and path.endswith(_SUFFIX) and "/" not in path[len(_PREFIX):-len(_SUFFIX)]):
            await self.app(scope, receive, send)
            return
        scope["route"] = _ROUTE
        started = time.perf_counter()
        try:
            body, headers = await self._answer(scope, receive, path[len(_PREFIX):-len(_SUFFIX)],
                                               started)
            status = 200
        except Exception as e:
            if not isinstance(e, (HTTPProblem, InputError)):
                log.exception("the inference route failed")
            problem = problem_of(e, self.config.timeout_s)
            status, body = problem.status, error_json(str(problem))
            headers = [(b"content-type", b"application/json"),
                       *((k.lower().encode(), v.encode()) for k, v in problem.headers.items())]
        await send({"type": "http.response.start", "status": status,
                    "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _answer(self, scope: Scope, receive: Receive, name: str, started: float
                      ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        head = dict(scope["headers"])
        check_token(self.config, head.get(b"authorization", b"").decode("latin-1"))
        check_model(self.config, name)
        # A place before the body is read, its decoding memory before it is decoded.
        with self.admission.place() as ticket:
            with self.batcher.incoming():  # a batch forming now waits for these inputs
                data = await _read_body(receive)
                length = head.get(_HEADER_LENGTH)
                large = len(data) > INLINE_BYTES
                ticket.reserve(_decode_cost(data, length))
                if large:
                    request, items = await self.admission.decode(
                        partial(self._inputs, data, length), "tensor", ticket.bytes,
                        started + self.config.timeout_s)
                else:
                    request, items = self._inputs(data, length)
                del data
                ticket.shrink_to(sum(i.element_size() * i.nelement() for i in items))
            # No await until run_inputs has queued them.
            results = await run_inputs(self.batcher, self.admission, self.config, items,
                                       started)
            binary = wants_binary_output(request)
            if large:
                return await asyncio.to_thread(self._encode, request, name, results, binary)
            return self._encode(request, name, results, binary)

    def _inputs(self, data: bytes, length: bytes | None) -> tuple[InferRequest, list[torch.Tensor]]:
        """The request and its inputs, checked.

        Raises:
            HTTPProblem: 400 naming what is wrong with the request.
            InputError: The tensor does not suit the model.
        """
        header, raw = split_body(data, None if length is None else length.decode("latin-1"))
        try:
            request = InferRequest.model_validate_json(header)
        except ValidationError as e:
            raise HTTPProblem(400, validation_message(e.errors())) from None
        if len(request.inputs) != 1:
            raise InputError(f"the model takes one input tensor, got {len(request.inputs)}")
        if request.inputs[0].name != INPUT_NAME:
            raise InputError(f"no input named {request.inputs[0].name[:64]!r}: the model's input "
                             f"is {INPUT_NAME!r} (see GET /v2/models/{self.config.model_name})")
        known = [o["name"] for o in self.predictor.output_specs()]
        for wanted in request.outputs or []:
            if wanted.get("name") not in known:
                raise InputError(f"no output named {str(wanted.get('name'))[:64]!r}: the model's "
                                 f"outputs are {', '.join(known)}")
        (size,) = binary_sizes(request)
        if size is not None and size != len(raw):
            raise InputError(f"binary_data_size {size} does not match the {len(raw)} bytes "
                             "after the JSON part")
        spec = request.inputs[0]
        tensor = json_tensor(spec) if size is None else input_tensor(spec, raw)
        if tensor.dim() == len(self.predictor.item_shape):
            tensor = tensor.unsqueeze(0)  # one input without the batch dimension
        items = list(tensor)
        if not items:
            raise InputError("the input holds no item (batch dimension 0)")
        for item in items:
            self.predictor.check_item(item)
        return request, items

    def _encode(self, request: InferRequest, name: str, results: list[Any], binary: bool
                ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        tensors = self._output_tensors(results)
        if request.outputs:  # only those asked for, in the model's order
            wanted = {o["name"] for o in request.outputs}
            tensors = [t for t in tensors if t[0] in wanted]
        entries, tail = output_parts(tensors, binary)
        answer: dict[str, Any] = {"model_name": name, "model_version": "1"}
        if request.id is not None:
            answer["id"] = request.id
        answer["outputs"] = entries
        text = json.dumps(answer, separators=(",", ":")).encode()
        if not binary:
            return text, [(b"content-type", b"application/json")]
        return text + tail, [(b"content-type", b"application/octet-stream"),
                             (_HEADER_LENGTH, str(len(text)).encode())]

    def _output_tensors(self, results: list[Any]) -> list[tuple[str, str, torch.Tensor]]:
        if not self.predictor.detection:
            return [("probabilities", "FP32", torch.stack(results))]
        index = torch.cat([torch.full((len(r["scores"]),), i) for i, r in enumerate(results)])
        return [("boxes", "FP32", torch.cat([r["boxes"] for r in results]).reshape(-1, 4)),
                ("scores", "FP32", torch.cat([r["scores"] for r in results])),
                ("labels", "INT64", torch.cat([r["labels"] for r in results])),
                ("batch_index", "INT64", index)]


def _decode_cost(data: bytes, length: bytes | None) -> int:
    """About the most bytes decoding a body allocates: JSON numbers become Python floats first
    (about 12 bytes per byte of JSON), raw tensor bytes are copied about twice."""
    try:
        json_bytes = len(data) if length is None else min(int(length), len(data))
    except ValueError:  # reported when the body is split
        json_bytes = len(data)
    return 12 * json_bytes + 2 * (len(data) - json_bytes)


async def _read_body(receive: Receive) -> bytes:
    """The whole request body (its size is already bounded by ``BodyLimit``)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            raise HTTPProblem(400, "the client disconnected before sending the whole body")
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def add_infer_operation(schema: dict[str, Any], error_codes: tuple[int, ...]) -> None:
    """Describe the route, with ``error_codes`` answered by :class:`ErrorBody`, in the schema
    ``fastapi.openapi.utils.get_openapi`` made from the FastAPI routes (changed in place)."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (InferRequest, InferResponse, ErrorBody):
        model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model_schema.pop("$defs", {}))
        components[model.__name__] = model_schema

    def ref(model: type) -> dict[str, Any]:
        return {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}

    binary = {"schema": {"type": "string", "format": "binary", "description":
                         "Inference-Header-Content-Length bytes of the JSON, then the raw bytes "
                         "of each tensor with parameters.binary_data_size"}}
    schema.setdefault("paths", {})[INFER_PATH] = {"post": {
        "summary": "Infer",
        "operationId": "infer",
        "description": "Tensors in, tensors out: JSON `data`, or raw bytes after the JSON with "
                       "`Inference-Header-Content-Length` (KServe v2's binary data extension).",
        "parameters": [{"name": "name", "in": "path", "required": True,
                        "schema": {"type": "string"}}],
        "requestBody": {"required": True, "content": {"application/json": ref(InferRequest),
                                                      "application/octet-stream": binary}},
        "responses": {"200": {"description": "The outputs",
                              "content": {"application/json": ref(InferResponse),
                                          "application/octet-stream": binary}},
                      **{str(c): {"description": "Error", "content": {"application/json":
                                                                      ref(ErrorBody)}}
                         for c in error_codes}}}}

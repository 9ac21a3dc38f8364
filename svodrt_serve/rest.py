"""The REST front in front of MLServer's FastAPI app (an ASGI wrapper, not a server of its own).

Every request body is bounded (413 past the limit, checked on Content-Length and while reading, and
again after a gzip Content-Encoding is undone). `POST /v2/models/{m}[/versions/{v}]/infer` is
answered here, because MLServer's REST infer has no binary-tensor extension and validates JSON with
FastAPI (422 with its own body): the JSON header is parsed with orjson, binary tensors
(`binary_data_size`, `Inference-Header-Content-Length`) are sliced out of the body without copying,
MLServer's data plane runs the model, and outputs go back as JSON or as binary (`binary_data` per
output, `binary_data_output` for all). Errors use the protocol's body, {"error": "..."}. Everything
else (health, metadata, readiness, the repository API) is MLServer's app untouched."""

from __future__ import annotations

import logging
import re
import zlib

import numpy as np
import orjson
from mlserver.errors import MLServerError
from mlserver.types import InferenceRequest, RequestInput, RequestOutput, TensorData

from svodrt_serve.tensors import BadTensor

INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")
HEADER_LENGTH = "inference-header-content-length"
logger = logging.getLogger("svodrt_serve")


class BodyTooLarge(MLServerError):
    def __init__(self, limit: int, what: str):
        super().__init__(f"request body {what} is over the server's limit of {limit} bytes "
                         f"(svodrt serve --max-request-mb)", status_code=413)


async def _read_body(receive, limit: int) -> bytes:
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit, f"({size}+ bytes read)")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _gunzip(body: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as e:
        raise BadTensor(f"request body is not valid gzip ({e})") from None
    if len(out) > limit or d.unconsumed_tail:
        raise BodyTooLarge(limit, "after gzip decompression")
    return out


def _params(obj: dict) -> dict:
    p = obj.get("parameters")
    return p if isinstance(p, dict) else {}


def parse_infer(body: bytes, header_length: str | None) -> tuple[InferenceRequest, dict, set[str]]:
    """An infer request: (request whose binary inputs hold memoryviews into body, its JSON header, names
    of the outputs to return as binary)."""
    view = memoryview(body)
    hlen = len(body)
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise BadTensor(f"Inference-Header-Content-Length {header_length[:40]!r} is not a length within the "
                            f"{len(body)}-byte body")
        hlen = int(header_length)
    try:
        req = orjson.loads(view[:hlen])
    except orjson.JSONDecodeError as e:
        raise BadTensor(f"malformed JSON in the inference request: {e}") from None
    if not isinstance(req, dict) or not isinstance(req.get("inputs"), list):
        raise BadTensor('the inference request must be a JSON object with an "inputs" list')
    offset = hlen
    inputs = []
    for i, inp in enumerate(req["inputs"]):
        if not isinstance(inp, dict) or not isinstance(inp.get("name"), str):
            raise BadTensor(f"inputs[{i}] must be an object with a string \"name\"")
        size = _params(inp).get("binary_data_size")
        if size is not None:
            if type(size) is not int or size < 0:
                raise BadTensor(f"input {inp['name']!r}: binary_data_size {size!r} is not a byte count")
            # A truncated tensor keeps what arrived: the model's check names its datatype, shape and size.
            data: object = view[offset: offset + size]
            offset += size
        elif "data" in inp:
            data = inp["data"]
        else:
            raise BadTensor(f"input {inp['name']!r} has neither \"data\" nor a binary_data_size parameter")
        inputs.append(RequestInput.model_construct(name=inp["name"], shape=inp.get("shape"),
                                                   datatype=inp.get("datatype"),
                                                   data=TensorData.model_construct(root=data)))
    if offset < len(body):
        raise BadTensor(f"{len(body) - offset} bytes after the JSON header and the inputs' binary data are unused "
                        "(binary_data_size does not add up to the body)")
    outs = req.get("outputs")
    if outs is not None and not (isinstance(outs, list) and all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                                               for o in outs)):
        raise BadTensor('"outputs" must be a list of objects with a string "name"')
    all_binary = _params(req).get("binary_data_output") is True
    binary = {o["name"] for o in outs or [] if _params(o).get("binary_data", all_binary) is True}
    request = InferenceRequest.model_construct(
        id=req.get("id") if isinstance(req.get("id"), str) else None, parameters=None, inputs=inputs,
        outputs=[RequestOutput.model_construct(name=o["name"]) for o in outs] if outs else None)
    return request, req, (binary if outs else ({"*"} if all_binary else set()))


def encode_response(response, binary: set[str]) -> tuple[bytes, list[memoryview]]:
    """(JSON header, binary blobs in output order): the blobs are views of the output arrays."""
    blobs, outputs = [], []
    for out in response.outputs:
        arr: np.ndarray = out.data.root
        item = {"name": out.name, "datatype": out.datatype, "shape": list(arr.shape)}
        if out.name in binary or "*" in binary:
            if arr.dtype.kind == "O":
                raise MLServerError(f"output {out.name!r} is BYTES: send it as JSON", status_code=400)
            raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
            blobs.append(memoryview(raw).cast("B"))
            item["parameters"] = {"binary_data_size": raw.nbytes}
        else:
            item["data"] = arr.reshape(-1).tolist() if arr.dtype.kind == "O" else arr.reshape(-1)
        outputs.append(item)
    head = {"model_name": response.model_name, "outputs": outputs}
    if response.model_version:
        head["model_version"] = response.model_version
    if response.id:
        head["id"] = response.id
    return orjson.dumps(head, option=orjson.OPT_SERIALIZE_NUMPY), blobs


async def _send(send, status: int, body: bytes, blobs: list[memoryview] = (), header_length: int | None = None):
    headers = [(b"content-type", b"application/octet-stream" if blobs else b"application/json"),
               (b"content-length", str(len(body) + sum(b.nbytes for b in blobs)).encode())]
    if header_length is not None:
        headers.append((HEADER_LENGTH.encode(), str(header_length).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": bool(blobs)})
    for i, blob in enumerate(blobs):
        await send({"type": "http.response.body", "body": blob, "more_body": i + 1 < len(blobs)})


async def send_error(send, status: int, message: str) -> None:
    await _send(send, status, orjson.dumps({"error": message}))


class RestFront:
    """ASGI app: the body limit and the infer route, then MLServer's app."""

    def __init__(self, app, data_plane, max_body: int):
        self.app, self.data_plane, self.max_body = app, data_plane, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        try:
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > self.max_body:
                raise BodyTooLarge(self.max_body, f"of {length} bytes (Content-Length)")
            body = await _read_body(receive, self.max_body)
            if headers.get("content-encoding", "").strip().lower() == "gzip":
                body = _gunzip(body, self.max_body)
                scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"content-encoding"]}
            match = INFER_PATH.match(scope["path"])
            if match and scope["method"] == "POST":
                return await self._infer(send, body, headers.get(HEADER_LENGTH), match["name"], match["version"])
        except ConnectionError:
            return None
        except MLServerError as e:
            return await send_error(send, e.status_code, str(e))
        except Exception as e:  # a bug of ours or MLServer's: this request fails, the server goes on
            logger.exception("inference request failed")
            return await send_error(send, 500, f"internal error: {type(e).__name__}: {e}")
        return await self.app(scope, _replay(body, receive), send)

    async def _infer(self, send, body: bytes, header_length: str | None, name: str, version: str | None) -> None:
        request, _, binary = parse_infer(body, header_length)
        response = await self.data_plane.infer(payload=request, name=name, version=version)
        head, blobs = encode_response(response, binary)
        await _send(send, 200, head, blobs, len(head) if blobs else None)


def _replay(body: bytes, receive_more):
    """A receive() that gives the body already read, then waits on the connection (for its disconnect)."""
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive_more()

    return receive

"""KServe v2 REST bodies ⇄ inferd types: JSON tensors and the binary tensor data extension.

A request body is a JSON header, optionally followed by binary tensor data; the header's length
comes from the `Inference-Header-Content-Length` HTTP header. Inputs with
`parameters.binary_data_size` take their bytes from the binary part, in order; outputs are sent as
binary when the output's `parameters.binary_data` or the request's `parameters.binary_data_output`
asks for it.

Both ways: the server decodes requests and encodes responses; the client (`inferd.client`)
encodes requests (every tensor binary) and decodes responses and errors.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from itertools import chain
from typing import Any

import numpy as np
import orjson
import simdjson

from inferd.errors import InferdError, MalformedRequestError, TensorDataError, with_triton_phrase
from inferd.limits import UNLIMITED, RequestLimits
from inferd.protocol import shared_memory
from inferd.protocol.request_id import check_request_id
from inferd.protocol.status import error_from_http
from inferd.protocol.tensor_bytes import (
    MAX_DIMENSIONS,
    MAX_SHAPE_PRODUCT,
    bytes_array,
    check_element_count,
    check_shape_size,
    tensor_from_bytes,
    tensor_to_bytes,
)
from inferd.types import (
    BatchStatistics,
    DataType,
    DurationStatistic,
    InferRequest,
    InferResponse,
    ModelIndexEntry,
    ModelMetadata,
    ModelStatistics,
    RequestContext,
    RequestedOutput,
    ServerMetadata,
    Tensor,
    TensorMetadata,
    element_count,
    new_request_id,
)

HEADER_LENGTH_HEADER = "inference-header-content-length"
# How long the client waits, in milliseconds: the request's deadline (inferd's own header).
TIMEOUT_HEADER = "inferd-timeout-ms"
JSON_CONTENT_TYPE = b"application/json"
BINARY_CONTENT_TYPE = b"application/octet-stream"


def decode_request(
    body: bytes,
    *,
    limits: RequestLimits,
    model_name: str,
    model_version: str,
    header_length: int | None = None,
    context: RequestContext | None = None,
    regions: shared_memory.RegionAccess | None = None,
) -> InferRequest:
    """Parse an infer request, held to `limits` (the server's), of `context` (the call's: a new one
    when None). The context's request id (from X-Request-ID) wins over the v2 `id`; else one is made."""
    header, binary = _split(body, header_length)
    document = _load_header(header)
    if not isinstance(document, dict):
        raise MalformedRequestError("request body must be a JSON object with an 'inputs' list")
    v2_id = document.get("id", "")
    if not isinstance(v2_id, str):
        raise MalformedRequestError("'id' must be a string")
    check_request_id(v2_id, "'id'")
    if context is None:
        context = RequestContext()
    try:
        inputs = _decode_inputs(document.get("inputs"), binary, regions, model_name, limits)
        outputs = _decode_outputs(document.get("outputs"))
        parameters = _parameters(document.get("parameters"), "request")
    except InferdError as exc:
        exc.request_id = context.request_id or v2_id or new_request_id()
        raise
    return context.request(model_name, model_version, inputs, outputs, parameters, v2_id)


def encode_response(
    response: InferResponse, request: InferRequest, regions: shared_memory.RegionAccess | None = None
) -> tuple[bytes, int | None]:
    """The response body and, when it carries binary tensors, the length of its JSON header.
    Outputs the request placed in shared memory are written there, their entries without data."""
    binary_default = bool(request.parameters.get("binary_data_output", False))
    wishes = {o.name: o.parameters for o in request.outputs}
    placed = shared_memory.write_outputs(response.outputs, wishes, regions) if wishes else {}
    inline = tuple(t for t in response.outputs if t.name not in placed) if placed else response.outputs
    entries, binary_parts = _tensor_entries(
        inline, lambda name: bool(wishes.get(name, {}).get("binary_data", binary_default))
    )
    if placed:
        by_name = {entry["name"]: entry for entry in entries}
        entries = [
            {"name": t.name, "datatype": t.datatype.value, "shape": list(t.shape)}  # as Triton: no data, no size
            if t.name in placed else by_name[t.name]
            for t in response.outputs
        ]  # fmt: skip
    document: dict[str, Any] = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    document["outputs"] = entries
    return _body(document, binary_parts)


def encode_request(request: InferRequest, *, binary: bool = True) -> tuple[bytes, int | None]:
    """A request body and the length of its JSON header (for Inference-Header-Content-Length; None
    when the body is all JSON). `binary`: every input as raw bytes and every output asked for in
    binary; else tensors as JSON numbers and strings (BYTES that are not UTF-8 still go binary)."""
    inputs, parts = _tensor_entries(request.inputs, lambda _: binary)
    document: dict[str, Any] = {"inputs": inputs, "parameters": {**request.parameters, "binary_data_output": binary}}
    if request.id:
        document["id"] = request.id
    if request.outputs:
        document["outputs"] = [
            {"name": o.name, "parameters": {**o.parameters, "binary_data": binary}} for o in request.outputs
        ]
    return _body(document, parts)


def _body(document: dict[str, Any], binary_parts: list[bytes]) -> tuple[bytes, int | None]:
    """The JSON header followed by the binary parts, and the header's length (None without parts)."""
    header = encode_tensor_json(document)
    if not binary_parts:
        return header, None
    return b"".join([header, *binary_parts]), len(header)


def encode_tensor_json(document: Any) -> bytes:
    """`document`, which holds tensor data as numpy arrays, as JSON: floats as orjson writes numpy's
    (a float32 0.1 is 0.1, not the double's 0.10000000149011612; float16 in float32's form), and NaN
    and ±inf as Triton, TF Serving and TorchServe write them (NaN, Infinity, -Infinity: rapidjson's
    flag, or Python's json), which their clients read, rather than orjson's null, which a client
    reads back as NaN or None whatever the value was. Arrays orjson does not take as they are (0-d,
    not C-contiguous) are made so first."""
    body = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY, default=_numpy_for_orjson)
    # orjson's NaN and ±inf (or a null of the document, or a string holding "null")
    if b"null" in body:
        written = _non_finite_as_tokens(document)
        if written is not document:
            return orjson.dumps(written, option=orjson.OPT_SERIALIZE_NUMPY, default=_numpy_for_orjson)
    return body


def _non_finite_as_tokens(value: Any) -> Any:
    """`value` itself when no float in it is NaN or ±inf; else a copy in which each float array (or
    number) holding one is its JSON text with those tokens, as an orjson.Fragment."""
    if isinstance(value, np.ndarray | np.generic) and value.dtype == _BFLOAT16:  # as float32, which holds it exactly
        value = np.float32(value) if isinstance(value, np.generic) else value.astype(np.float32)
    if isinstance(value, np.ndarray | np.floating):
        if value.dtype.kind != "f" or bool(np.isfinite(value).all()):
            return value
        return orjson.Fragment(_floats_with_tokens(value))
    if isinstance(value, dict):
        items = {key: _non_finite_as_tokens(item) for key, item in value.items()}
        return value if all(items[key] is item for key, item in value.items()) else items
    if isinstance(value, list | tuple):
        elements = [_non_finite_as_tokens(item) for item in value]
        return value if all(new is old for new, old in zip(elements, value, strict=True)) else elements
    if isinstance(value, float) and not math.isfinite(value):
        return orjson.Fragment(_floats_with_tokens(np.float64(value)))
    return value


def _floats_with_tokens(values: np.ndarray[Any, Any] | np.floating[Any]) -> bytes:
    """orjson's text of a float array or number, each null (its NaN and ±inf, in order: nothing
    else in a float array writes null) replaced by the value's token."""
    parts = orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY, default=_numpy_for_orjson).split(b"null")
    flat = np.asarray(values).reshape(-1)
    non_finite = flat[~np.isfinite(flat)]
    tokens = np.where(np.isnan(non_finite), b"NaN", np.where(non_finite > 0, b"Infinity", b"-Infinity")).tolist()
    return b"".join(chain.from_iterable(zip(parts, [*tokens, b""], strict=True)))


def _numpy_for_orjson(value: Any) -> Any:
    """What orjson's numpy support does not write as it is: a 0-d array (as its number), an array
    that is not C-contiguous (as a contiguous copy), other dtypes or scalars (as Python values)."""
    if isinstance(value, np.ndarray):
        if value.dtype == _BFLOAT16:  # orjson writes no bfloat16; float32 holds each value exactly
            return value.astype(np.float32)
        if value.ndim == 0:
            return value[()]
        if not value.flags.c_contiguous:
            return np.ascontiguousarray(value)
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON")


def _tensor_entries(
    tensors: tuple[Tensor, ...], as_binary: Callable[[str], bool]
) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Each tensor's JSON entry, with its data inline or (when `as_binary` says so, or it cannot be
    JSON) as binary_data_size; and the binary parts, in order."""
    entries: list[dict[str, Any]] = []
    parts: list[bytes] = []
    for tensor in tensors:
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype.value, "shape": list(tensor.shape)}
        data = None if as_binary(tensor.name) else _json_data(tensor)
        if data is None:
            raw = tensor_to_bytes(tensor)
            entry["parameters"] = {"binary_data_size": len(raw)}
            parts.append(raw)
        else:
            entry["data"] = data
        entries.append(entry)
    return entries, parts


def decode_response(body: bytes, *, header_length: int | None = None, request_id: str = "") -> InferResponse:
    """Parse an infer response (JSON or binary outputs). A body that is not one raises
    MalformedRequestError: the caller knows whose mistake that is."""
    header, binary = _split(body, header_length)
    document = _load_header(header)
    if not isinstance(document, dict) or not isinstance(document.get("outputs"), list):
        raise MalformedRequestError("response body must be a JSON object with an 'outputs' list")
    return InferResponse(
        model_name=str(document.get("model_name", "")),
        model_version=str(document.get("model_version", "")),
        request_id=request_id,
        # An answer its client asked for: no server's limits apply.
        outputs=_decode_tensors(document["outputs"], binary, "output", UNLIMITED),
        id=str(document.get("id", "")),
    )


def decode_error(body: bytes) -> str:
    """The message of an error response, or the body itself when it is not inferd's (or Triton's) JSON."""
    document = _error_document(body)
    if document is not None:
        return str(document["error"])
    return body[:200].decode("utf-8", errors="replace")


def decode_error_response(status: int, body: bytes, *, retry_after: str | None = None) -> InferdError:
    """An error response as inferd's typed error (its class from inferd's `code`, else from the
    status), with the request id, the tensor fields and how long to wait before a retry (inferd's
    `retry_after_ms`, else the `Retry-After` header's seconds)."""
    document = _error_document(body) or {}
    message = str(document["error"]) if document else (body[:200].decode("utf-8", errors="replace") or f"HTTP {status}")

    def text(key: str) -> str | None:
        value = document.get(key)
        return str(value) if value is not None else None

    retry_after_s: float | None = None
    if isinstance(document.get("retry_after_ms"), int | float):
        retry_after_s = float(document["retry_after_ms"]) / 1000
    elif retry_after and retry_after.strip().isascii() and retry_after.strip().isdigit():
        retry_after_s = float(retry_after.strip())
    error = error_from_http(
        status,
        text("code"),
        message,
        tensor=text("tensor"),
        expected=text("expected"),
        actual=text("actual"),
        retry_after_s=retry_after_s,
    )
    error.request_id = text("request_id")
    return error


def _error_document(body: bytes) -> dict[str, Any] | None:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return document if isinstance(document, dict) and isinstance(document.get("error"), str) else None


def decode_model_metadata(body: bytes) -> ModelMetadata:
    """A model metadata response (GET /v2/models/{m})."""
    document = _load_header(body)

    def tensors(items: Any) -> tuple[TensorMetadata, ...]:
        if not isinstance(items, list):
            raise MalformedRequestError("model metadata must list its inputs and outputs")
        return tuple(
            TensorMetadata(str(t["name"]), str(t["datatype"]), tuple(int(d) for d in t["shape"])) for t in items
        )

    try:
        return ModelMetadata(
            name=str(document["name"]),
            versions=tuple(str(v) for v in document.get("versions", ())),
            platform=str(document.get("platform", "")),
            inputs=tensors(document.get("inputs")),
            outputs=tensors(document.get("outputs")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedRequestError(f"model metadata is not the v2 shape: {exc!r}") from None


def encode_error(error: InferdError, request_id: str) -> bytes:
    return orjson.dumps({"error": error.message, **error.details(), "request_id": request_id})


def encode_json(document: Mapping[str, Any] | list[Any]) -> bytes:
    return orjson.dumps(document)


# -- the repository extension ---------------------------------------------------------------------

# Triton's load parameters: "config" (the ModelConfig as JSON text) and "file:<path>" (base64 content).
CONFIG_PARAMETER = "config"
FILE_PARAMETER_PREFIX = "file:"


def decode_index_request(body: bytes) -> bool:
    """`POST /v2/repository/index`'s body (may be empty): whether only ready models are asked for."""
    document = _repository_body(body)
    ready = document.get("ready", False)
    if not isinstance(ready, bool):
        raise MalformedRequestError(
            with_triton_phrase("Invalid value for 'ready': expected a boolean", "'ready' must be true or false")
        )
    return ready


def decode_load_request(body: bytes) -> tuple[str, dict[str, bytes]]:
    """`POST /v2/repository/models/{m}/load`'s body: the config override ("" for none) and the files."""
    import base64
    import binascii

    parameters = _parameters(_repository_body(body).get("parameters"), "load request")
    config = parameters.get(CONFIG_PARAMETER, "")
    if not isinstance(config, str):
        raise MalformedRequestError("load parameter 'config' must be the model configuration as a JSON string")
    files = {}
    for key, value in parameters.items():
        if key.startswith(FILE_PARAMETER_PREFIX):
            if not isinstance(value, str):
                raise MalformedRequestError(f"load parameter '{key}' must be base64 text")
            try:
                files[key[len(FILE_PARAMETER_PREFIX) :]] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise MalformedRequestError(f"load parameter '{key}' is not valid base64") from None
    return config, files


def decode_unload_request(body: bytes) -> bool:
    """`POST /v2/repository/models/{m}/unload`'s body: whether `unload_dependents` is asked."""
    parameters = _parameters(_repository_body(body).get("parameters"), "unload request")
    dependents = parameters.get("unload_dependents", False)
    if not isinstance(dependents, bool):
        raise MalformedRequestError("unload parameter 'unload_dependents' must be true or false")
    return dependents


def repository_index_json(entries: list[ModelIndexEntry]) -> list[dict[str, Any]]:
    """Triton's index: fields a model does not have (a version, a state) are left out. inferd adds
    `load_ms`, the last load's cold-start breakdown, to each loaded version."""
    index = []
    for e in entries:
        entry: dict[str, Any] = {"name": e.name}
        entry.update((key, value) for key, value in (("version", e.version), ("state", e.state),
                                                     ("reason", e.reason)) if value)  # fmt: skip
        if e.timings is not None:
            entry["load_ms"] = {
                "fetch": round(e.timings.fetch_s * 1e3, 3),
                "session": round(e.timings.session_s * 1e3, 3),
                "warmup": round(e.timings.warmup_s * 1e3, 3),
            }
        index.append(entry)
    return index


def encode_index_request(ready: bool) -> bytes:
    return orjson.dumps({"ready": ready})


def encode_load_request(config_json: str = "", files: Mapping[str, bytes] | None = None) -> bytes:
    """The load request's body: a config override (JSON text) and model files (base64)."""
    import base64

    parameters: dict[str, str] = {CONFIG_PARAMETER: config_json} if config_json else {}
    for path, content in (files or {}).items():
        parameters[FILE_PARAMETER_PREFIX + path] = base64.b64encode(content).decode("ascii")
    return orjson.dumps({"parameters": parameters})


def encode_unload_request(unload_dependents: bool) -> bytes:
    return orjson.dumps({"parameters": {"unload_dependents": unload_dependents}})


def decode_repository_index(body: bytes) -> list[ModelIndexEntry]:
    document = _load_header(body)
    if not isinstance(document, list):
        raise MalformedRequestError("the repository index must be a JSON list")
    try:
        return [
            ModelIndexEntry(
                name=str(entry["name"]),
                version=str(entry.get("version", "")),
                state=str(entry.get("state", "")),
                reason=str(entry.get("reason", "")),
            )
            for entry in document
        ]
    except (KeyError, TypeError, AttributeError) as exc:
        raise MalformedRequestError(f"the repository index is not the v2 shape: {exc!r}") from None


def decode_server_metadata(body: bytes) -> ServerMetadata:
    document = _load_header(body)
    try:
        return ServerMetadata(
            name=str(document["name"]),
            version=str(document.get("version", "")),
            extensions=tuple(str(e) for e in document.get("extensions", ())),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise MalformedRequestError(f"server metadata is not the v2 shape: {exc!r}") from None


def decode_statistics(body: bytes) -> list[ModelStatistics]:
    """Triton's statistics extension body (what `statistics_json` writes)."""
    document = _load_header(body)

    def duration(raw: Any) -> DurationStatistic:
        raw = raw or {}
        return DurationStatistic(count=int(raw.get("count", 0)), ns=int(raw.get("ns", 0)))

    try:
        return [
            ModelStatistics(
                name=str(s["name"]),
                version=str(s.get("version", "")),
                last_inference_ms=int(s.get("last_inference", 0)),
                inference_count=int(s.get("inference_count", 0)),
                execution_count=int(s.get("execution_count", 0)),
                **{key: duration(s.get("inference_stats", {}).get(key)) for key in _DURATION_FIELDS},
                batches=tuple(
                    BatchStatistics(
                        batch_size=int(b["batch_size"]),
                        compute_input=duration(b.get("compute_input")),
                        compute_infer=duration(b.get("compute_infer")),
                        compute_output=duration(b.get("compute_output")),
                    )
                    for b in s.get("batch_stats", ())
                ),
            )
            for s in document["model_stats"]
        ]
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise MalformedRequestError(f"statistics are not the v2 shape: {exc!r}") from None


_DURATION_FIELDS = (
    "success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss",
)  # fmt: skip


def _repository_body(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    document = _load_header(body)
    if not isinstance(document, dict):
        raise MalformedRequestError("the request body must be a JSON object")
    return document


def server_metadata_json(metadata: ServerMetadata) -> dict[str, Any]:
    return {"name": metadata.name, "version": metadata.version, "extensions": list(metadata.extensions)}


def model_metadata_json(metadata: ModelMetadata) -> dict[str, Any]:
    return {
        "name": metadata.name,
        "versions": list(metadata.versions),
        "platform": metadata.platform,
        "inputs": [_tensor_metadata_json(t) for t in metadata.inputs],
        "outputs": [_tensor_metadata_json(t) for t in metadata.outputs],
    }


def _tensor_metadata_json(tensor: TensorMetadata) -> dict[str, Any]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}


def _split(body: bytes, header_length: int | None) -> tuple[bytes, memoryview]:
    if header_length is None:
        return body, memoryview(b"")
    if header_length < 0 or header_length > len(body):
        raise MalformedRequestError(
            f"Inference-Header-Content-Length is {header_length} but the body has {len(body)} bytes"
        )
    view = memoryview(body)
    return bytes(view[:header_length]), view[header_length:]


# From about 5 KB up, simdjson reading tensor data straight into a numpy buffer beats orjson, which
# makes a Python float per element (a 2.9 MB ResNet-50 body: 20 ms with orjson + numpy, 7 ms here).
LARGE_HEADER_BYTES = 8 * 1024


def load_json(body: bytes, *, non_finite: bool = True) -> Any:
    """Any door's JSON body as Python objects, or the 400 that says why it is not JSON. `non_finite`:
    NaN, Infinity and -Infinity are read, as the servers whose clients send them read them (TF
    Serving's rapidjson flag; Python's json in TorchServe's and SageMaker's handlers)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if not non_finite:
            raise _not_json(exc) from None
        return _with_non_finite_tokens(body, exc, larger="send larger ones over gRPC")


# The tokens Triton reads and writes for NaN and ±inf (rapidjson's kParseNanAndInfFlag), beyond JSON;
# read in v2 bodies up to this size (Python's parser takes about 4x orjson's time and makes a
# Python float of every number: past it, send the tensor with the binary extension).
_NON_FINITE_TOKENS = ("NaN", "Infinity", "-Infinity")
NON_FINITE_JSON_LIMIT = 4 * 2**20


def _with_non_finite_tokens(text: bytes, error: Exception, larger: str) -> Any:
    """A body orjson or simdjson refused, read again when orjson stopped at NaN, Infinity or
    -Infinity as Triton's clients write them (tritonclient sends a NaN input so); else the 400 for
    `error`. Valid JSON never comes here, and neither does a body refused for anything else.
    `larger`: what the 400 for a body past the limit advises."""
    if isinstance(error, orjson.JSONDecodeError):
        failure = error
    else:  # simdjson's: where orjson stops says why
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            failure = exc
    # orjson's position counts characters, not bytes, and it refuses text that is not UTF-8 before
    # anything else: the characters up to a token lie in the first 4 bytes each (no whole decode of
    # a large malformed body).
    head = text[: 4 * (failure.pos + len(_NON_FINITE_TOKENS[-1]))].decode("utf-8", "ignore")
    if head.startswith(_NON_FINITE_TOKENS, failure.pos):
        if len(text) > NON_FINITE_JSON_LIMIT:
            raise MalformedRequestError(
                f"request JSON holds NaN or Infinity, read in bodies up to {NON_FINITE_JSON_LIMIT // 2**20} MiB; "
                f"{larger}"
            )
        try:
            document = json.loads(text.decode("utf-8"))
            orjson.dumps(document)  # what orjson would refuse to have read: lone surrogates, huge integers
            return document
        except (ValueError, RecursionError, TypeError, orjson.JSONEncodeError):
            pass  # not JSON after all, or nested past the interpreter's limit: the first error says
    raise _not_json(failure) from None


def _not_json(error: orjson.JSONDecodeError) -> MalformedRequestError:
    return MalformedRequestError(f"failed to parse the request JSON buffer: request body is not valid JSON: {error}")


def _load_header(header: bytes) -> Any:
    """The JSON header as Python objects; in large headers each input's `data` stays a simdjson.Array."""
    try:
        if len(header) < LARGE_HEADER_BYTES:
            return orjson.loads(header)
        return _load_large_header(header)
    except (orjson.JSONDecodeError, ValueError) as exc:
        return _with_non_finite_tokens(header, exc, larger="send this tensor with the binary tensor data extension")
    except RuntimeError as exc:
        # simdjson's DEPTH_ERROR: both parsers stop, without recursing, at 1024 levels of nesting.
        raise MalformedRequestError(
            f"failed to parse the request JSON buffer: request body is not valid JSON: nested deeper than 1024 "
            f"levels ({exc})"
        ) from None


def _load_large_header(header: bytes) -> Any:
    # A fresh parser per request: a parser cannot parse again while Arrays from its last document live.
    document = simdjson.Parser().parse(header)
    if not isinstance(document, simdjson.Object):
        return _plain(document)
    loaded = {}
    for key in document:
        value = document[key]
        if key == "inputs" and isinstance(value, simdjson.Array):
            loaded[key] = [_input_entry(value[i]) for i in range(len(value))]
        else:
            loaded[key] = _plain(value)
    return loaded


def _input_entry(entry: Any) -> Any:
    if not isinstance(entry, simdjson.Object):
        return _plain(entry)
    return {key: entry[key] if key == "data" else _plain(entry[key]) for key in entry}


def _plain(value: Any) -> Any:
    if isinstance(value, simdjson.Array):
        return value.as_list()
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    return value


def _decode_inputs(
    raw_inputs: Any, binary: memoryview, regions: shared_memory.RegionAccess | None, model: str, limits: RequestLimits
) -> tuple[Tensor, ...]:
    # An empty list is the model's to judge (Triton answers how many inputs it expects).
    if not isinstance(raw_inputs, list):
        raise MalformedRequestError("request must have an 'inputs' list")
    return _decode_tensors(raw_inputs, binary, "input", limits, regions, model)


def _decode_tensors(
    raw_tensors: list[Any],
    binary: memoryview,
    kind: str,
    limits: RequestLimits,
    regions: shared_memory.RegionAccess | None = None,
    model: str | None = None,
) -> tuple[Tensor, ...]:
    """A request's inputs to `model` or a response's outputs (`kind`): JSON data or binary_data_size
    bytes, held to `limits` (a response's: `UNLIMITED`)."""
    offset = 0
    tensors = []
    for index, raw in enumerate(raw_tensors):
        if not isinstance(raw, dict):
            raise MalformedRequestError(f"{kind}s[{index}] must be an object")
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise MalformedRequestError(f"{kind}s[{index}] has no 'name'")
        datatype = _datatype(raw.get("datatype"), name)
        shape = _shape(raw.get("shape"), name)
        parameters = raw.get("parameters")
        size = None
        if parameters is not None:
            size = _parameters(parameters, f"{kind} '{name}'").get("binary_data_size")
            place = shared_memory.placement(parameters, name) if kind == "input" else None
            if place is not None:
                if size is not None or "data" in raw:
                    raise MalformedRequestError(
                        f"Input must set only one of the following fields: 'data', 'binary_data_size' in "
                        f"'parameters', 'shared_memory_region' in 'parameters': input '{name}' sets more than one",
                        tensor=name,
                    )
                data = shared_memory.read_input(place, regions, name)
                tensors.append(tensor_from_bytes(name, datatype, shape, memoryview(data), limits, model=model))
                continue
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise MalformedRequestError(f"{kind} '{name}': binary_data_size must be a non-negative integer")
            if offset + size > len(binary):
                raise MalformedRequestError(
                    f"{kind} '{name}': binary_data_size {size} runs past the binary data "
                    f"({len(binary) - offset} bytes left after the header and earlier {kind}s)",
                    tensor=name,
                )
            tensors.append(
                tensor_from_bytes(name, datatype, shape, binary[offset : offset + size], limits, model=model)
            )
            offset += size
        else:
            if "data" not in raw:
                raise MalformedRequestError(
                    f"{kind} '{name}' has neither 'data' nor parameters.binary_data_size", tensor=name
                )
            if datatype is DataType.BF16:  # as Triton: JSON numbers would be rounded on the way
                raise TensorDataError(
                    f"{kind} '{name}': BF16 data cannot be sent as JSON; send it binary (the binary tensor data "
                    "extension: parameters.binary_data_size and the raw little-endian bytes after the JSON), "
                    "as tritonclient does",
                    tensor=name,
                )
            tensors.append(Tensor(name, datatype, shape, _array_from_json(name, datatype, shape, raw["data"], limits)))
    if offset != len(binary):
        raise MalformedRequestError(
            f"{len(binary) - offset} bytes of binary data follow the {kind}s' declared binary_data_size"
        )
    return tuple(tensors)


def _decode_outputs(raw_outputs: Any) -> tuple[RequestedOutput, ...]:
    if raw_outputs is None:
        return ()
    if not isinstance(raw_outputs, list):
        raise MalformedRequestError("'outputs' must be a list")
    requested = []
    for index, raw in enumerate(raw_outputs):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise MalformedRequestError(f"outputs[{index}] must be an object with a 'name'")
        parameters = _parameters(raw.get("parameters"), f"output '{raw['name']}'")
        requested.append(RequestedOutput(name=raw["name"], parameters=parameters))
    return tuple(requested)


def _parameters(raw: Any, where: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise MalformedRequestError(f"{where}: 'parameters' must be an object")
    return raw


def _datatype(raw: Any, name: str) -> DataType:
    try:
        return DataType.from_wire(raw)
    except ValueError:
        raise MalformedRequestError(
            f"input '{name}': datatype {raw!r} is not a v2 datatype ({', '.join(d.value for d in DataType)})",
            tensor=name,
        ) from None


def _shape(raw: Any, name: str) -> tuple[int, ...]:
    # Every input of every request passes here: checks made in C, no generator. Bools are not of
    # type int (they are ints to isinstance).
    if type(raw) is not list or not set(map(type, raw)) <= _INT_TYPE or (raw and min(raw) < 0):
        raise MalformedRequestError(f"input '{name}': 'shape' must be a list of non-negative integers", tensor=name)
    shape = tuple(raw)
    if len(shape) > MAX_DIMENSIONS or 0 in shape or math.prod(shape) >= MAX_SHAPE_PRODUCT:  # else no call
        check_shape_size(name, shape)
    return shape


_INT_TYPE = frozenset({int})
_BFLOAT16 = DataType.BF16.numpy_dtype
# What numpy infers from JSON numbers, per target datatype kind: ints must stay ints, etc.
_ACCEPTED_KINDS = {"b": "b", "i": "iu", "u": "iu", "f": "iuf"}
# Dimensions a tensor read from nested JSON lists may have (TF Serving's rows and columns).
MAX_DIMS = 32
# The element types of a flat list that converts straight to a target of each kind.
_PLAIN_TYPES = {"b": frozenset({bool}), "i": frozenset({int}), "u": frozenset({int}), "f": frozenset({float, int})}
# simdjson reads a whole array of numbers into one buffer of this type, or refuses any other element.
_BUFFER_TYPES = {"i": ("i", np.int64), "u": ("u", np.uint64), "f": ("d", np.float64)}


def _array_from_json(
    name: str, datatype: DataType, shape: tuple[int, ...], data: Any, limits: RequestLimits
) -> np.ndarray[Any, Any]:
    """`data` as an array of `shape`. Nested lists are read in row-major order, as Triton reads them."""
    array = _array_from_buffer(data, datatype) if isinstance(data, simdjson.Array) else None
    if array is None:
        if isinstance(data, simdjson.Array):
            data = data.as_list()
        if not isinstance(data, list):
            raise TensorDataError(f"input '{name}': 'data' must be a list", tensor=name)
        array = (
            _bytes_from_json(name, data, limits)
            if datatype is DataType.BYTES
            else numbers_from_json(name, datatype, data)
        )
    count = element_count(shape)
    if array.size != count:
        raise TensorDataError(
            f"input '{name}': shape {list(shape)} holds {count} elements but 'data' has {array.size}",
            tensor=name,
            expected=f"{count} elements",
            actual=f"{array.size} elements",
        )
    check_element_count(name, count, limits)
    return array.reshape(shape)


def _array_from_buffer(data: Any, datatype: DataType) -> np.ndarray[Any, Any] | None:
    """The fast path for large bodies; None when some element does not fit, to let the checks below say why."""
    target = datatype.numpy_dtype
    if target.kind not in _BUFFER_TYPES:  # BOOL and BYTES take the list path
        return None
    buffer_type, buffer_dtype = _BUFFER_TYPES[target.kind]
    try:
        values = np.frombuffer(data.as_buffer(of_type=buffer_type), dtype=buffer_dtype)
    except (TypeError, ValueError):
        return None
    if _outside_range(values, target):
        return None
    with np.errstate(over="ignore"):  # past a float type's range: ±inf, as numbers_from_json makes it
        return values.astype(target)


def numbers_from_json(name: str, datatype: DataType, data: list[Any], where: str = "") -> np.ndarray[Any, Any]:
    """JSON numbers (a flat or nested list) as an array of `datatype`, checked: no strings, no
    floats for integers, no booleans among numbers, nothing outside an integer type's range (a
    number past a float type's range is ±inf, as a C cast and Triton make it). `where` names the
    data in errors (default: the v2 input's 'data')."""
    where = where or f"input '{name}': 'data'"
    if datatype is DataType.BF16:  # numpy reads no bfloat16: read float32, then round to it
        return numbers_from_json(name, DataType.FP32, data, where).astype(datatype.numpy_dtype)
    target = datatype.numpy_dtype
    if set(map(type, data)) <= _PLAIN_TYPES[target.kind]:
        # The flat list of plain numbers most clients send: one conversion, no checks to make.
        # A value the target cannot hold raises OverflowError (an integer), or a float past its
        # type's range warns (a RuntimeWarning where warnings are errors): the path below then
        # says which, or makes it ±inf without the warning. No np.errstate here: it costs a
        # microsecond, a few percent of a small model's whole request.
        try:
            return np.array(data, dtype=target)
        except (OverflowError, RuntimeWarning):
            pass
    if target.kind == "f":
        with np.errstate(over="ignore"):
            return _checked_numbers(name, datatype, data, where)
    return _checked_numbers(name, datatype, data, where)


def nested_numbers(data: list[Any], datatype: DataType, *, only_numbers: bool = False) -> np.ndarray[Any, Any] | None:
    """Nested lists of plain numbers (rows of rows: TF Serving's instances, a batch job's records)
    as an array of `datatype`, read by numpy at C speed, which also finds them rectangular; None
    when they are anything else (ragged, strings, booleans among numbers, integers past the
    target's range, floats for integers), which the checked path then names.
    `only_numbers`: the caller found their JSON text holds nothing but numbers, brackets and
    commas (no string, true, false or null), which spares a look at every value: a float target
    then takes them in one conversion."""
    if datatype is DataType.BF16:  # numpy reads no bfloat16: read float32, then round to it
        wide = nested_numbers(data, DataType.FP32, only_numbers=only_numbers)
        return None if wide is None else wide.astype(datatype.numpy_dtype)
    target = datatype.numpy_dtype
    if only_numbers and target.kind == "f":
        try:
            with np.errstate(over="ignore"):
                array = np.array(data, dtype=target)
        except (ValueError, TypeError, OverflowError):
            return None
        return array if array.ndim <= MAX_DIMS else None
    try:
        inferred = np.array(data)
    except (ValueError, TypeError, OverflowError):
        return None
    kind = inferred.dtype.kind
    if kind not in "iuf" or kind not in _ACCEPTED_KINDS[target.kind] or inferred.ndim > MAX_DIMS:
        return None
    if (not only_numbers and _holds_booleans(data)) or _outside_range(inferred, target):
        return None
    if target.kind == "f":
        with np.errstate(over="ignore"):
            return inferred.astype(target, copy=False)
    return inferred.astype(target, copy=False)


def _checked_numbers(name: str, datatype: DataType, data: list[Any], where: str) -> np.ndarray[Any, Any]:
    target = datatype.numpy_dtype
    try:
        inferred = np.array(data)
    except (ValueError, TypeError):
        data = list(leaves(data))
        inferred = np.array(data)
    if inferred.dtype.kind in "fO" and target.kind in "iu" and _all_integers(data):
        # numpy reads integers beyond int64 (UINT64's upper half) as floats or objects; keep them exact.
        inferred = np.array(data, dtype=object).reshape(-1)
    elif inferred.size and inferred.dtype.kind not in _ACCEPTED_KINDS[target.kind]:
        raise TensorDataError(
            f"{where} holds {_kind_name(inferred.dtype.kind)} but the datatype is {datatype.value}",
            tensor=name,
            expected=datatype.value,
        )
    elif target.kind != "b" and inferred.dtype.kind != "b" and _holds_booleans(data):
        # numpy turns true into 1 when numbers sit beside it; a number tensor takes numbers only.
        raise TensorDataError(
            f"{where} mixes booleans with numbers but the datatype is {datatype.value}",
            tensor=name,
            expected=datatype.value,
        )
    if _outside_range(inferred, target):
        info = np.iinfo(target)
        raise TensorDataError(
            f"{where} has a value outside {datatype.value}'s range [{info.min}, {info.max}]",
            tensor=name,
        )
    return inferred.astype(target, copy=False)


def _outside_range(values: np.ndarray[Any, Any], target: np.dtype[Any]) -> bool:
    """Whether an integer target cannot hold some value (always False for other targets)."""
    if target.kind not in "iu" or not values.size:
        return False
    info = np.iinfo(target)
    return bool(values.min() < info.min or values.max() > info.max)


def _holds_booleans(data: list[Any]) -> bool:
    # A set of the items' types: C speed on the flat lists clients send.
    types = set(map(type, data))
    if list in types:
        return bool in types or any(_holds_booleans(item) for item in data if type(item) is list)
    return bool in types


def _all_integers(data: list[Any]) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) for x in leaves(data))


def leaves(data: list[Any]) -> Iterator[Any]:
    """The non-list items of nested lists, in row-major order."""
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            yield item
        else:
            stack.pop()


def _bytes_from_json(name: str, data: list[Any], limits: RequestLimits) -> np.ndarray[Any, Any]:
    flat: list[bytes] = []
    for item in leaves(data):
        if not isinstance(item, str):
            raise TensorDataError(f"input '{name}': BYTES data must be strings, found {item!r}", tensor=name)
        flat.append(item.encode("utf-8"))
    return bytes_array(name, flat, limits)


def _kind_name(kind: str) -> str:
    return {"b": "booleans", "i": "integers", "u": "integers", "f": "floats", "U": "strings"}.get(kind, "mixed values")


def _json_data(tensor: Tensor) -> Any:
    """JSON-ready data, or None when it cannot be JSON (BYTES that are not UTF-8, and BF16, which
    Triton's clients read only binary): send it binary."""
    if tensor.datatype is DataType.BF16:
        return None
    if tensor.datatype is DataType.BYTES:
        try:
            return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in tensor.data.reshape(-1)]
        except UnicodeDecodeError:
            return None
    return np.ascontiguousarray(tensor.data).reshape(-1)


def _duration_json(duration: DurationStatistic) -> dict[str, int]:
    return {"count": duration.count, "ns": duration.ns}


def statistics_json(statistics: list[ModelStatistics]) -> dict[str, Any]:
    """Triton's statistics extension body."""
    return {
        "model_stats": [
            {
                "name": s.name,
                "version": s.version,
                "last_inference": s.last_inference_ms,
                "inference_count": s.inference_count,
                "execution_count": s.execution_count,
                "inference_stats": {
                    "success": _duration_json(s.success),
                    "fail": _duration_json(s.fail),
                    "queue": _duration_json(s.queue),
                    "compute_input": _duration_json(s.compute_input),
                    "compute_infer": _duration_json(s.compute_infer),
                    "compute_output": _duration_json(s.compute_output),
                    "cache_hit": _duration_json(s.cache_hit),
                    "cache_miss": _duration_json(s.cache_miss),
                },
                "batch_stats": [
                    {
                        "batch_size": b.batch_size,
                        "compute_input": _duration_json(b.compute_input),
                        "compute_infer": _duration_json(b.compute_infer),
                        "compute_output": _duration_json(b.compute_output),
                    }
                    for b in s.batches
                ],
            }
            for s in statistics
        ]
    }

"""The KServe v2 door's operations (`/v2/...`, Triton's HTTP API with its extensions), as OpenAPI
path items keyed by the route patterns of `server.kserve.KServeDoor.routes`."""

from __future__ import annotations

from inferd.server.openapi.build import (
    JSON,
    KSERVE,
    NUMBER,
    OCTETS,
    STRING_SCHEMA,
    Json,
    header_parameter,
    json_body,
    json_content,
    ok,
    operation,
    path_parameter,
    query_parameter,
    ref,
)
from inferd.server.openapi.schemas import (
    EXAMPLE_ENDPOINT,
    EXAMPLE_ENDPOINT_NAME,
    EXAMPLE_JOB,
    EXAMPLE_MODEL,
    EXAMPLE_ROLLOUT,
    V2_EXAMPLE,
    binary_example,
)

MODEL = path_parameter("model", "the model's name (its folder in the repository)", EXAMPLE_MODEL)
# /v2/models/stats is the statistics of every model: the metadata route cannot name a model "stats".
MODEL_NOT_STATS = path_parameter(
    "model", "the model's name", EXAMPLE_MODEL, {"type": "string", "minLength": 1, "not": {"const": "stats"}}
)
ENDPOINT = path_parameter("endpoint", "the endpoint's name (one of its own: no model's)", EXAMPLE_ENDPOINT_NAME)
VERSION = path_parameter("version", "a version number (a folder of the model's)", "1")
REGION = path_parameter("region", "the shared memory region's name", "input0_data")
HEADER_LENGTH = header_parameter(
    "Inference-Header-Content-Length",
    "the binary tensor data extension: the body is a JSON header of this many bytes, then each tensor's "
    "bytes (inputs with parameters.binary_data_size), in order",
    {"type": "integer", "minimum": 0},
)
TIMEOUT = ref("Inferd-Timeout-Ms", "parameters")
CONTENT_ENCODING = header_parameter(
    "Content-Encoding",
    "a compressed body (Inference-Header-Content-Length counts it uncompressed)",
    {"enum": ["gzip", "deflate", "identity"]},
)
ACCEPT_ENCODING = header_parameter("Accept-Encoding", "compress the answer: gzip, deflate (by q)", {"type": "string"})
SERVER_TIMING = ref("Inferd-Server-Timing", "parameters")

_NOT_READY = {"description": "not ready", "content": json_content(ref("Error"))}
_EMPTY_OK = ok("done (an empty body)")


def _infer_body() -> Json:
    body, header_length = binary_example()
    return {
        "required": True,
        "description": "A v2 request as JSON; or, with Inference-Header-Content-Length, its JSON header followed "
        f"by the tensors' bytes (the binary example's header is {header_length} bytes).",
        "content": {
            JSON: {"schema": ref("InferRequest"), "example": V2_EXAMPLE},
            OCTETS: {"schema": {"type": "string", "format": "binary"}, "example": body.decode("ascii")},
        },
    }


def _infer_ok() -> Json:
    return {
        "description": "the outputs: JSON, or (any output asked binary) a JSON header then the outputs' bytes",
        "headers": {
            "X-Request-ID": ref("X-Request-ID", "headers"),
            "Inference-Header-Content-Length": {
                "description": "with binary outputs: the JSON header's length",
                "schema": {"type": "integer", "minimum": 0},
            },
        },
        "content": {JSON: {"schema": ref("InferResponse")}, OCTETS: {"schema": {"type": "string", "format": "binary"}}},
    }


_JOB = path_parameter("job", "the job's inference id", EXAMPLE_JOB)
_SUBMIT_OPTIONS = [
    query_parameter("inference_id", "the job's id (a submit of an id that exists is that job)", STRING_SCHEMA),
    query_parameter("ttl_s", "expire the job if it has not started this many seconds after its submit", NUMBER),
    query_parameter("timeout_s", "fail the job if it runs longer (default 3600)", NUMBER),
    query_parameter("priority", "jobs of a higher priority run first (default 0)", {"type": "integer"}),
]


def _accepted() -> Json:
    return {
        "description": "kept: where its result (or failure document) will be, and where to ask",
        "headers": {"Location": {"description": "the status URL", "schema": {"type": "string"}}},
        "content": json_content(ref("AsyncJob")),
    }


def _infer_async_body() -> Json:
    body = _infer_body()
    body["description"] = (
        "A v2 request, inline (JSON, or binary with Inference-Header-Content-Length); or an object naming "
        "input_location, an object under one of the server's --async-input-root."
    )
    body["content"][JSON] = {
        "schema": {"oneOf": [ref("InferRequest"), ref("AsyncLocationRequest")]},
        "example": V2_EXAMPLE,
    }
    return body


def _async_routes() -> dict[str, Json]:
    return {
        "/v2/async": {
            "get": operation(
                KSERVE,
                "asyncJobList",
                "async jobs, newest first",
                {200: ok("the jobs", ref("AsyncJobs"))},
                (503,),
                parameters=[
                    query_parameter("model", "only this model's (or endpoint's)", STRING_SCHEMA),
                    query_parameter(
                        "state",
                        "only jobs in this state",
                        {"enum": ["queued", "running", "succeeded", "failed", "cancelled", "expired"]},
                    ),
                    query_parameter(
                        "limit", "at most this many (default 100)", {"type": "integer", "minimum": 1, "maximum": 1000}
                    ),
                ],
            )
        },
        "/v2/async/{job}": {
            "get": operation(
                KSERVE,
                "asyncJobGet",
                "an async job: its state, timings, locations and error",
                {200: ok("the job", ref("AsyncJob"))},
                (404, 503),
                parameters=[
                    _JOB,
                    query_parameter("wait_s", "wait up to this many seconds (120 at most) for its end", NUMBER),
                ],
            ),
            "delete": operation(
                KSERVE,
                "asyncJobCancel",
                "cancel a queued job (a running or ended one is a 409)",
                {200: ok("cancelled", ref("AsyncJob"))},
                (404, 409, 503),
                parameters=[_JOB],
            ),
        },
    }


def _model_routes(where: str, version: list[Json]) -> dict[str, Json]:
    """The routes of a model (`where` ""), or of one version of it (`where` "/versions/{version}")."""
    base = "/v2/models/{model}" + where
    suffix = "Version" if version else ""
    return {
        base: {
            "get": operation(
                KSERVE,
                f"modelMetadata{suffix}",
                "model metadata: inputs, outputs, versions",
                {200: ok("the model's metadata", ref("ModelMetadata"))},
                (404, 503, 507),
                parameters=[MODEL_NOT_STATS if not version else MODEL, *version],
            )
        },
        base + "/infer": {
            "post": operation(
                KSERVE,
                f"modelInfer{suffix}",
                "run the model on a request",
                {200: _infer_ok()},
                (404, 415, 503, 507),
                parameters=[MODEL, *version, HEADER_LENGTH, TIMEOUT, CONTENT_ENCODING, ACCEPT_ENCODING, SERVER_TIMING],
                body=_infer_body(),
            )
        },
        base + "/infer_async": {
            "post": operation(
                KSERVE,
                f"modelInferAsync{suffix}",
                "keep a request as an async job: answered at once; its one result is written later",
                {202: _accepted()},
                (403, 404, 503),
                parameters=[MODEL, *version, HEADER_LENGTH, *_SUBMIT_OPTIONS],
                body=_infer_async_body(),
            )
        },
        base + "/ready": {
            "get": operation(
                KSERVE,
                f"modelReady{suffix}",
                "whether the model can serve",
                {200: ok("ready"), 503: _NOT_READY},
                (404,),
                parameters=[MODEL, *version],
            )
        },
        base + "/stats": {
            "get": operation(
                KSERVE,
                f"modelStatistics{suffix}",
                "the model's statistics (Triton's statistics extension)",
                {200: ok("cumulative statistics of each ready version", ref("Statistics"))},
                (404,),
                parameters=[MODEL, *version],
            )
        },
        base + "/config": {
            "get": operation(
                KSERVE,
                f"modelConfig{suffix}",
                "the model's configuration as Triton's JSON",
                {200: ok("every field of config.pbtxt, completed from the model file", ref("ModelConfig"))},
                (404, 503),
                parameters=[MODEL, *version],
            )
        },
    }


def paths() -> dict[str, Json]:
    routes: dict[str, Json] = {
        "/v2": {
            "get": operation(
                KSERVE,
                "serverMetadata",
                "the server's name, version and extensions",
                {200: ok("server metadata", ref("ServerMetadata"))},
            )
        },
        "/v2/health/live": {
            "get": operation(KSERVE, "serverLive", "liveness", {200: ok("the server is live", ref("ServerLive"))})
        },
        "/v2/health/ready": {
            "get": operation(
                KSERVE,
                "serverReady",
                "readiness: start-up done (and, with --strict-readiness, every model ready)",
                {200: ok("ready", ref("ServerReady")), 503: _NOT_READY},
            )
        },
        "/v2/openapi.json": {
            "get": operation(
                KSERVE,
                "openapi",
                "this document: every REST route of the HTTP port",
                {200: ok("OpenAPI 3.1", {"type": "object", "required": ["openapi", "paths"]})},
            )
        },
        "/v2/models/stats": {
            "get": operation(
                KSERVE,
                "statistics",
                "statistics of every model",
                {200: ok("cumulative statistics of each ready version", ref("Statistics"))},
            )
        },
        **_model_routes("", []),
        **_model_routes("/versions/{version}", [VERSION]),
        **_async_routes(),
        "/v2/repository/index": {
            "post": operation(
                KSERVE,
                "repositoryIndex",
                "the models of the repository and their state",
                {200: ok("one entry per model version (a model with none: by name)", ref("RepositoryIndex"))},
                body=json_body(ref("RepositoryIndexRequest"), {"ready": True}, required=False),
            )
        },
        "/v2/repository/models/{model}/load": {
            "post": operation(
                KSERVE,
                "repositoryModelLoad",
                "load or reload a model (--model-control-mode explicit)",
                {200: _EMPTY_OK},
                (403, 404, 503, 507),
                parameters=[MODEL],
                body=json_body(ref("LoadRequest"), {"parameters": {}}, required=False),
            )
        },
        "/v2/repository/models/{model}/unload": {
            "post": operation(
                KSERVE,
                "repositoryModelUnload",
                "unload a model after its accepted requests are answered",
                {200: _EMPTY_OK},
                (404,),
                parameters=[MODEL],
                body=json_body(ref("UnloadRequest"), {"parameters": {"unload_dependents": False}}, required=False),
            )
        },
        "/v2/endpoints": {
            "get": operation(
                KSERVE,
                "endpointList",
                "every endpoint, as GET /v2/endpoints/{endpoint} shows it",
                {200: ok("the endpoints", ref("Endpoints"))},
            )
        },
        "/v2/endpoints/{endpoint}": {
            "get": operation(
                KSERVE,
                "endpointGet",
                "an endpoint: its variants and weights, and each variant's requests, errors and latency",
                {200: ok("the endpoint", ref("Endpoint"))},
                (404,),
                parameters=[ENDPOINT],
            ),
            "put": operation(
                KSERVE,
                "endpointSet",
                "set an endpoint: its variants (models or versions of one signature) and their weights",
                {200: ok("changed", ref("Endpoint")), 201: ok("made", ref("Endpoint"))},
                (409,),
                parameters=[ENDPOINT],
                body=json_body(ref("EndpointRequest"), EXAMPLE_ENDPOINT),
            ),
            "delete": operation(
                KSERVE, "endpointDelete", "delete an endpoint", {200: _EMPTY_OK}, (404,), parameters=[ENDPOINT]
            ),
        },
        "/v2/endpoints/{endpoint}/rollout": {
            "get": operation(
                KSERVE,
                "rolloutGet",
                "the endpoint's running rollout, else its last: step, state, every decision with its numbers",
                {200: ok("the rollout", ref("Rollout"))},
                (404,),
                parameters=[ENDPOINT],
            ),
            "post": operation(
                KSERVE,
                "rolloutStart",
                "start moving the endpoint's traffic to a variant by steps, judged against the baseline",
                {200: ok("started", ref("Rollout"))},
                (404,),
                parameters=[ENDPOINT],
                body=json_body(ref("RolloutRequest"), EXAMPLE_ROLLOUT),
            ),
        },
        "/v2/endpoints/{endpoint}/rollout/promote": {
            "post": operation(
                KSERVE,
                "rolloutPromote",
                "give the candidate all the traffic now",
                {200: ok("promoted", ref("Rollout"))},
                (404,),
                parameters=[ENDPOINT],
            )
        },
        "/v2/endpoints/{endpoint}/rollout/abort": {
            "post": operation(
                KSERVE,
                "rolloutAbort",
                "roll back now, to the weights before the rollout",
                {200: ok("rolled back", ref("Rollout"))},
                (404,),
                parameters=[ENDPOINT],
            )
        },
        "/v2/endpoints/{endpoint}/rollout/history": {
            "get": operation(
                KSERVE,
                "rolloutHistory",
                "the endpoint's ended rollouts, with their decisions",
                {200: ok("the rollouts", ref("Rollouts"))},
                (404,),
                parameters=[ENDPOINT],
            )
        },
        "/v2/systemsharedmemory/status": {
            "get": operation(
                KSERVE,
                "sharedMemoryStatus",
                "every registered system shared memory region",
                {200: ok("the regions", ref("SharedMemoryStatus"))},
            )
        },
        "/v2/systemsharedmemory/region/{region}/status": {
            "get": operation(
                KSERVE,
                "sharedMemoryRegionStatus",
                "one registered region",
                {200: ok("the region", ref("SharedMemoryStatus"))},
                (404,),
                parameters=[REGION],
            )
        },
        "/v2/systemsharedmemory/region/{region}/register": {
            "post": operation(
                KSERVE,
                "sharedMemoryRegister",
                "register a POSIX shared memory object of this host as a region",
                {200: _EMPTY_OK},
                (403, 409),
                parameters=[REGION],
                body=json_body(ref("SharedMemoryRegister"), {"key": "/input0_data", "offset": 0, "byte_size": 64}),
            )
        },
        "/v2/systemsharedmemory/unregister": {
            "post": operation(KSERVE, "sharedMemoryUnregisterAll", "unregister every region", {200: _EMPTY_OK}, (403,))
        },
        "/v2/systemsharedmemory/region/{region}/unregister": {
            "post": operation(
                KSERVE,
                "sharedMemoryUnregister",
                "unregister a region (an unknown name is not an error)",
                {200: _EMPTY_OK},
                (403,),
                parameters=[REGION],
            )
        },
        **_cuda_shared_memory_routes(),
    }
    return routes


def _cuda_shared_memory_routes() -> dict[str, Json]:
    """Triton's CUDA shared memory extension (`server.cuda_shared_memory`), for clients that clean
    up before they start: status and unregister answer no regions; register is always refused."""
    return {
        "/v2/cudasharedmemory/status": {
            "get": operation(
                KSERVE,
                "cudaSharedMemoryStatus",
                "every registered CUDA shared memory region: none (this server maps no GPU memory)",
                {200: ok("an empty list", ref("CudaSharedMemoryStatus"))},
            )
        },
        "/v2/cudasharedmemory/region/{region}/status": {
            "get": operation(
                KSERVE,
                "cudaSharedMemoryRegionStatus",
                "one CUDA region: never found",
                {},
                (404,),
                parameters=[REGION],
            )
        },
        "/v2/cudasharedmemory/region/{region}/register": {
            "post": operation(
                KSERVE,
                "cudaSharedMemoryRegister",
                "register a CUDA IPC handle: refused (400, Triton's 'GPUs not supported'); use system shared memory",
                {},
                (403,),
                parameters=[REGION],
                body=json_body(
                    ref("CudaSharedMemoryRegister"), {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 64}
                ),
            )
        },
        "/v2/cudasharedmemory/unregister": {
            "post": operation(
                KSERVE,
                "cudaSharedMemoryUnregisterAll",
                "unregister every CUDA region (there are none)",
                {200: _EMPTY_OK},
                (403,),
            )
        },
        "/v2/cudasharedmemory/region/{region}/unregister": {
            "post": operation(
                KSERVE,
                "cudaSharedMemoryUnregister",
                "unregister a CUDA region (an unknown name is not an error)",
                {200: _EMPTY_OK},
                (403,),
                parameters=[REGION],
            )
        },
    }

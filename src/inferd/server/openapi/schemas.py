"""The JSON Schemas of every door's bodies (the document's components.schemas), and example bodies.

Answers are described tightly (`additionalProperties: false` where inferd writes every field), so
a test that validates real answers against them notices a field added or renamed in a codec.
Requests are described as the codecs read them: fields they ignore are allowed, as they are on the
wire. Enumerations (datatypes, error codes) come from the code's own enums.

Examples name `add_sub` (Triton's two-input model: INPUT0 and INPUT1, FP32 [-1, 16], outputs
OUTPUT0 = sum and OUTPUT1 = difference; in examples/model_repository) and `sentence_embedding`
(the example repository's OpenAI embeddings model).
"""

from __future__ import annotations

from typing import Any

from inferd.errors import ErrorCode
from inferd.server.openapi.build import Json, ref
from inferd.types import DataType

EXAMPLE_MODEL = "add_sub"
EXAMPLE_EMBEDDING_MODEL = "sentence_embedding"
_ROW0 = [float(i) for i in range(16)]
_ROW1 = [1.0] * 16

STRING = {"type": "string"}
INTEGER = {"type": "integer"}
NATURAL = {"type": "integer", "minimum": 0}
ANY: Json = {}


def _object(properties: Json, required: tuple[str, ...] = (), *, closed: bool = False) -> Json:
    schema: Json = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if closed:
        schema["additionalProperties"] = False
    return schema


def _array(items: Json, **constraints: Any) -> Json:
    return {"type": "array", "items": items, **constraints}


# -- errors ---------------------------------------------------------------------------------------

_ERROR_FIELDS: dict[str, Json] = {
    "error": STRING,
    "code": ref("ErrorCode"),
    "tensor": STRING,
    "expected": STRING,
    "actual": STRING,
    "retry_after_ms": {"type": "number", "minimum": 0},
    "request_id": STRING,
}
ERROR = _object(_ERROR_FIELDS, ("error", "code", "request_id"), closed=True)
# SageMaker's doors: the same, with the message under `message` too (where botocore reads it).
SAGEMAKER_ERROR = _object({**_ERROR_FIELDS, "message": STRING}, ("error", "message", "code", "request_id"), closed=True)
OPENAI_ERROR = _object(
    {
        "error": _object(
            {
                "message": STRING,
                "type": {"enum": ["invalid_request_error", "server_error", "service_unavailable"]},
                "param": {"type": ["string", "null"]},
                "code": ref("ErrorCode"),
            },
            ("message", "type", "param", "code"),
            closed=True,
        ),
        "request_id": STRING,
    },
    ("error", "request_id"),
    closed=True,
)
TORCHSERVE_ERROR = _object(
    {"code": INTEGER, "type": STRING, "message": STRING, "error_code": ref("ErrorCode"), "request_id": STRING},
    ("code", "type", "message", "error_code", "request_id"),
    closed=True,
)

# -- KServe v2 ------------------------------------------------------------------------------------

TENSOR_METADATA = _object(
    {"name": STRING, "datatype": ref("DataType"), "shape": _array(INTEGER)}, ("name", "datatype", "shape"), closed=True
)
SERVER_METADATA = _object(
    {"name": STRING, "version": STRING, "extensions": _array(STRING)}, ("name", "version", "extensions"), closed=True
)
# The Open Inference Protocol's health bodies (KServe's SDK reads them; tritonclient reads the status).
SERVER_LIVE = _object({"live": {"const": True}}, ("live",), closed=True)
SERVER_READY = _object({"ready": {"const": True}}, ("ready",), closed=True)
MODEL_METADATA = _object(
    {
        "name": STRING,
        "versions": _array(STRING),
        "platform": STRING,
        "inputs": _array(ref("TensorMetadata")),
        "outputs": _array(ref("TensorMetadata")),
    },
    ("name", "versions", "platform", "inputs", "outputs"),
    closed=True,
)
DURATION = _object({"count": NATURAL, "ns": NATURAL}, ("count", "ns"), closed=True)
_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")
MODEL_STATISTICS = _object(
    {
        "name": STRING,
        "version": STRING,
        "last_inference": NATURAL,
        "inference_count": NATURAL,
        "execution_count": NATURAL,
        "inference_stats": _object({key: ref("Duration") for key in _DURATIONS}, _DURATIONS, closed=True),
        "batch_stats": _array(
            _object(
                {
                    "batch_size": NATURAL,
                    "compute_input": ref("Duration"),
                    "compute_infer": ref("Duration"),
                    "compute_output": ref("Duration"),
                },
                ("batch_size", "compute_input", "compute_infer", "compute_output"),
                closed=True,
            )
        ),
    },
    ("name", "version", "last_inference", "inference_count", "execution_count", "inference_stats", "batch_stats"),
    closed=True,
)
STATISTICS = _object({"model_stats": _array(ref("ModelStatistics"))}, ("model_stats",), closed=True)
# Triton's ModelConfig as JSON: every field of config.pbtxt; the ones every client reads are named.
MODEL_CONFIG = _object(
    {
        "name": STRING,
        "platform": STRING,
        "backend": STRING,
        "max_batch_size": NATURAL,
        "input": _array({"type": "object"}),
        "output": _array({"type": "object"}),
        "instance_group": _array({"type": "object"}),
        "parameters": {"type": "object"},
    },
    ("name", "platform", "backend", "max_batch_size", "input", "output"),
)
# Nested lists of numbers, booleans or strings, read in row-major order (as Triton reads them).
TENSOR_DATA = {"type": "array"}
TENSOR_PARAMETERS = _object(
    {
        "binary_data_size": {**NATURAL, "description": "the tensor's bytes follow the JSON header, in input order"},
        "binary_data": {"type": "boolean", "description": "an output: send it binary"},
        "classification": {**NATURAL, "description": "an output: its top N classes as 'score:index:label'"},
        "shared_memory_region": STRING,
        "shared_memory_byte_size": NATURAL,
        "shared_memory_offset": NATURAL,
    }
)
INFER_INPUT = _object(
    {
        "name": {"type": "string", "minLength": 1},
        "shape": _array(NATURAL),
        "datatype": ref("DataType"),
        "parameters": ref("TensorParameters"),
        "data": TENSOR_DATA,
    },
    ("name", "shape", "datatype"),
)
INFER_REQUEST = _object(
    {
        "id": STRING,
        "parameters": _object({"binary_data_output": {"type": "boolean"}}),
        "inputs": _array(ref("InferInput"), minItems=1),
        "outputs": _array(_object({"name": STRING, "parameters": ref("TensorParameters")}, ("name",))),
    },
    ("inputs",),
)
INFER_OUTPUT = _object(
    {
        "name": STRING,
        "datatype": ref("DataType"),
        "shape": _array(NATURAL),
        "data": TENSOR_DATA,
        "parameters": _object({"binary_data_size": NATURAL}, closed=True),
    },
    ("name", "datatype", "shape"),
    closed=True,
)
INFER_RESPONSE = _object(
    {"model_name": STRING, "model_version": STRING, "id": STRING, "outputs": _array(ref("InferOutput"))},
    ("model_name", "model_version", "outputs"),
    closed=True,
)
REPOSITORY_INDEX = _array(
    _object(
        {
            "name": STRING,
            "version": STRING,
            "state": STRING,
            "reason": STRING,
            "load_ms": _object(
                {"fetch": {"type": "number"}, "session": {"type": "number"}, "warmup": {"type": "number"}},
                ("fetch", "session", "warmup"),
                closed=True,
            ),
        },
        ("name",),
        closed=True,
    )
)
REPOSITORY_INDEX_REQUEST = _object({"ready": {"type": "boolean"}})
LOAD_REQUEST = _object(
    {
        "parameters": {
            **_object({"config": {"type": "string", "description": "the model configuration as JSON text"}}),
            # "file:<path>": a file of the model's folder, base64.
            "patternProperties": {"^file:": {"type": "string", "contentEncoding": "base64"}},
        }
    }
)
_VARIANT_NAME = {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"}
_VARIANT = {
    "name": _VARIANT_NAME,
    "model": {"type": "string", "minLength": 1, "description": "a model of the repository (not an endpoint)"},
    "version": {"type": ["string", "integer"], "description": "one of its versions; none: its newest ready one"},
    "weight": {"type": "number", "minimum": 0, "description": "relative to the others' (default 1)"},
}
_SHADOW = {
    "name": _VARIANT_NAME,
    "model": _VARIANT["model"],
    "version": _VARIANT["version"],
    "sample": {"type": "number", "exclusiveMinimum": 0, "maximum": 1, "description": "the share copied (default 1)"},
    "log": {"type": "boolean", "description": "keep compared pairs in --state-dir (JSON lines)"},
}
ENDPOINT_REQUEST = _object(
    {
        "variants": {**_array(_object(_VARIANT, ("name", "model"), closed=True)), "minItems": 1},
        "sticky": {"type": "string", "description": "a header whose value keeps a client on one variant"},
        "shadow": _array(_object(_SHADOW, ("name", "model"), closed=True)),
    },
    ("variants",),
    closed=True,
)
_OPTIONAL_MS = {"type": ["number", "null"]}
ENDPOINT = _object(
    {
        "name": _VARIANT_NAME,
        "sticky": STRING,
        "rollout": {
            "type": ["object", "null"],
            "description": "its running rollout, else its last, as GET /v2/endpoints/{endpoint}/rollout shows it",
        },
        "variants": _array(
            _object(
                {
                    **_VARIANT,
                    "version": STRING,
                    "requests_total": NATURAL,
                    "errors_total": NATURAL,
                    "last_minute": _object(
                        {
                            "requests": NATURAL,
                            "errors": NATURAL,
                            "error_rate": {"type": "number"},
                            "p50_ms": _OPTIONAL_MS,
                            "p99_ms": _OPTIONAL_MS,
                        },
                        ("requests", "errors", "error_rate", "p50_ms", "p99_ms"),
                    ),
                },
                ("name", "model", "version", "weight", "requests_total", "errors_total", "last_minute"),
            )
        ),
    },
    ("name", "variants"),
)
ENDPOINTS = _object({"endpoints": _array(ENDPOINT)}, ("endpoints",))
_DURATION = {"type": ["string", "number"], "description": 'seconds, or "90s", "5m", "20ms"'}
ROLLOUT_REQUEST = _object(
    {
        "to": {"type": "string", "description": "the variant that takes the traffic"},
        "strategy": {"type": "string", "description": "all-at-once, canary:P or linear:K (default canary:10)"},
        "bake": _DURATION,
        "min_requests": {"type": "integer", "minimum": 1},
        "max_error_rate_delta": {"type": "number", "minimum": 0, "maximum": 1},
        "max_p99_ratio": {"type": "number", "minimum": 1},
        "min_p99_delta": _DURATION,
        "webhook": {"type": "string", "description": "an outside alarm: a --rollout-webhook NAME the server has"},
    },
    ("to",),
    closed=True,
)
ROLLOUT = _object(
    {
        "endpoint": STRING,
        "candidate": STRING,
        "baseline": STRING,
        "strategy": STRING,
        "state": {"enum": ["running", "paused", "promoted", "rolled-back", "aborted"]},
        "step": NATURAL,
        "steps": _array({"type": "number"}),
        "share": {"type": ["number", "null"]},
        "decisions": _array(
            _object(
                {"at": STRING, "step": NATURAL, "action": STRING, "message": STRING},
                ("at", "step", "action", "message"),
            )
        ),
    },
    ("endpoint", "candidate", "baseline", "strategy", "state", "step", "steps", "decisions"),
)
ROLLOUTS = _object({"rollouts": _array(ROLLOUT)}, ("rollouts",))
EXAMPLE_ROLLOUT = {"to": "green", "strategy": "canary:10", "bake": "5m"}
EXAMPLE_JOB = "order-17"
EXAMPLE_ENDPOINT_NAME = "shop"
EXAMPLE_ENDPOINT = {
    "variants": [
        {"name": "blue", "model": EXAMPLE_MODEL, "version": "1", "weight": 90},
        {"name": "green", "model": EXAMPLE_MODEL, "version": "1", "weight": 10},
    ]
}
_JOB_STATE = {"enum": ["queued", "running", "succeeded", "failed", "cancelled", "expired"]}
_SECONDS = {"type": "number", "exclusiveMinimum": 0}
ASYNC_LOCATION_REQUEST = _object(
    {
        "input_location": {
            "type": "string",
            "description": "a file:// or s3:// URL under one of the server's --async-input-root",
        },
        "content_type": {"type": "string", "description": "the object's type (default application/json)"},
        "inference_header_content_length": {"type": "integer", "minimum": 0},
        "inference_id": STRING,
        "ttl_s": _SECONDS,
        "timeout_s": _SECONDS,
        "priority": INTEGER,
    },
    ("input_location",),
    closed=True,
)
ASYNC_JOB = _object(
    {
        "inference_id": STRING,
        "model": STRING,
        "version": STRING,
        "state": _JOB_STATE,
        "status_url": STRING,
        "output_location": STRING,
        "failure_location": STRING,
        "submitted_at": STRING,
        "started_at": STRING,
        "ended_at": STRING,
        "run_s": {"type": "number"},
        "attempts": NATURAL,
        "priority": INTEGER,
        "ttl_s": {"type": "number"},
        "timeout_s": {"type": "number"},
        "error": STRING,
        "error_code": STRING,
        "dead_lettered": {"type": "boolean"},
        "created": {"type": "boolean", "description": "on a submit: false when a job of this id was there already"},
    },
    ("inference_id", "model", "state", "status_url", "output_location", "failure_location", "submitted_at",
     "attempts", "priority"),
)  # fmt: skip
ASYNC_JOBS = _object({"jobs": _array(ASYNC_JOB)}, ("jobs",))
UNLOAD_REQUEST = _object({"parameters": _object({"unload_dependents": {"type": "boolean"}})})
SHM_REGISTER = _object(
    {"key": {"type": "string", "minLength": 1}, "offset": NATURAL, "byte_size": NATURAL}, ("key", "byte_size")
)
SHM_STATUS = _array(
    _object(
        {"name": STRING, "key": STRING, "offset": NATURAL, "byte_size": NATURAL},
        ("name", "key", "offset", "byte_size"),
        closed=True,
    )
)
# Triton's CUDA shared memory extension: served without GPU registration (no region is ever listed).
CUDA_SHM_REGISTER = _object(
    {"raw_handle": _object({"b64": STRING}, ("b64",)), "device_id": NATURAL, "byte_size": NATURAL},
    ("raw_handle", "device_id", "byte_size"),
)
CUDA_SHM_STATUS = _array(
    _object(
        {"name": STRING, "device_id": NATURAL, "byte_size": NATURAL}, ("name", "device_id", "byte_size"), closed=True
    ),
    maxItems=0,
)

# -- TF Serving REST ------------------------------------------------------------------------------

_SIGNATURE = {"type": "string", "description": "'serving_default' (or empty): inferd models have one signature"}
PREDICT_REQUEST = {
    **_object({"signature_name": _SIGNATURE, "instances": _array(ANY, minItems=1), "inputs": ANY}),
    "description": 'exactly one of "instances" (row format) or "inputs" (columnar format)',
    "oneOf": [{"required": ["instances"]}, {"required": ["inputs"]}],
}
PREDICT_RESPONSE = {
    "oneOf": [
        _object({"predictions": _array(ANY)}, ("predictions",), closed=True),
        _object({"outputs": ANY}, ("outputs",), closed=True),
    ]
}
MODEL_STATUS = _object(
    {
        "model_version_status": _array(
            _object(
                {
                    "version": STRING,
                    "state": {"enum": ["UNKNOWN", "START", "LOADING", "AVAILABLE", "UNLOADING", "END"]},
                    "status": _object(
                        {"error_code": STRING, "error_message": STRING}, ("error_code", "error_message"), closed=True
                    ),
                },
                ("version", "state", "status"),
                closed=True,
            )
        )
    },
    ("model_version_status",),
    closed=True,
)
_TENSOR_INFO = _object(
    {
        "dtype": STRING,
        "tensor_shape": _object(
            {
                "dim": _array(_object({"size": STRING, "name": STRING}, ("size", "name"), closed=True)),
                "unknown_rank": {"type": "boolean"},
            },
            ("dim", "unknown_rank"),
            closed=True,
        ),
        "name": STRING,
    },
    ("dtype", "tensor_shape", "name"),
    closed=True,
)
_SIGNATURE_DEF = _object(
    {
        "inputs": {"type": "object", "additionalProperties": _TENSOR_INFO},
        "outputs": {"type": "object", "additionalProperties": _TENSOR_INFO},
        "method_name": STRING,
    },
    ("inputs", "outputs", "method_name"),
    closed=True,
)
SIGNATURE_METADATA = _object(
    {
        "model_spec": _object(
            {"name": STRING, "signature_name": STRING, "version": STRING},
            ("name", "signature_name", "version"),
            closed=True,
        ),
        "metadata": _object(
            {
                "signature_def": _object(
                    {"signature_def": _object({"serving_default": _SIGNATURE_DEF}, ("serving_default",), closed=True)},
                    ("signature_def",),
                    closed=True,
                )
            },
            ("signature_def",),
            closed=True,
        ),
    },
    ("model_spec", "metadata"),
    closed=True,
)

# -- SageMaker, TorchServe, OpenAI ----------------------------------------------------------------

PING = _object({"status": {"enum": ["Healthy", "Unhealthy"]}}, ("status",), closed=True)
SAGEMAKER_MODEL = _object({"modelName": STRING, "modelUrl": STRING}, ("modelName", "modelUrl"), closed=True)
SAGEMAKER_MODELS = _object({"models": _array(ref("SageMakerModel"))}, ("models",), closed=True)
SAGEMAKER_LOAD = _object(
    {"model_name": {"type": "string", "minLength": 1}, "url": {"type": "string", "minLength": 1}},
    ("model_name", "url"),
)
NON_EMPTY_TEXT = {"type": "string", "minLength": 1}  # OpenAI's API refuses an empty text
EMBEDDINGS_REQUEST = _object(
    {
        "model": {"type": "string", "minLength": 1},
        "input": {
            "oneOf": [NON_EMPTY_TEXT, _array(NON_EMPTY_TEXT, minItems=1, maxItems=2048)],
            "description": "a text or a list of texts, none empty (token ids are refused: the model tokenizes "
            "its own text)",
        },
        "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "minimum": 1},
        "user": STRING,
    },
    ("model", "input"),
)
EMBEDDINGS_RESPONSE = _object(
    {
        "object": {"const": "list"},
        "data": _array(
            _object(
                {
                    "object": {"const": "embedding"},
                    "index": NATURAL,
                    "embedding": {
                        "oneOf": [_array({"type": "number"}), {"type": "string", "contentEncoding": "base64"}]
                    },
                },
                ("object", "index", "embedding"),
                closed=True,
            )
        ),
        "model": STRING,
        "usage": _object(
            {"prompt_tokens": NATURAL, "total_tokens": NATURAL}, ("prompt_tokens", "total_tokens"), closed=True
        ),
    },
    ("object", "data", "model", "usage"),
    closed=True,
)
TORCHSERVE_MODELS = _object(
    {"models": _array(ref("SageMakerModel")), "nextPageToken": {"type": "string", "pattern": "^[0-9]+$"}},
    ("models",),
    closed=True,
)
TORCHSERVE_WORKER = _object({"id": STRING, "status": {"enum": ["READY", "UNLOADING"]}, "gpu": {"type": "boolean"}},
                            ("id", "status", "gpu"), closed=True)  # fmt: skip
TORCHSERVE_MODEL = _object(
    {
        "modelName": STRING,
        "modelVersion": STRING,
        "modelUrl": STRING,
        "runtime": STRING,
        "minWorkers": NATURAL,
        "maxWorkers": NATURAL,
        "batchSize": {"type": "integer", "minimum": 1},
        "maxBatchDelay": {"type": "number", "minimum": 0},
        "loadedAtStartup": {"type": "boolean"},
        "workers": _array(ref("TorchServeWorker")),
    },
    ("modelName", "modelVersion", "modelUrl", "runtime", "minWorkers", "maxWorkers", "batchSize", "maxBatchDelay",
     "loadedAtStartup", "workers"),
    closed=True,
)  # fmt: skip
OPENAI_MODEL = _object(
    {"id": STRING, "object": {"const": "model"}, "created": INTEGER, "owned_by": STRING},
    ("id", "object", "created", "owned_by"),
    closed=True,
)
OPENAI_MODELS = _object(
    {"object": {"const": "list"}, "data": _array(ref("OpenAIModel"))}, ("object", "data"), closed=True
)

SCHEMAS: Json = {
    "DataType": {"type": "string", "enum": [datatype.value for datatype in DataType]},
    "ErrorCode": {"type": "string", "enum": [code.value for code in ErrorCode]},
    "Error": ERROR,
    "SageMakerError": SAGEMAKER_ERROR,
    "OpenAIError": OPENAI_ERROR,
    "TorchServeError": TORCHSERVE_ERROR,
    "TensorMetadata": TENSOR_METADATA,
    "ServerMetadata": SERVER_METADATA,
    "ServerLive": SERVER_LIVE,
    "ServerReady": SERVER_READY,
    "ModelMetadata": MODEL_METADATA,
    "Duration": DURATION,
    "ModelStatistics": MODEL_STATISTICS,
    "Statistics": STATISTICS,
    "ModelConfig": MODEL_CONFIG,
    "TensorParameters": TENSOR_PARAMETERS,
    "InferInput": INFER_INPUT,
    "InferRequest": INFER_REQUEST,
    "InferOutput": INFER_OUTPUT,
    "InferResponse": INFER_RESPONSE,
    "RepositoryIndex": REPOSITORY_INDEX,
    "RepositoryIndexRequest": REPOSITORY_INDEX_REQUEST,
    "LoadRequest": LOAD_REQUEST,
    "UnloadRequest": UNLOAD_REQUEST,
    "EndpointRequest": ENDPOINT_REQUEST,
    "Endpoint": ENDPOINT,
    "Endpoints": ENDPOINTS,
    "RolloutRequest": ROLLOUT_REQUEST,
    "Rollout": ROLLOUT,
    "Rollouts": ROLLOUTS,
    "AsyncLocationRequest": ASYNC_LOCATION_REQUEST,
    "AsyncJob": ASYNC_JOB,
    "AsyncJobs": ASYNC_JOBS,
    "SharedMemoryRegister": SHM_REGISTER,
    "SharedMemoryStatus": SHM_STATUS,
    "CudaSharedMemoryRegister": CUDA_SHM_REGISTER,
    "CudaSharedMemoryStatus": CUDA_SHM_STATUS,
    "PredictRequest": PREDICT_REQUEST,
    "PredictResponse": PREDICT_RESPONSE,
    "ModelStatus": MODEL_STATUS,
    "SignatureMetadata": SIGNATURE_METADATA,
    "Ping": PING,
    "SageMakerModel": SAGEMAKER_MODEL,
    "SageMakerModels": SAGEMAKER_MODELS,
    "SageMakerLoad": SAGEMAKER_LOAD,
    "EmbeddingsRequest": EMBEDDINGS_REQUEST,
    "EmbeddingsResponse": EMBEDDINGS_RESPONSE,
    "TorchServeModels": TORCHSERVE_MODELS,
    "TorchServeWorker": TORCHSERVE_WORKER,
    "TorchServeModel": TORCHSERVE_MODEL,
    "OpenAIModel": OPENAI_MODEL,
    "OpenAIModels": OPENAI_MODELS,
}

# -- examples -------------------------------------------------------------------------------------

V2_EXAMPLE = {
    "id": "example-1",
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": _ROW0},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": _ROW1},
    ],
    "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}],
}
ROW_EXAMPLE = {"instances": [{"INPUT0": _ROW0, "INPUT1": _ROW1}]}
COLUMN_EXAMPLE = {"INPUT0": [_ROW0], "INPUT1": [_ROW1]}
EMBEDDINGS_EXAMPLE = {
    "model": EXAMPLE_EMBEDDING_MODEL,
    "input": ["A man is playing a guitar."],
    "encoding_format": "float",
}


def binary_example() -> tuple[bytes, int]:
    """A v2 request with both inputs in the binary extension, and its JSON header's length (the
    Inference-Header-Content-Length). The floats are chosen so their bytes are ASCII ('AAAA' is
    12.078431), which lets the example be text in a JSON document."""
    import orjson

    header = orjson.dumps(
        {
            "inputs": [
                {"name": name, "datatype": "FP32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}
                for name in ("INPUT0", "INPUT1")
            ]
        }
    )
    return header + b"AAAA" * 16 + b"BBBB" * 16, len(header)

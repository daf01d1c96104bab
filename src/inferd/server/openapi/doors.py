"""The operations of the other doors on the HTTP port: TF Serving REST (`/v1/models/...`), SageMaker
(`/ping`, `/invocations`, and with --sagemaker the multi-model routes), TorchServe's inference API
(`/predictions/...`) and OpenAI's embeddings (`/openai/v1/...`), keyed by their route patterns; and
TorchServe's management API, which listens on a port of its own (`torchserve_management_paths`)."""

from __future__ import annotations

from inferd.protocol import sagemaker
from inferd.server.openapi.build import (
    JSON,
    OCTETS,
    OPENAI,
    SAGEMAKER,
    TFSERVING,
    TORCHSERVE,
    Json,
    header_parameter,
    json_body,
    json_content,
    ok,
    operation,
    path_parameter,
    ref,
)
from inferd.server.openapi.schemas import (
    COLUMN_EXAMPLE,
    EMBEDDINGS_EXAMPLE,
    EXAMPLE_EMBEDDING_MODEL,
    EXAMPLE_MODEL,
    ROW_EXAMPLE,
)

MODEL = path_parameter("model", "the model's name", EXAMPLE_MODEL)
INTEGER_TEXT = {"type": "string", "pattern": "^-?[0-9]+$"}
VERSION = path_parameter("version", "a version number", "1", {"type": "string", "pattern": "^[0-9]+$"})
LABEL = path_parameter("label", "a version label of the model's 'version_labels' parameter", "stable")
TIMEOUT = ref("Inferd-Timeout-Ms", "parameters")
_BYTES = {"type": "string", "format": "binary"}


def tfserving_paths() -> dict[str, Json]:
    """The same five routes for the newest version, a version by number and one by label."""
    routes: dict[str, Json] = {}
    for where, parameters, suffix in (
        ("", [MODEL], ""),
        ("/versions/{version}", [MODEL, VERSION], "Version"),
        ("/labels/{label}", [MODEL, LABEL], "Label"),
    ):
        base = "/v1/models/{model}" + where
        routes[base] = {
            "get": operation(
                TFSERVING,
                f"tfModelStatus{suffix}",
                "the state of each version (a label: of every version)",
                {200: ok("GetModelStatus as REST shows it", ref("ModelStatus"))},
                (404,),
                parameters=parameters,
            )
        }
        routes[base + "/metadata"] = {
            "get": operation(
                TFSERVING,
                f"tfModelMetadata{suffix}",
                "the model's one signature, serving_default",
                {200: ok("GetModelMetadata as REST shows it", ref("SignatureMetadata"))},
                (404, 503, 429),
                parameters=parameters,
            )
        }
        routes[base + ":predict"] = {
            "post": operation(
                TFSERVING,
                f"tfPredict{suffix}",
                "predict, row (instances) or columnar (inputs) format",
                {200: ok("predictions (row format) or outputs (columnar)", ref("PredictResponse"))},
                (404, 503, 429),
                parameters=[*parameters, TIMEOUT],
                body=json_body(ref("PredictRequest"), ROW_EXAMPLE),
            )
        }
        for verb in ("classify", "regress"):
            routes[f"{base}:{verb}"] = {
                "post": operation(
                    TFSERVING,
                    f"tf{verb.title()}{suffix}",
                    f"{verb}: not served (501, as TF Serving answers it for models without Example-based signatures)",
                    {},
                    (501,),
                    parameters=parameters,
                    body=json_body({"type": "object"}, {"examples": [{"x": [1.0]}]}),
                )
            }
    return routes


TARGET_MODEL = header_parameter(
    "X-Amzn-SageMaker-Target-Model",
    "the model to run (a trailing .tar.gz is ignored); else the default model, else the one loaded",
    {"type": "string"},
    EXAMPLE_MODEL,
)
ACCEPT = header_parameter("Accept", "the answer's type", {"enum": [*sagemaker.ANSWERS, "*/*"]})


def _invocation_body() -> Json:
    return {
        "required": True,
        "description": "a v2 or TF Serving JSON body; or one array (the model's single input) as .npy or CSV; "
        f"or Triton's {sagemaker.TRITON_BINARY};{sagemaker.HEADER_SIZE_PARAMETER}=N (a v2 JSON header of N bytes, "
        "then binary tensors)",
        "content": {
            JSON: {"schema": {"anyOf": [ref("InferRequest"), ref("PredictRequest")]}, "example": ROW_EXAMPLE},
            sagemaker.CSV: {"schema": {"type": "string"}},
            sagemaker.NPY: {"schema": _BYTES},
            sagemaker.TRITON_BINARY: {"schema": _BYTES},
        },
    }


def _invocation_ok() -> Json:
    return {
        "description": "JSON (v2 for a v2 body, else TF Serving's predictions), or the one output as .npy or CSV",
        "headers": {"X-Request-ID": ref("X-Request-ID", "headers")},
        "content": {
            JSON: {"schema": {"anyOf": [ref("InferResponse"), ref("PredictResponse")]}},
            sagemaker.CSV: {"schema": {"type": "string"}},
            sagemaker.NPY: {"schema": _BYTES},
        },
    }


def _invocation(operation_id: str, summary: str, parameters: list[Json]) -> Json:
    return operation(
        SAGEMAKER,
        operation_id,
        summary,
        {200: _invocation_ok()},
        (404, 406, 415, 503, 507),
        parameters=[*parameters, ACCEPT, TIMEOUT],
        body=_invocation_body(),
    )


def sagemaker_paths(*, multi_model: bool) -> dict[str, Json]:
    """/ping and /invocations; with `multi_model` (--sagemaker) the multi-model endpoint routes too."""
    routes: dict[str, Json] = {
        "/ping": {
            "get": operation(
                SAGEMAKER,
                "ping",
                "health, as SageMaker (and TorchServe) check it",
                {
                    200: ok("ready", ref("Ping"), {"status": "Healthy"}),
                    503: {"description": "not ready", "content": json_content(ref("Ping"), {"status": "Unhealthy"})},
                },
            )
        },
        "/invocations": {"post": _invocation("invocations", "run the target model", [TARGET_MODEL])},
    }
    if not multi_model:
        return routes
    endpoint = path_parameter("endpoint", "the endpoint's name (not read: boto3's path for local testing)", "local")
    loaded = path_parameter("model", "a model loaded by POST /models", "mme_add_sub")
    missing = (404,)
    routes.update(
        {
            "/endpoints/{endpoint}/invocations": {
                "post": _invocation("endpointInvocations", "run the target model", [endpoint, TARGET_MODEL])
            },
            "/endpoints/{endpoint}/async-invocations": {
                "post": operation(
                    SAGEMAKER,
                    "endpointAsyncInvocations",
                    "keep an async invocation of the object at X-Amzn-SageMaker-InputLocation (boto3's "
                    "invoke_endpoint_async): answered at once, its one result written later",
                    {
                        202: {
                            "description": "kept: its id; where its result or failure document will be",
                            "headers": {
                                "X-Amzn-SageMaker-OutputLocation": {"schema": {"type": "string"}},
                                "X-Amzn-SageMaker-FailureLocation": {"schema": {"type": "string"}},
                            },
                            "content": json_content(
                                {"type": "object", "properties": {"InferenceId": {"type": "string"}}}
                            ),
                        }
                    },
                    (403, 404, 503),
                    parameters=[
                        path_parameter("endpoint", "an inferd endpoint's name, else the target model's", "local"),
                        TARGET_MODEL,
                        header_parameter(
                            "X-Amzn-SageMaker-InputLocation",
                            "the input: an s3:// or file:// URL under one of the server's --async-input-root",
                            {"type": "string"},
                        ),
                        header_parameter("X-Amzn-SageMaker-Content-Type", "the input's type", {"type": "string"}),
                        header_parameter("X-Amzn-SageMaker-Accept", "the result's type", {"type": "string"}),
                        header_parameter("X-Amzn-SageMaker-Inference-Id", "the job's id", {"type": "string"}),
                        header_parameter(
                            "X-Amzn-SageMaker-RequestTTLSeconds", "expire it if not started by then", {"type": "string"}
                        ),
                        header_parameter(
                            "X-Amzn-SageMaker-InvocationTimeoutSeconds", "fail it if it runs longer", {"type": "string"}
                        ),
                    ],
                )
            },
            "/models": {
                "get": operation(
                    SAGEMAKER,
                    "listModels",
                    "the models loaded by POST /models",
                    {200: ok("the models", ref("SageMakerModels"))},
                ),
                "post": operation(
                    SAGEMAKER,
                    "loadModel",
                    "load the model in a folder under --sagemaker-model-root",
                    {200: ok("loaded (an empty body)")},
                    (409, 503, 507),
                    body=json_body(
                        ref("SageMakerLoad"), {"model_name": "mme_add_sub", "url": "/opt/ml/models/mme_add_sub/model"}
                    ),
                ),
            },
            "/models/{model}": {
                "get": operation(
                    SAGEMAKER,
                    "describeModel",
                    "a model loaded by POST /models",
                    {200: ok("the model", ref("SageMakerModel"))},
                    missing,
                    parameters=[loaded],
                ),
                "delete": operation(
                    SAGEMAKER,
                    "unloadModel",
                    "unload a model loaded by POST /models",
                    {200: ok("unloaded (an empty body)")},
                    missing,
                    parameters=[loaded],
                ),
            },
            "/models/{model}/invoke": {
                "post": _invocation("invokeModel", "run a model loaded by POST /models", [loaded])
            },
        }
    )
    return routes


def _prediction(operation_id: str, parameters: list[Json]) -> Json:
    return operation(
        TORCHSERVE,
        operation_id,
        "run the model: a JSON body (v2, or values naming inputs), or any other body as "
        "one element of the model's BYTES input; a body without a Content-Type (curl -T) goes to "
        "that input too, and is read as JSON only by a model without one",
        {
            200: {
                "description": "the single output's value, or an object naming each output",
                "headers": {"X-Request-ID": ref("X-Request-ID", "headers")},
                "content": json_content({}),
            }
        },
        (404, 503, 507),
        parameters=[*parameters, TIMEOUT],
        body={
            "required": True,
            "content": {JSON: {"schema": {}, "example": COLUMN_EXAMPLE}, OCTETS: {"schema": _BYTES}},
        },
    )


def torchserve_paths() -> dict[str, Json]:
    routes: dict[str, Json] = {}
    for path, parameters, suffix in (
        ("/predictions/{model}", [MODEL], ""),
        ("/predictions/{model}/{version}", [MODEL, VERSION], "Version"),
    ):
        routes[path] = {
            "post": _prediction(f"predictions{suffix}", parameters),
            "put": _prediction(f"predictionsPut{suffix}", parameters),
        }
    return routes


def torchserve_management_paths(document_path: str) -> dict[str, Json]:
    """The routes of the TorchServe management port (--torchserve-management-port), its own API
    description (`document_path`) included."""
    all_versions = path_parameter(
        "version", "a version number, or all", "1", {"type": "string", "pattern": "^([0-9]+|all)$"}
    )
    describe = ok(
        "the model's default version (or the version asked, or all)", {"type": "array", "items": ref("TorchServeModel")}
    )
    query = [
        {"name": "limit", "in": "query", "description": "models a page (1-100; default 100)", "schema": INTEGER_TEXT},
        {"name": "next_page_token", "in": "query", "description": "where the page starts", "schema": INTEGER_TEXT},
    ]
    return {
        "/models": {
            "get": operation(
                TORCHSERVE,
                "listModels",
                "the models, a page at a time",
                {200: ok("a page of models", ref("TorchServeModels"))},
                parameters=query,
            )
        },
        "/models/{model}": {
            "get": operation(
                TORCHSERVE,
                "describeModel",
                "a model as TorchServe describes it",
                {200: describe},
                (404,),
                parameters=[MODEL],
            )
        },
        "/models/{model}/{version}": {
            "get": operation(
                TORCHSERVE,
                "describeModelVersion",
                "a version of a model, or all of them",
                {200: describe},
                (404,),
                parameters=[MODEL, all_versions],
            )
        },
        document_path: {
            "get": operation(
                TORCHSERVE,
                "apiDescription",
                "this document",
                {200: ok("the OpenAPI document of this port", {"type": "object"})},
            )
        },
    }


def openai_paths() -> dict[str, Json]:
    embedding_model = path_parameter("model", "a model that declares embedding_input", EXAMPLE_EMBEDDING_MODEL)
    return {
        "/openai/v1/embeddings": {
            "post": operation(
                OPENAI,
                "createEmbeddings",
                "embeddings of one text or many (batched with every door's traffic)",
                {
                    200: {
                        "description": "one vector per text, in order",
                        "headers": {"X-Request-ID": ref("X-Request-ID", "headers")},
                        "content": json_content(ref("EmbeddingsResponse")),
                    }
                },
                (404, 503, 507),
                parameters=[TIMEOUT],
                body=json_body(ref("EmbeddingsRequest"), EMBEDDINGS_EXAMPLE),
            )
        },
        "/openai/v1/models": {
            "get": operation(
                OPENAI,
                "listEmbeddingModels",
                "the ready models that serve embeddings",
                {200: ok("the models", ref("OpenAIModels"))},
            )
        },
        "/openai/v1/models/{model}": {
            "get": operation(
                OPENAI,
                "describeEmbeddingModel",
                "a model that serves embeddings",
                {200: ok("the model", ref("OpenAIModel"))},
                (404, 503),
                parameters=[embedding_model],
            )
        },
    }

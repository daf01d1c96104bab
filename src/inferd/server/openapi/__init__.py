"""The OpenAPI 3.1 document of every REST route on the HTTP port, served at `GET /v2/openapi.json`.

It is built in Python rather than kept as a JSON file: the enumerations in it (datatypes, error
codes) and each door's error answers per status come from the code's own enums and status tables
(`protocol.status`), so those parts cannot drift; the rest (paths, bodies, examples) is plain data
in `kserve`, `doors` and `schemas`. A test checks its paths and methods against the route table
(`server.app.build_router`) in both configurations, and validates real answers against it.

TorchServe's management API listens on a port of its own: its document (`management_document`)
is served there, at TorchServe's `GET /api-description`.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from inferd import __version__
from inferd.server.auth import Access, AccessPolicy
from inferd.server.openapi.build import Json, error_responses, header_parameter, ref
from inferd.server.openapi.doors import (
    openai_paths,
    sagemaker_paths,
    tfserving_paths,
    torchserve_management_paths,
    torchserve_paths,
)
from inferd.server.openapi.kserve import paths as kserve_paths
from inferd.server.openapi.schemas import SCHEMAS

OPENAPI_PATH = "/v2/openapi.json"
# Where TorchServe serves its API description; inferd's management port serves its document there.
MANAGEMENT_DOCUMENT_PATH = "/api-description"

_DESCRIPTION = """\
inferd's REST API: KServe v2 (Triton's HTTP API and its extensions), TF Serving's REST API,
SageMaker's hosting contract, TorchServe's inference API and OpenAI-compatible embeddings, on one
port. Each door answers errors in its own clients' shape, with inferd's machine-readable error
code in it. HEAD is served wherever GET is. The examples name `add_sub` (INPUT0 and INPUT1, FP32
[-1, 16]) and `sentence_embedding`, models of inferd's example repository."""
_MANAGEMENT_DESCRIPTION = """\
inferd's TorchServe management port (--torchserve-management-port): TorchServe's management API
for listing and describing models (loading and unloading go through the repository API on the
HTTP port). Errors come in TorchServe's shape, with inferd's machine-readable error code in it."""


def document(
    *,
    sagemaker_multi_model: bool,
    access: Mapping[tuple[str, str], Access] | None = None,
    policy: AccessPolicy | None = None,
) -> Json:
    """The document of a server started with (`sagemaker_multi_model`) or without --sagemaker;
    with `policy` (its tokens) and each route's `access` by (METHOD, path), what asks for a token."""
    paths = {
        **kserve_paths(),
        **tfserving_paths(),
        **sagemaker_paths(multi_model=sagemaker_multi_model),
        **torchserve_paths(),
        **openai_paths(),
    }
    return _document("inferd", _DESCRIPTION, paths, access, policy)


def management_document(
    *, access: Mapping[tuple[str, str], Access] | None = None, policy: AccessPolicy | None = None
) -> Json:
    """The document of the TorchServe management port."""
    paths = torchserve_management_paths(MANAGEMENT_DOCUMENT_PATH)
    return _document("inferd TorchServe management", _MANAGEMENT_DESCRIPTION, paths, access, policy)


def _document(
    title: str,
    description: str,
    paths: Json,
    access: Mapping[tuple[str, str], Access] | None,
    policy: AccessPolicy | None,
) -> Json:
    built: Json = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": __version__, "description": description},
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "responses": error_responses(),
            "parameters": {
                "X-Request-ID": header_parameter(
                    "X-Request-ID",
                    "the request's id in logs, answers and errors (else the v2 id, else a new one)",
                    {"type": "string"},
                ),
                "Inferd-Timeout-Ms": header_parameter(
                    "Inferd-Timeout-Ms",
                    "the client waits this many milliseconds; a request that cannot make "
                    "it is refused at once (503 DEADLINE_UNREACHABLE)",
                    {"type": "number", "exclusiveMinimum": 0},
                ),
                "Inferd-Server-Timing": header_parameter(
                    "Inferd-Server-Timing",
                    "true: the answer's Server-Timing header splits the request's time",
                    {"enum": ["true", "false", "1", "0"]},
                ),
            },
            "headers": {
                "X-Request-ID": {"description": "the request's id", "required": True, "schema": {"type": "string"}},
                "Retry-After": {
                    "description": "seconds to wait before a retry, when known",
                    "schema": {"type": "string"},
                },
            },
        },
    }
    if policy is not None and access is not None:
        _ask_for_tokens(built, access, policy)
    return built


def _ask_for_tokens(built: Json, access: Mapping[tuple[str, str], Access], policy: AccessPolicy) -> None:
    """Bearer security on the operations this server asks tokens for, with their 401 (and, where an
    inference token is refused, 403) in the door's error shape."""
    built["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "a token of --*-tokens-file or INFERD_*_TOKENS"}
    }
    for path, item in built["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            needed = access.get((method.upper(), path), Access.DATA)
            if not policy.needs_token(needed):
                continue
            operation["security"] = [{"bearer": []}]
            door = operation["tags"][0]
            operation["responses"].setdefault("401", ref(f"{door}Error401", "responses"))
            if needed is Access.MANAGEMENT and policy.management is not None and policy.data is not None:
                operation["responses"].setdefault("403", ref(f"{door}Error403", "responses"))


def document_bytes(
    *,
    sagemaker_multi_model: bool,
    access: Mapping[tuple[str, str], Access] | None = None,
    policy: AccessPolicy | None = None,
) -> bytes:
    return orjson.dumps(document(sagemaker_multi_model=sagemaker_multi_model, access=access, policy=policy))


def management_document_bytes(
    *, access: Mapping[tuple[str, str], Access] | None = None, policy: AccessPolicy | None = None
) -> bytes:
    return orjson.dumps(management_document(access=access, policy=policy))

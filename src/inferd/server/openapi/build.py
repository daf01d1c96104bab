"""Small builders for the OpenAPI document: references, JSON bodies, parameters, each door's error
responses. The document itself is data (`schemas`, `kserve`, `doors`); these keep it short.

Error responses are derived from the code's own tables (`protocol.status`): a door's 404 lists
exactly the error codes that door answers 404 with, so the document cannot drift from them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from inferd.errors import ErrorCode
from inferd.protocol.status import HTTP_STATUS, TFSERVING_HTTP_STATUS

Json = dict[str, Any]

JSON = "application/json"
OCTETS = "application/octet-stream"

# Every route can answer these: a malformed X-Request-ID (400), a body past --max-request-bytes
# (413), and an unexpected failure (500, details in the server log only).
EVERY_ROUTE = (400, 413, 500)


def ref(name: str, kind: str = "schemas") -> Json:
    return {"$ref": f"#/components/{kind}/{name}"}


def json_content(schema: Json, example: Any = None) -> Json:
    media: Json = {"schema": schema}
    if example is not None:
        media["example"] = example
    return {JSON: media}


def json_body(schema: Json, example: Any = None, *, required: bool = True) -> Json:
    return {"required": required, "content": json_content(schema, example)}


def ok(description: str, schema: Json | None = None, example: Any = None) -> Json:
    """A 200 answer: JSON of `schema`, or no body when `schema` is None."""
    response: Json = {"description": description}
    if schema is not None:
        response["content"] = json_content(schema, example)
    return response


def path_parameter(name: str, description: str, example: str, schema: Json | None = None) -> Json:
    # A path segment is never empty and never holds '/': the server splits paths on it first.
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": schema or {"type": "string", "minLength": 1},
        "example": example,
    }


STRING_SCHEMA: Json = {"type": "string"}
NUMBER: Json = {"type": "number"}


def query_parameter(name: str, description: str, schema: Json) -> Json:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def header_parameter(name: str, description: str, schema: Json, example: Any = None) -> Json:
    parameter: Json = {"name": name, "in": "header", "required": False, "description": description, "schema": schema}
    if example is not None:
        parameter["example"] = example
    return parameter


@dataclass(frozen=True, slots=True)
class Door:
    """How one front door answers errors: the schema of its error body (a component), where the
    body keeps inferd's error code, and its status of each code."""

    name: str
    schema: str
    statuses: Mapping[ErrorCode, int]

    def codes(self, status: int) -> list[str]:
        return sorted(code.value for code, each in self.statuses.items() if each == status)

    def response_name(self, status: int) -> str:
        return f"{self.name}Error{status}"

    def error_response(self, status: int) -> Json:
        """The component response for `status`: the door's error body, its code one of those the
        door answers `status` with; X-Request-ID always, Retry-After on a 503 that can estimate it."""
        codes = self.codes(status)
        if not codes:
            raise ValueError(f"{self.name} answers no error code with status {status}")
        headers: Json = {"X-Request-ID": {"$ref": "#/components/headers/X-Request-ID"}}
        if status == 503:
            headers["Retry-After"] = {"$ref": "#/components/headers/Retry-After"}
        return {
            "description": f"{self.name} error, inferd code {' or '.join(codes)}",
            "headers": headers,
            "content": json_content({"allOf": [ref(self.schema), _code_is(self.name, codes, status)]}),
        }


def _code_is(door: str, codes: list[str], status: int) -> Json:
    """The part of a door's error body that names its code: where each door's clients look for it."""
    enum = {"type": "string", "enum": codes}
    if door == "OpenAI":
        return {"properties": {"error": {"properties": {"code": enum}}}}
    if door == "TorchServe":
        return {"properties": {"error_code": enum, "code": {"const": status}}}
    return {"properties": {"code": enum}}


KSERVE = Door("KServe", "Error", HTTP_STATUS)
TFSERVING = Door("TFServing", "Error", TFSERVING_HTTP_STATUS)
SAGEMAKER = Door("SageMaker", "SageMakerError", HTTP_STATUS)
OPENAI = Door("OpenAI", "OpenAIError", HTTP_STATUS)
TORCHSERVE = Door("TorchServe", "TorchServeError", HTTP_STATUS)
DOORS = (KSERVE, TFSERVING, SAGEMAKER, OPENAI, TORCHSERVE)


def operation(
    door: Door,
    operation_id: str,
    summary: str,
    responses: Mapping[int, Json],
    errors: Iterable[int] = (),
    *,
    parameters: Iterable[Json] = (),
    body: Json | None = None,
    description: str = "",
) -> Json:
    """One operation: its own answers (`responses`) and the door's errors for `errors` and for
    every route's statuses (EVERY_ROUTE)."""
    answers: Json = {str(status): response for status, response in sorted(responses.items())}
    for status in sorted({*errors, *EVERY_ROUTE}):
        answers.setdefault(str(status), ref(door.response_name(status), "responses"))
    built: Json = {
        "operationId": operation_id,
        "summary": summary,
        "tags": [door.name],
        "parameters": [*parameters, ref("X-Request-ID", "parameters")],
        "responses": answers,
    }
    if description:
        built["description"] = description
    if body is not None:
        built["requestBody"] = body
    return built


def error_responses() -> Json:
    """components.responses: each door's error answer for every status its table gives a code."""
    return {
        door.response_name(status): door.error_response(status)
        for door in DOORS
        for status in sorted(set(door.statuses.values()))
    }

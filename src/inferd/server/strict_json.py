"""Management and async bodies read with pydantic, strictly: an unknown field, or a value of the
wrong type, is a 400 that names the field (a typo must not be a silently ignored setting)."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from inferd.errors import MalformedRequestError
from inferd.protocol import json_v2

Body = TypeVar("Body", bound=BaseModel)


def decode_strict(model: type[Body], subject: str, body: bytes) -> Body:
    """`body` read as `model`; a 400 saying, of `subject` ("endpoint 'shop'"), which field is wrong."""
    try:
        return model.model_validate(json_v2.load_json(body))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the body"
        raise MalformedRequestError(f"{subject}: {where}: {first['msg']}") from None

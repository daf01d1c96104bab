"""TF Serving's configuration files (its model config, its batching parameters): protobuf's text
format of one of its messages, read from a path or an fsspec URL (s3://...), each failure a
ModelConfigError that names the file and says what it should have been."""

from __future__ import annotations

from typing import TypeVar

from google.protobuf import text_format
from google.protobuf.message import Message

from inferd.errors import ModelConfigError

MessageT = TypeVar("MessageT", bound=Message)


def read_text_message(location: str, message: MessageT, kind: str) -> MessageT:
    """`message` filled from the text at `location`; `kind` names the file in errors."""
    import fsspec

    try:
        with fsspec.open(location, "r", encoding="utf-8") as file:
            text = file.read()
    except (OSError, ValueError) as exc:
        raise ModelConfigError(f"{kind} {location} cannot be read: {exc}") from None
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ModelConfigError(f"{location}: not a {kind}: {exc}") from None
    return message

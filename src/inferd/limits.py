"""How much one request may make the server hold: its inputs' elements, its BYTES elements' bytes
and its answer's bytes. Every door's request is checked against the same `RequestLimits`: the
decoders before they allocate (`protocol.tensor_bytes`), the service before and after the model
runs (`check_request_size`, `check_response_size`), so a door that builds its tensors itself
(OpenAI's texts, SageMaker's CSV, TorchServe's files) is held to them as well.

The decoders are handed the limits they check: each door's codec holds the server's, given once
when the server builds it, so two servers (or two codecs) in one process hold requests to their
own. A client decoding an answer passes `UNLIMITED`: its caller chose what it asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferd.errors import RequestTooLargeError
from inferd.types import DataType, Tensor

DEFAULT_MAX_REQUEST_ELEMENTS = 16 * 1024 * 1024
DEFAULT_MAX_REQUEST_TEXT_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024 * 1024
# Each BYTES element is counted with the 4 bytes of length the binary extension frames it with: an
# empty string still costs an object and a loop turn, so a request of millions of them is large.
BYTES_ELEMENT_OVERHEAD = 4


@dataclass(frozen=True, slots=True)
class RequestLimits:
    max_elements: int = DEFAULT_MAX_REQUEST_ELEMENTS
    """Elements of one request's inputs, all of them together (--max-request-elements)."""
    max_text_bytes: int = DEFAULT_MAX_REQUEST_TEXT_BYTES
    """Bytes of one request's BYTES elements, each counted with 4 more (--max-request-text-bytes)."""
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    """Bytes of one answer's output tensors (--max-response-bytes)."""


# What a client decoding an answer checks it against: nothing (it asked for what it gets).
UNLIMITED = RequestLimits(max_elements=2**63, max_text_bytes=2**63, max_response_bytes=2**63)


def too_many_elements(name: str, count: int, limits: RequestLimits) -> RequestTooLargeError:
    return RequestTooLargeError(
        f"input '{name}': the request holds {count} elements, more than the server's limit of "
        f"{limits.max_elements} per request (--max-request-elements)",
        tensor=name,
        expected=f"<= {limits.max_elements} elements",
        actual=f"{count} elements",
    )


def too_much_text(name: str, size: int, limits: RequestLimits) -> RequestTooLargeError:
    return RequestTooLargeError(
        f"input '{name}': the request's BYTES elements hold {size} bytes (4 counted for each element), more "
        f"than the server's limit of {limits.max_text_bytes} per request (--max-request-text-bytes)",
        tensor=name,
        expected=f"<= {limits.max_text_bytes} bytes",
        actual=f"{size} bytes",
    )


def text_bytes(items: Any) -> int:
    """The bytes of BYTES elements (an array or a sequence), as `RequestLimits.max_text_bytes`
    counts them; an element that is neither bytes nor text (a model's object output) counts 8."""
    if hasattr(items, "ravel"):
        items = items.ravel().tolist()
    try:
        size = sum(map(len, items))
    except TypeError:
        size = sum(len(item) if isinstance(item, bytes | str) else 8 for item in items)
    return size + BYTES_ELEMENT_OVERHEAD * len(items)


def check_request_size(inputs: Sequence[Tensor], limits: RequestLimits) -> None:
    """RequestTooLargeError when the inputs together pass the element or text limit."""
    # Every request passes here: a sum of sizes, and a loop over BYTES inputs only.
    elements = 0
    text = 0
    for tensor in inputs:
        elements += tensor.data.size
        if elements > limits.max_elements:
            raise too_many_elements(tensor.name, elements, limits)
        if tensor.datatype is DataType.BYTES:
            text += text_bytes(tensor.data)
            if text > limits.max_text_bytes:
                raise too_much_text(tensor.name, text, limits)


def check_response_size(model: str, outputs: Sequence[Tensor], limits: RequestLimits) -> None:
    """RequestTooLargeError when the outputs hold more bytes than an answer may carry."""
    size = 0
    for tensor in outputs:
        size += text_bytes(tensor.data) if tensor.datatype is DataType.BYTES else tensor.data.nbytes
        if size > limits.max_response_bytes:
            raise RequestTooLargeError(
                f"model '{model}': the answer's outputs hold {size} bytes or more, more than the server's limit "
                f"of {limits.max_response_bytes} per answer (--max-response-bytes); ask for fewer rows or outputs",
                tensor=tensor.name,
                expected=f"<= {limits.max_response_bytes} bytes",
                actual=f">= {size} bytes",
            )

"""Request ids at the wire: what a client may send, and how inferd writes one into a header.

A client names its request in the v2 `id` field (JSON or gRPC) or in an `X-Request-ID` header.
inferd echoes the `id` as sent in the response body, where the codec escapes whatever it must.
In a header (HTTP `x-request-id`, gRPC trailing metadata) an id is written percent-encoded,
since a raw value could end the header early (`"a\\r\\nSet-Cookie: x=1"` would add a header of the
client's choosing) or hold characters a header cannot carry. Control characters are refused
outright: no log line or header should carry them, and no client needs them in a name.
"""

from __future__ import annotations

import unicodedata
import urllib.parse

from inferd.errors import MalformedRequestError

# The HTTP header (and gRPC metadata key) that carries a request's id.
REQUEST_ID_HEADER = "x-request-id"
# Printable ASCII but for '%', which is the escape character itself.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def check_request_id(value: str, where: str) -> str:
    """`value`, or MalformedRequestError naming `where` when it holds control characters."""
    if not value.isprintable() and any(unicodedata.category(c) == "Cc" for c in value):
        raise MalformedRequestError(f"{where} {value!r} holds control characters; a request id must be printable text")
    return value


def header_value(text: str) -> str:
    """`text` as a header (or gRPC metadata) value: itself when it is printable ASCII without '%'
    or spaces at its ends, else with the rest percent-encoded as UTF-8."""
    if text.isascii() and text.isprintable() and "%" not in text and text[:1] != " " and text[-1:] != " ":
        return text
    # surrogatepass: the parsers never produce lone surrogates, but writing a header must not fail.
    encoded = urllib.parse.quote(text, safe=_HEADER_SAFE, errors="surrogatepass")
    # Spaces at the ends would be trimmed by every header parser.
    stripped = encoded.strip(" ")
    start = encoded.index(stripped) if stripped else len(encoded)
    return "%20" * start + stripped + "%20" * (len(encoded) - start - len(stripped))

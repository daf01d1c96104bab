"""HTTP body compression as Triton's HTTP API has it (tritonclient's request_compression_algorithm
and response_compression_algorithm): `Content-Encoding: gzip | deflate` on a request body,
`Accept-Encoding` choosing the response's. `deflate` is zlib's format (RFC 1950), as Triton and
tritonclient write it; a request says which, but either wrapper is read. Inference-Header-Content-Length
counts bytes of the uncompressed body, both ways."""

from __future__ import annotations

import gzip
import zlib

from inferd.errors import MalformedRequestError, RequestTooLargeError, UnsupportedEncodingError

ENCODINGS = ("gzip", "deflate")
ACCEPTED = "gzip, deflate"
"""What a 415 for an unknown Content-Encoding advertises (its Accept-Encoding header)."""
_GZIP_OR_ZLIB = 15 | 32  # zlib's window bits: detect either wrapper from the header


def is_compressed(content_encoding: bytes | None) -> bool:
    """Whether a body's Content-Encoding says it is compressed (else `decode_body` returns it as is)."""
    return content_encoding is not None and content_encoding.strip().lower() not in (b"", b"identity")


def decode_body(body: bytes, content_encoding: bytes | None, limit: int, max_ratio: int | None = None) -> bytes:
    """The body as sent before compression; at most `limit` bytes of it, and at most `max_ratio`
    times its compressed size (a small compressed body may not inflate into a large one: it is
    refused at the bound, not after inflating it all)."""
    encoding = (content_encoding or b"").decode("latin-1").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ENCODINGS:
        raise UnsupportedEncodingError(
            f"Unsupported compression type: Content-Encoding '{encoding}'; inferd reads gzip, deflate or identity",
            accepted=ACCEPTED,
        )
    bound = limit if max_ratio is None else min(limit, max_ratio * len(body))
    inflater = zlib.decompressobj(_GZIP_OR_ZLIB)
    try:
        plain = inflater.decompress(body, bound + 1)
    except zlib.error as exc:
        raise MalformedRequestError(f"the {encoding} request body cannot be decompressed: {exc}") from None
    if len(plain) > bound or inflater.unconsumed_tail:
        if bound < limit:
            raise RequestTooLargeError(
                f"the {encoding} request body decompresses to more than {max_ratio} times its {len(body)} bytes, "
                "the server's limit (--max-compression-ratio)"
            )
        raise RequestTooLargeError(
            f"the {encoding} request body decompresses to more than the server's limit of {limit} bytes "
            "(--max-request-bytes)"
        )
    if not inflater.eof:
        raise MalformedRequestError(f"the {encoding} request body is truncated: its compressed stream does not end")
    return plain


def response_encoding(accept_encoding: bytes | None) -> str | None:
    """The encoding to answer in, as Triton picks it: among gzip, deflate and identity the highest
    `q`, the first listed on a tie; None for identity."""
    if not accept_encoding:
        return None
    chosen, weight = "identity", 0.0
    for item in accept_encoding.decode("latin-1").split(","):
        name, _, parameters = item.strip().partition(";")
        name = name.strip().lower()
        quality = 1.0
        for parameter in parameters.split(";"):
            key, _, value = parameter.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = -1.0  # an unreadable weight: the item is skipped
        if name in ("identity", *ENCODINGS) and quality > weight:
            chosen, weight = name, quality
    return None if chosen == "identity" else chosen


def encode_body(body: bytes, encoding: str) -> bytes:
    return gzip.compress(body, compresslevel=6, mtime=0) if encoding == "gzip" else zlib.compress(body, 6)

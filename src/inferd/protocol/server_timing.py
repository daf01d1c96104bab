"""A request's time split as a W3C `Server-Timing` header value (durations in milliseconds), sent
over HTTP as a header and over gRPC as trailing metadata when the client asks for it."""

from __future__ import annotations

from inferd.types import RequestTiming

# Ask with this request header (HTTP) or metadata key (gRPC), value "true" or "1".
REQUEST_HEADER = "inferd-server-timing"
RESPONSE_HEADER = "server-timing"


def wanted(value: str | bytes | None) -> bool:
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value is not None and value.strip().lower() in ("1", "true", "yes")


def encode(timing: RequestTiming) -> str:
    phases = (
        ("decode", timing.decode_s),
        ("queue", timing.queue_s),
        ("batch-wait", timing.batch_wait_s),
        ("compute", timing.compute_s),
        ("encode", timing.encode_s),
    )
    return ", ".join(f"{name};dur={seconds * 1000:.3f}" for name, seconds in phases)

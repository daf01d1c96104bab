"""The response cache's headers (gRPC: metadata and trailing metadata of these names): the request's
`Cache-Control` (HTTP's own; `no-cache` asks for a fresh answer), and `Inferd-Cache`, which an
answer of a model that caches carries: `hit` (the cache gave it) or `miss` (the model ran)."""

CACHE_CONTROL_HEADER = "cache-control"
CACHE_HEADER = "inferd-cache"


def asks_fresh(value: bytes | str | None) -> bool:
    """Whether a Cache-Control value holds the `no-cache` directive (RFC 9111: a list of
    directives, names case-insensitive)."""
    if not value:
        return False
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return any(part.split("=", 1)[0].strip().lower() == "no-cache" for part in text.split(","))

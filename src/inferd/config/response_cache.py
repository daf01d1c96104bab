"""The response cache's settings, from Triton's `--cache-config` flag.

Each `--cache-config` names a cache kind and its settings, as Triton writes them:
`local,size=268435456` (a byte budget; inferd also takes 256MiB) with an optional `ttl_s=600`.
Off unless given; a model still caches only when its config says `response_cache { enable: true }`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from inferd.config.sizes import parse_size

LOCAL = "local"
KINDS = (LOCAL,)


@dataclass(frozen=True, slots=True)
class CacheSettings:
    local_bytes: int
    """The local tier's byte budget: what its entries (outputs, keys, overhead) may hold."""
    ttl_s: float | None = None
    """How long an entry answers after it was kept; None: until the budget evicts it."""


def parse_cache_config(specs: Iterable[str]) -> CacheSettings | None:
    """The settings `--cache-config` values give (None when none is given); ValueError naming the
    value when one is not `local,size=N[,ttl_s=S]`."""
    settings: CacheSettings | None = None
    for spec in specs:
        kind, _, rest = spec.partition(",")
        kind = kind.strip()
        if kind not in KINDS:
            raise ValueError(f"--cache-config '{spec}': the cache is one of {', '.join(KINDS)} (as local,size=256MiB)")
        if settings is not None:
            raise ValueError(f"--cache-config '{spec}': the {kind} cache is configured twice")
        values: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, equals, value = (part.strip() for part in item.partition("="))
            if not equals or key not in ("size", "ttl_s") or key in values:
                raise ValueError(
                    f"--cache-config '{spec}': '{item}' is not one of size=BYTES, ttl_s=SECONDS (each once)"
                )
            values[key] = value
        if "size" not in values:
            raise ValueError(f"--cache-config '{spec}': the local cache needs its byte budget, as size=256MiB")
        try:
            size = parse_size(values["size"])
        except ValueError as exc:
            raise ValueError(f"--cache-config '{spec}': {exc}") from None
        if size < 1:
            raise ValueError(f"--cache-config '{spec}': size must be at least 1 byte")
        ttl_s = None
        if "ttl_s" in values:
            try:
                ttl_s = float(values["ttl_s"])
            except ValueError:
                ttl_s = math.nan
            if not (math.isfinite(ttl_s) and ttl_s > 0):
                raise ValueError(f"--cache-config '{spec}': ttl_s must be a number of seconds above 0")
        settings = CacheSettings(int(size), ttl_s)
    return settings

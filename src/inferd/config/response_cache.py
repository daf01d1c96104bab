"""The response cache's settings, from Triton's `--cache-config` flag.

Each `--cache-config` names a cache tier and its settings, as Triton writes them:

* `local,size=268435456` (a byte budget; inferd also takes 256MiB), with an optional `ttl_s=600`:
  this server's memory;
* `redis,url=redis://host:6379/0`, with optional `ttl_s=` and `timeout_ms=` (how long a command
  may take before it counts as a miss; default 200): a tier every server naming the same Redis
  shares.

Both given: the local tier in front of Redis. Off unless given; a model still caches only when
its config says `response_cache { enable: true }`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from inferd.config.sizes import parse_size

LOCAL, REDIS = "local", "redis"
KINDS = (LOCAL, REDIS)
_KEYS = {LOCAL: ("size", "ttl_s"), REDIS: ("url", "ttl_s", "timeout_ms")}
DEFAULT_REDIS_TIMEOUT_MS = 200


@dataclass(frozen=True, slots=True)
class CacheSettings:
    local_bytes: int | None = None
    """The local tier's byte budget (its entries' outputs, keys and overhead); None: no local tier."""
    ttl_s: float | None = None
    """How long a local entry answers after it was kept; None: until the budget evicts it."""
    redis_url: str | None = None
    """The shared tier's Redis; None: none."""
    redis_ttl_s: float | None = None
    """How long a Redis entry lives; None: until Redis's own eviction removes it."""
    redis_timeout_s: float = DEFAULT_REDIS_TIMEOUT_MS / 1000


def parse_cache_config(specs: Iterable[str]) -> CacheSettings | None:
    """The settings `--cache-config` values give (None when none is given); ValueError naming the
    value when one is not `local,size=N[,ttl_s=S]` or `redis,url=URL[,ttl_s=S][,timeout_ms=MS]`."""
    tiers: dict[str, tuple[str, dict[str, str]]] = {}
    for spec in specs:
        kind, _, rest = spec.partition(",")
        kind = kind.strip()
        if kind not in KINDS:
            raise ValueError(
                f"--cache-config '{spec}': the cache is one of {', '.join(KINDS)} (as local,size=256MiB or "
                "redis,url=redis://host:6379/0)"
            )
        # Triton's form gives one setting a flag (local,size=N then local,ttl_s=S): they add up.
        first_spec, values = tiers.get(kind, (spec, {}))
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, equals, value = (part.strip() for part in item.partition("="))
            if not equals or key not in _KEYS[kind] or key in values:
                allowed = ", ".join(f"{name}=" for name in _KEYS[kind])
                raise ValueError(f"--cache-config '{spec}': '{item}' is not one of {allowed} (each once)")
            values[key] = value
        tiers[kind] = (first_spec, values)
    for kind, (spec, values) in tiers.items():
        if kind == LOCAL and "size" not in values:
            raise ValueError(f"--cache-config '{spec}': the local cache needs its byte budget, as size=256MiB")
        if kind == REDIS and not values.get("url", "").startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"--cache-config '{spec}': the redis cache needs url=redis://host:port/db (or rediss://)")
    if not tiers:
        return None
    settings = CacheSettings()
    if LOCAL in tiers:
        spec, local = tiers[LOCAL]
        try:
            size = parse_size(local["size"])
        except ValueError as exc:
            raise ValueError(f"--cache-config '{spec}': {exc}") from None
        if not (math.isfinite(size) and size >= 1):
            raise ValueError(f"--cache-config '{spec}': size must be at least 1 byte, and finite")
        settings = CacheSettings(local_bytes=int(size), ttl_s=_seconds(local, "ttl_s", spec))
    if REDIS in tiers:
        spec, redis = tiers[REDIS]
        timeout_ms = _seconds(redis, "timeout_ms", spec)
        settings = CacheSettings(
            settings.local_bytes, settings.ttl_s, redis["url"], _seconds(redis, "ttl_s", spec),
            timeout_ms / 1000 if timeout_ms is not None else DEFAULT_REDIS_TIMEOUT_MS / 1000,
        )  # fmt: skip
    return settings


def _seconds(values: dict[str, str], key: str, spec: str) -> float | None:
    if key not in values:
        return None
    try:
        number = float(values[key])
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        unit = "milliseconds" if key.endswith("_ms") else "seconds"
        raise ValueError(f"--cache-config '{spec}': {key} must be a number of {unit} above 0")
    return number

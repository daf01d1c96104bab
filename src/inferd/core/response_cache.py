"""The response cache: a model's answer to the same inputs, kept and given again without running it.

A model opts in with Triton's `response_cache { enable: true }`, and the server holds a cache
(`--cache-config local,size=N[,ttl_s=S]`, config/response_cache.py); then every client request to
one of its versions goes through `ResponseCache.answer` (core.dispatcher), before any queue.

Correct first:

* **The key** is a BLAKE2b digest of the version's *content* and the request: the model's name and
  version, a fingerprint of the files the version was loaded from (its version folder and the
  model's shared files: config.pbtxt, labels, warm-up data) and of its completed config, then the
  input tensors in name order (datatype, shape, bytes; BYTES elements length-prefixed) and the
  outputs asked for. A reload, a hot swap or a config change makes another fingerprint, so no
  request to the new files can find an answer of the old ones; files swapped back find their own
  answers again, which are right for them. Classification is applied after the cache to the
  outputs it keeps, so `class_count` needs no key of its own.
* **One execution for identical requests**: the first request of a key runs the model; the ones
  that come while it runs wait for its answer (a flight). When that first one fails or leaves,
  each waiting request runs the model itself, as it would without a cache: errors are never kept
  nor handed on.
* **Bounded**: entries are kept least recently used first out, within a byte budget (each entry's
  outputs, its key and a fixed overhead), and optionally for `ttl_s` seconds.

Sequence and decoupled models cannot cache (their answers are not a function of one request):
their config is refused (config.loader), as an ensemble's with such a step is (core.ensemble_loading).
An ensemble caches as a whole: its key is its config's and, at each request, its steps' serving
versions' (the dispatcher's `_content_key`); an answer is kept only if they did not change while
it ran.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inferd.config.model import ModelConfig
from inferd.config.response_cache import CacheSettings
from inferd.core.metrics import Metrics
from inferd.types import DataType, InferRequest, InferResponse, Tensor

if TYPE_CHECKING:
    from inferd.core.response_cache_redis import RedisTier

logger = logging.getLogger("inferd.response_cache")

# A client asks for a fresh answer with `Cache-Control: no-cache` (HTTP header, gRPC metadata), or
# with this request parameter (v2's parameters, JSON or gRPC) set to it.
CACHE_CONTROL_PARAMETER = "cache_control"
NO_CACHE = "no-cache"
# What an entry costs beyond its outputs' bytes and its key (the entry, its tensors, the dict slot).
ENTRY_OVERHEAD_BYTES = 512
_DIGEST_BYTES = 32
_FINGERPRINT_VERSION = b"inferd-response-cache-1"


def version_fingerprint(config: ModelConfig, version_dir: Path, model_dir: Path) -> bytes:
    """A digest of what one loaded version answers from: the files of its version folder, the
    model's shared files (everything outside its version folders), and its completed config."""
    digest = hashlib.blake2b(_FINGERPRINT_VERSION, digest_size=_DIGEST_BYTES)
    digest.update(repr(config).encode())
    shared = [p for p in _files(model_dir) if not _in_a_version_folder(p, model_dir)]
    for path in [*shared, *_files(version_dir)]:
        relative = path.relative_to(model_dir).as_posix().encode()
        digest.update(struct.pack("<Q", len(relative)) + relative)
        with open(path, "rb") as file:
            digest.update(hashlib.file_digest(file, "blake2b").digest())
    return digest.digest()


def _files(folder: Path) -> list[Path]:
    found = []
    for root, _, names in os.walk(folder, followlinks=True):
        found += [Path(root) / name for name in names]
    return sorted(p for p in found if p.is_file())


def _in_a_version_folder(path: Path, model_dir: Path) -> bool:
    top = path.relative_to(model_dir).parts[0]
    return top.isascii() and top.isdigit() and len(path.relative_to(model_dir).parts) > 1


def request_key(version_key: bytes, request: InferRequest) -> bytes:
    """The key of `request` to the version whose key (name, version and fingerprint) is `version_key`."""
    digest = hashlib.blake2b(version_key, digest_size=_DIGEST_BYTES)
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        _add_tensor(digest, tensor)
    digest.update(b"\0outputs")
    for name in sorted(output.name for output in request.outputs):
        encoded = name.encode()
        digest.update(struct.pack("<Q", len(encoded)) + encoded)
    return digest.digest()


def version_key(name: str, version: int, fingerprint: bytes) -> bytes:
    encoded = name.encode()
    return struct.pack("<Q", len(encoded)) + encoded + struct.pack("<Q", version) + fingerprint


def ensemble_key(parts: list[bytes]) -> bytes:
    """An ensemble's key: its own (its name, version and config) and its steps' serving versions', in order."""
    digest = hashlib.blake2b(b"ensemble", digest_size=_DIGEST_BYTES)
    for part in parts:
        digest.update(struct.pack("<Q", len(part)) + part)
    return digest.digest()


def config_fingerprint(config: ModelConfig) -> bytes:
    """A digest of a config alone (an ensemble's: it holds no files of its own to run)."""
    return hashlib.blake2b(_FINGERPRINT_VERSION + repr(config).encode(), digest_size=_DIGEST_BYTES).digest()


def _add_tensor(digest: Any, tensor: Tensor) -> None:
    name = tensor.name.encode()
    digest.update(struct.pack("<Q", len(name)) + name + tensor.datatype.value.encode() + b"\0")
    digest.update(struct.pack(f"<Q{len(tensor.shape)}q", len(tensor.shape), *tensor.shape))
    data = tensor.data
    if tensor.datatype is DataType.BYTES:
        for item in data.reshape(-1):
            value = item if isinstance(item, bytes) else str(item).encode()
            digest.update(struct.pack("<Q", len(value)) + value)
    else:  # the bytes as the model sees them: native order, C-contiguous
        digest.update(np.ascontiguousarray(data, dtype=tensor.datatype.numpy_dtype).reshape(-1).view(np.uint8).data)


def _kept(tensor: Tensor) -> Tensor:
    """A tensor as an entry keeps it: a copy (a view of a batch's output would keep the whole
    batch's memory, which the budget does not count; the answer just given is its client's), and
    read-only (every answer the entry gives shares it)."""
    data = tensor.data.copy()
    data.flags.writeable = False
    return replace(tensor, data=data)


def _response_bytes(response: InferResponse) -> int:
    total = 0
    for tensor in response.outputs:
        data = tensor.data
        if data.dtype == object:
            items = data.reshape(-1)
            total += sum(len(item) if isinstance(item, (bytes, str)) else 8 for item in items) + 8 * data.size
        else:
            total += data.nbytes
    return total


@dataclass(slots=True)
class _Entry:
    response: InferResponse
    size: int
    model: str
    expires_s: float


class LocalTier:
    """Entries in this process's memory, least recently used first out, within `max_bytes`."""

    def __init__(self, max_bytes: int, ttl_s: float | None, metrics: Metrics, clock: Callable[[], float]) -> None:
        self.max_bytes = max_bytes
        self._ttl_s = ttl_s
        self._metrics = metrics
        self._clock = clock
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self.bytes = 0

    def get(self, key: bytes) -> InferResponse | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires_s <= self._clock():
            self._remove(key, entry)
            return None
        self._entries.move_to_end(key)
        return entry.response

    def put(self, key: bytes, model: str, response: InferResponse) -> None:
        size = _response_bytes(response) + len(key) + ENTRY_OVERHEAD_BYTES
        if size > self.max_bytes:  # never kept: it would evict everything for itself
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        response = replace(response, outputs=tuple(_kept(tensor) for tensor in response.outputs))
        expires_s = self._clock() + self._ttl_s if self._ttl_s is not None else float("inf")
        self._entries[key] = _Entry(response, size, model, expires_s)
        self.bytes += size
        while self.bytes > self.max_bytes:
            oldest_key, oldest = next(iter(self._entries.items()))
            self._remove(oldest_key, oldest)
            self._metrics.cache_evicted(oldest.model)
        self._metrics.cache_size(self.bytes)

    def _remove(self, key: bytes, entry: _Entry) -> None:
        del self._entries[key]
        self.bytes -= entry.size
        self._metrics.cache_size(self.bytes)

    def __len__(self) -> int:
        return len(self._entries)


class ResponseCache:
    """The server's response cache (one per server, on its event loop): the local tier, Redis's
    (core.response_cache_redis), or the local one in front of Redis's."""

    def __init__(self, settings: CacheSettings, metrics: Metrics, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._metrics = metrics
        self.local = LocalTier(settings.local_bytes, settings.ttl_s, metrics, clock) if settings.local_bytes else None
        self.redis: RedisTier | None = None
        if settings.redis_url is not None:
            from inferd.core.response_cache_redis import RedisTier

            self.redis = RedisTier(settings.redis_url, settings.redis_ttl_s, settings.redis_timeout_s, metrics)
        # key -> the answer of the request running it now (None: it failed or left).
        self._flights: dict[bytes, asyncio.Future[InferResponse | None]] = {}

    async def answer(
        self,
        version_key: bytes,
        version: str,
        request: InferRequest,
        run: Callable[[], Awaitable[InferResponse]],
        bypass: bool = False,
        unchanged: Callable[[], bool] | None = None,
    ) -> InferResponse:
        """`request`'s answer: kept, shared with an identical request running now, or `run`'s
        (then kept, if `unchanged` says what it followed did not change meanwhile). `bypass` (the
        client's `Cache-Control: no-cache`) runs it, and keeps the fresh answer. The request's
        context says which (`cache`: hit or miss)."""
        started_s = time.perf_counter()
        key = request_key(version_key, request)
        model = request.model_name
        if not bypass:
            kept = self.local.get(key) if self.local is not None else None
            if kept is not None:
                return self._hit(kept, request, version, started_s)
            flight = self._flights.get(key)
            if flight is not None:
                shared = await asyncio.shield(flight)  # a waiter leaving must not cancel the others'
                if shared is not None:
                    return self._hit(shared, request, version, started_s)
                return self._missed(await run(), request, version, started_s)  # the first failed: alone
            flight = self._flights[key] = asyncio.get_running_loop().create_future()
        else:
            flight = None
        response: InferResponse | None = None
        try:
            stored = await self.redis.get(key) if self.redis is not None and not bypass else None
            if stored is not None:  # another server's answer (or this one's, before a restart)
                response = InferResponse(model, version, request.context.request_id, stored, request.id)
                self._keep(key, model, response, share=False)
                return self._hit(response, request, version, started_s)
            response = await run()
            if unchanged is None or unchanged():
                self._keep(key, model, response, share=True)
        finally:
            if flight is not None:
                del self._flights[key]
                flight.set_result(response)  # None when it failed: each waiter runs for itself
        return self._missed(response, request, version, started_s)

    def _keep(self, key: bytes, model: str, response: InferResponse, share: bool) -> None:
        """Keep an answer in the local tier, and (`share`) write it to Redis's."""
        try:
            if self.local is not None:
                self.local.put(key, model, response)
            if share and self.redis is not None:
                self.redis.put(key, response.outputs)
        except Exception:  # an answer the cache cannot keep is still its client's
            logger.exception("model %s: the response cache could not keep an answer", model)

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.close()

    def _hit(self, kept: InferResponse, request: InferRequest, version: str, started_s: float) -> InferResponse:
        if request.context.cache != "miss":  # a call of several requests: a miss if any missed
            request.context.cache = "hit"
        self._metrics.cache_answered(request.model_name, version, True, time.perf_counter() - started_s)
        return replace(kept, request_id=request.context.request_id, id=request.id)

    def _missed(self, response: InferResponse, request: InferRequest, version: str, started_s: float) -> InferResponse:
        request.context.cache = "miss"
        self._metrics.cache_answered(request.model_name, version, False, time.perf_counter() - started_s)
        return response

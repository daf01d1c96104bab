"""The response cache: a model's answer to the same inputs, kept and given again without running it.

A model opts in with Triton's `response_cache { enable: true }`, and the server holds a cache
(`--cache-config local,size=N[,ttl_s=S]` and/or `redis,url=...`, config/response_cache.py); then
every client request to one of its versions goes through `ResponseCache.answer` (core.dispatcher),
before any queue.

Correct first:

* **The key** is a BLAKE2b digest of the version's *content* and the request: the model's name and
  version, a fingerprint of the files the version was loaded from (its version folder and the
  model's shared files: config.pbtxt, labels, warm-up data; Python's bytecode left out), of its
  config and of the software that computes its answers (inferd's and the engines' versions), then
  the input tensors in name order (datatype, shape, bytes; BYTES elements length-prefixed) and the
  outputs asked for. A reload, a hot swap, a config change or an upgrade makes another
  fingerprint, so no request to the new files can find an answer of the old ones; files swapped
  back find their own answers again, which are right for them. Classification is applied after
  the cache to the outputs it keeps, so `class_count` needs no key of its own.
* **One execution for identical requests** of one admission class: the first request of a key runs
  the model; the ones that come while it runs wait for its answer (a flight), each within its own
  deadline, and get a read-only copy. When that first one fails, each waiting request runs the
  model itself, as it would without a cache (errors are never kept nor handed on); when its client
  leaves, one waiting request runs it for the others.
* **Bounded**: entries are kept least recently used first out, within a byte budget (each entry's
  outputs, its key and a fixed overhead), and optionally for `ttl_s` seconds. A Redis tier
  (core.response_cache_redis) may stand behind this one, shared by servers.

Sequence, decoupled and remote models cannot cache (their answers are not a function of one
request): their config is refused (config.loader), and they get no fingerprint at load
(core.loading), so no ensemble of them caches either. An ensemble caches as a whole: its key is its
config's and, at each request, its steps' serving versions' (the dispatcher's `_content_key`); an
answer is kept only if they did not change while it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import struct
import sys
import threading
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
from inferd.core.scheduler import request_deadline
from inferd.errors import DeadlineUnreachableError
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


def version_files(version_dir: Path, model_dir: Path) -> list[Path]:
    """The files one loaded version answers from: its version folder's and the model's shared ones
    (everything outside its version folders), but Python's bytecode (made from the sources, which
    count, and written by the first import)."""
    shared = [p for p in _files(model_dir) if not _in_a_version_folder(p, model_dir)]
    return [*shared, *_files(version_dir)]


Identity = tuple[str, int, int, int, int, int]


def file_identities(paths: list[Path]) -> list[Identity]:
    """What tells a file's content changed without reading it: (path, device, inode, size, mtime, ctime)."""
    identities = []
    for path in paths:
        info = path.stat()
        identities.append((str(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))
    return identities


# A file's digest by its identity: a load (a cold start, another version of the same shared files)
# reads only what changed. A file changed in the last RECENT_CHANGE_S is read every time: within one
# tick of a coarse clock a rewrite of the same size leaves its identity as it was. Bounded: the
# oldest half goes when it is full. Loads run on threads: one lock.
_DIGESTS: dict[Identity, bytes] = {}
_DIGESTS_MAX = 65_536
_DIGESTS_LOCK = threading.Lock()
RECENT_CHANGE_S = 2.0


def version_fingerprint(config: ModelConfig, version_dir: Path, model_dir: Path) -> bytes:
    """A digest of what one loaded version answers from: `version_files`, its config, and the
    versions of inferd and of the engines that compute its answers (`_software`)."""
    digest = hashlib.blake2b(_FINGERPRINT_VERSION + _software(), digest_size=_DIGEST_BYTES)
    digest.update(repr(config).encode())
    paths = version_files(version_dir, model_dir)
    for path, identity in zip(paths, file_identities(paths), strict=True):
        relative = path.relative_to(model_dir).as_posix().encode()
        digest.update(struct.pack("<Q", len(relative)) + relative)
        with _DIGESTS_LOCK:
            known = _DIGESTS.get(identity)
        if known is None:
            with open(path, "rb") as file:
                known = hashlib.file_digest(file, "blake2b").digest()
            if time.time() - max(identity[4], identity[5]) / 1e9 > RECENT_CHANGE_S:
                with _DIGESTS_LOCK:
                    if len(_DIGESTS) >= _DIGESTS_MAX:
                        for old in list(_DIGESTS)[: _DIGESTS_MAX // 2]:
                            _DIGESTS.pop(old, None)
                    _DIGESTS[identity] = known
        digest.update(known)
    return digest.digest()


@functools.cache
def _software() -> bytes:
    """inferd's version and the engines' that are installed: an upgrade computes answers anew (a
    shared tier's entries of the old software are never read by the new)."""
    from importlib import metadata

    from inferd import __version__

    parts = [f"inferd {__version__}"]
    for name in ("onnxruntime", "onnxruntime-gpu", "torch", "tensorflow", "tensorflow-cpu", "tokenizers", "numpy"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            parts.append(f"{name} {metadata.version(name)}")
    return "\n".join(parts).encode()


def _files(folder: Path) -> list[Path]:
    found = []
    for root, folders, names in os.walk(folder, followlinks=True):
        folders[:] = [name for name in folders if name != "__pycache__"]
        found += [Path(root) / name for name in names if not name.endswith((".pyc", ".pyo"))]
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
        if data.dtype == object:  # each element an object of its own, and the array's pointer to it
            total += sum(sys.getsizeof(item) for item in data.reshape(-1)) + 8 * data.size
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

    def put(self, key: bytes, model: str, response: InferResponse) -> InferResponse | None:
        """Keep `response` (a read-only copy, returned); None when it is larger than the budget."""
        size = _response_bytes(response) + len(key) + ENTRY_OVERHEAD_BYTES
        if size > self.max_bytes:  # never kept: it would evict everything for itself
            return None
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.size
        response = _frozen(response)
        expires_s = self._clock() + self._ttl_s if self._ttl_s is not None else float("inf")
        self._entries[key] = _Entry(response, size, model, expires_s)
        self.bytes += size
        while self.bytes > self.max_bytes:
            oldest_key, oldest = next(iter(self._entries.items()))
            self._remove(oldest_key, oldest)
            self._metrics.cache_evicted(oldest.model)
        self._metrics.cache_size(self.bytes)
        return response

    def _remove(self, key: bytes, entry: _Entry) -> None:
        del self._entries[key]
        self.bytes -= entry.size
        self._metrics.cache_size(self.bytes)

    def __len__(self) -> int:
        return len(self._entries)


# What a flight's waiters are told when its first request did not answer: it failed (each runs
# for itself, as without a cache: errors are never handed on), or its client left (they look again:
# one of them runs the model for the others).
_FAILED, _LEFT = "failed", "left"
# A request whose inputs hold more than this is keyed on a worker thread, not the event loop.
KEY_OFF_LOOP_BYTES = 1 << 20


@dataclass(slots=True)
class _Flight:
    """The identical requests that came while the first of them runs the model."""

    future: asyncio.Future[InferResponse | str]
    waiters: int = 0


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
        # (key, admission class) -> the flight running it: a real-time request never waits for a
        # background one (a shadow's copy, an async job), whose turn may be long in coming.
        self._flights: dict[tuple[bytes, str], _Flight] = {}

    async def answer(
        self,
        version_key: bytes,
        version: str,
        request: InferRequest,
        run: Callable[[], Awaitable[InferResponse]],
        bypass: bool = False,
        unchanged: Callable[[], bool] | None = None,
        admission: str = "",
    ) -> InferResponse:
        """`request`'s answer: kept, shared with an identical request running now, or `run`'s
        (then kept, if `unchanged` says what it followed did not change meanwhile). `bypass` (the
        client's `Cache-Control: no-cache`) runs it, and keeps the fresh answer; `admission`: its
        class (identical requests of one class share a flight). The request's context says which
        (`cache`: hit or miss). The time counted in the cache is its own: the key, the lookups and
        the keeping, never the model's run nor a wait for another request's."""
        started_s = time.perf_counter()
        size = sum(t.data.nbytes for t in request.inputs)
        key = await asyncio.to_thread(request_key, version_key, request) if size > KEY_OFF_LOOP_BYTES else (
            request_key(version_key, request)
        )  # fmt: skip
        model = request.model_name
        flight = None
        if not bypass:
            while True:
                kept = self.local.get(key) if self.local is not None else None
                if kept is not None:
                    return self._hit(kept, request, version, time.perf_counter() - started_s)
                flight = self._flights.get((key, admission))
                if flight is None:
                    break
                looked_s = time.perf_counter() - started_s
                shared = await self._wait(flight, request)
                if isinstance(shared, InferResponse):
                    return self._hit(shared, request, version, looked_s)
                if shared == _FAILED:  # each runs for itself, as without a cache
                    return self._missed(await run(), request, version, looked_s)
                started_s = time.perf_counter() - looked_s  # _LEFT: look again (the wait is not the cache's)
            flight = self._flights[(key, admission)] = _Flight(asyncio.get_running_loop().create_future())
        outcome: InferResponse | str = _FAILED
        try:
            stored = await self.redis.get(key) if self.redis is not None and not bypass else None
            if stored is not None:  # another server's answer (or this one's, before a restart)
                response = InferResponse(model, version, request.context.request_id, stored, request.id)
                outcome = self._keep(key, model, response, share=False) or _frozen(response)
                return self._hit(response, request, version, time.perf_counter() - started_s)
            looked_s = time.perf_counter() - started_s
            response = await run()
            keeping_s = time.perf_counter()
            kept = self._keep(key, model, response, share=True) if unchanged is None or unchanged() else None
            if flight is not None and flight.waiters:  # they get a copy of their own, read-only
                outcome = kept or _frozen(response)
            return self._missed(response, request, version, looked_s + time.perf_counter() - keeping_s)
        except asyncio.CancelledError:
            outcome = _LEFT
            raise
        finally:
            if flight is not None:
                del self._flights[(key, admission)]
                flight.future.set_result(outcome)

    @staticmethod
    async def _wait(flight: _Flight, request: InferRequest) -> InferResponse | str:
        """The flight's outcome, within `request`'s own deadline (the scheduler's error past it)."""
        flight.waiters += 1
        deadline_s = request_deadline(request)
        # shield: a waiter leaving must not cancel the flight the others wait for.
        if deadline_s is None:
            return await asyncio.shield(flight.future)
        try:
            return await asyncio.wait_for(asyncio.shield(flight.future), max(0.0, deadline_s - time.monotonic()))
        except TimeoutError:
            raise DeadlineUnreachableError(
                f"model '{request.model_name}' did not answer within the request's deadline (an identical "
                "request's answer was still being made)"
            ) from None

    def _keep(self, key: bytes, model: str, response: InferResponse, share: bool) -> InferResponse | None:
        """Keep an answer in the local tier (returned: its read-only copy, None when it is not kept
        there), and (`share`) write it to Redis's."""
        kept = None
        try:
            if self.local is not None:
                kept = self.local.put(key, model, response)
            if share and self.redis is not None:
                self.redis.put(key, response.outputs)
        except Exception:  # an answer the cache cannot keep is still its client's
            logger.exception("model %s: the response cache could not keep an answer", model)
        return kept

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.close()

    def _hit(self, kept: InferResponse, request: InferRequest, version: str, in_cache_s: float) -> InferResponse:
        context = request.context
        if context.cache != "miss":  # a call of several requests: a miss if any missed
            context.cache = "hit"
        context.timing.cache_hit = True
        self._metrics.cache_answered(request.model_name, version, True, in_cache_s)
        outputs = kept.outputs
        if request.outputs:  # in the order this request asked them (the key does not hold the order)
            by_name = {tensor.name: tensor for tensor in outputs}
            outputs = tuple(by_name[o.name] for o in request.outputs if o.name in by_name)
        return replace(kept, outputs=outputs, request_id=context.request_id, id=request.id)

    def _missed(self, response: InferResponse, request: InferRequest, version: str, in_cache_s: float) -> InferResponse:
        request.context.cache = "miss"
        self._metrics.cache_answered(request.model_name, version, False, in_cache_s)
        return response


def _frozen(response: InferResponse) -> InferResponse:
    return replace(response, outputs=tuple(_kept(tensor) for tensor in response.outputs))

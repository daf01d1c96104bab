"""The response cache's Redis tier: answers shared by every server that names the same Redis
(`--cache-config redis,url=redis://host:6379/0`), so that a miss on one is a hit on another.

An entry is one Redis string under `inferd:cache:<key in hex>` (the key is core.response_cache's
digest: a version's content and the request, the same on every server of the same files), set
with the tier's TTL when it has one; Redis's own `maxmemory` and eviction policy bound it (an LRU
policy such as `allkeys-lru` suits a cache). Its value is the answer's outputs, in a format of
this module's, read back with every length checked: a value that does not read is a miss, never
code run or an error answered (nothing is unpickled).

Redis going away turns the tier into misses, never errors: a command that fails or outlasts
`timeout_ms` is a miss (counted: `inferd_cache_redis_errors_total`), and the tier is then left
alone for a second, doubling while it keeps failing (up to 30 s); when that time is up one request
alone tries it again (the others skip it), so a Redis that hangs costs one request a timeout now
and then, not every request. Commands in flight are bounded below the connection pool's size: a
lookup that finds them all taken is a plain miss (Redis is busy, not down), and answers are
written after they are given, by at most a few dozen writes at once (beyond that, one is not
shared).

Redis is trusted as the model repository is: whoever can write to it can change the answers the
servers give (use a Redis of the servers' own, with a password or TLS: `rediss://`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from inferd.core.metrics import Metrics
from inferd.types import DataType, Tensor

logger = logging.getLogger("inferd.response_cache")

KEY_PREFIX = b"inferd:cache:"
_MAGIC = b"IRC1"
# After a failed command, the tier is skipped this long, doubled at each failure in a row up to the most.
DOWN_FOR_S = 1.0
DOWN_FOR_MOST_S = 30.0
# Commands at once: reads and writes together, below the pool's connections (a pool that runs out
# fails commands at once); writes get at most part of them, so lookups always find room.
MAX_COMMANDS = 96
MAX_WRITES_IN_FLIGHT = 32
POOL_CONNECTIONS = 128
_DATATYPES = {datatype.value: datatype for datatype in DataType}


def encode_outputs(outputs: tuple[Tensor, ...]) -> bytes:
    """Outputs as one value: magic, a JSON header ([name, datatype, shape, bytes] per output) and
    the outputs' bytes (little-endian; BYTES elements each a 4-byte length and the bytes)."""
    parts, described = [], []
    for tensor in outputs:
        if tensor.datatype is DataType.BYTES:
            items = [item if isinstance(item, bytes) else str(item).encode() for item in tensor.data.reshape(-1)]
            raw = b"".join(struct.pack("<I", len(item)) + item for item in items)
        else:
            dtype = np.dtype(tensor.datatype.numpy_dtype).newbyteorder("<")
            raw = np.ascontiguousarray(tensor.data, dtype=dtype).tobytes()
        described.append([tensor.name, tensor.datatype.value, list(tensor.shape), len(raw)])
        parts.append(raw)
    header = json.dumps(described, separators=(",", ":")).encode()
    return _MAGIC + struct.pack("<I", len(header)) + header + b"".join(parts)


def decode_outputs(value: bytes) -> tuple[Tensor, ...]:
    """`encode_outputs`'s value back; ValueError when it is not one (each length checked)."""
    if value[:4] != _MAGIC or len(value) < 8:
        raise ValueError("not an inferd cache entry")
    (header_size,) = struct.unpack_from("<I", value, 4)
    start = 8 + header_size
    if start > len(value):
        raise ValueError("a header longer than the entry")
    described = json.loads(value[8:start])
    if not isinstance(described, list):
        raise ValueError("a header that lists no outputs")
    outputs = []
    for entry in described:
        name, datatype_name, shape, size = entry
        datatype = _DATATYPES[datatype_name]
        if not (isinstance(name, str) and isinstance(size, int) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise ValueError("an output described wrongly")
        raw = value[start : start + size]
        if len(raw) != size:
            raise ValueError("an output shorter than its header says")
        start += size
        count = int(np.prod(shape, dtype=np.int64))
        if datatype is DataType.BYTES:
            data = _bytes_elements(raw, count).reshape(shape)
        else:
            dtype = np.dtype(datatype.numpy_dtype).newbyteorder("<")
            if count * dtype.itemsize != size:
                raise ValueError("an output's bytes do not fit its shape")
            data = np.frombuffer(raw, dtype=dtype).astype(datatype.numpy_dtype, copy=False).reshape(shape)
        outputs.append(Tensor(name, datatype, tuple(shape), data))
    if start != len(value):
        raise ValueError("bytes after the last output")
    return tuple(outputs)


def _bytes_elements(raw: bytes, count: int) -> np.ndarray[Any, Any]:
    items, offset = [], 0
    for _ in range(count):
        if offset + 4 > len(raw):
            raise ValueError("a BYTES element cut short")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise ValueError("a BYTES element cut short")
        items.append(raw[offset : offset + length])
        offset += length
    if offset != len(raw):
        raise ValueError("bytes after the last BYTES element")
    array = np.empty(count, dtype=object)
    array[:] = items
    return array


class RedisTier:
    """Entries in a Redis every server of the fleet names."""

    def __init__(
        self, url: str, ttl_s: float | None, timeout_s: float, metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        import redis.asyncio

        # Connections are made on the first command (on the server's event loop), never here.
        self._client: Any = redis.asyncio.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry_on_timeout=False,
            max_connections=POOL_CONNECTIONS,
        )  # fmt: skip
        self._ttl_ms = int(ttl_s * 1000) if ttl_s is not None else None
        self._timeout_s = timeout_s
        self._metrics = metrics
        self._clock = clock
        self._commands = 0
        self._failures = 0  # in a row
        self._down_until = float("-inf")
        self._probing = False
        self._writes: set[asyncio.Task[None]] = set()

    def _may_ask(self) -> bool | None:
        """Whether a command may go now (None: no; True: it is the one probe after failures): Redis
        not left alone, and room among the commands."""
        if self._commands >= MAX_COMMANDS or self._clock() < self._down_until:
            return None
        if not self._failures:
            return False
        if self._probing:
            return None
        self._probing = True
        return True

    async def _command(self, make: Callable[[], Any], probe: bool) -> Any:
        self._commands += 1
        try:
            result = await asyncio.wait_for(make(), self._timeout_s)
        finally:
            self._commands -= 1
            if probe:
                self._probing = False
        self._failures = 0
        return result

    async def get(self, key: bytes) -> tuple[Tensor, ...] | None:
        """The outputs kept under `key`, or None (not there, unreadable, Redis busy or not answering)."""
        probe = self._may_ask()
        if probe is None:
            return None
        try:
            value = await self._command(lambda: self._client.get(KEY_PREFIX + key.hex().encode()), probe)
        except Exception as exc:  # any failure of Redis or the connection: a miss
            self._failed("read", exc)
            return None
        if value is None:
            return None
        try:
            return decode_outputs(value)
        except Exception as exc:  # (someone else's value under the name): a miss, never an error answered
            self._failed("read an entry that does not read", exc, down=False)
            return None

    def put(self, key: bytes, outputs: tuple[Tensor, ...]) -> None:
        """Write the outputs under `key` in the background (skipped while Redis is down or behind)."""
        probe = self._may_ask() if len(self._writes) < MAX_WRITES_IN_FLIGHT else None
        if probe is None:
            return
        task = asyncio.get_running_loop().create_task(self._write(key, encode_outputs(outputs), probe))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _write(self, key: bytes, value: bytes, probe: bool) -> None:
        try:
            name = KEY_PREFIX + key.hex().encode()
            await self._command(lambda: self._client.set(name, value, px=self._ttl_ms), probe)
        except Exception as exc:
            self._failed("write", exc)

    def _failed(self, what: str, exc: BaseException, down: bool = True) -> None:
        self._metrics.cache_redis_failed()
        if not down:
            logger.warning("response cache: Redis failed to %s (%s: %s)", what, type(exc).__name__, exc)
            return
        self._failures += 1
        left_alone_s = min(DOWN_FOR_S * 2 ** (self._failures - 1), DOWN_FOR_MOST_S)
        if self._clock() >= self._down_until:  # once a window at most: a dead Redis floods no log
            logger.warning("response cache: Redis failed to %s (%s: %s); left alone for %g s", what,
                           type(exc).__name__, exc, left_alone_s)  # fmt: skip
        self._down_until = self._clock() + left_alone_s

    async def close(self) -> None:
        for task in list(self._writes):
            task.cancel()
        await self._client.aclose()

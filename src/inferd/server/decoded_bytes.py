"""The memory compressed request bodies take once inflated, bounded across requests.

Each request's inflated body is already held to --max-request-bytes, but a few kilobytes on the
wire can inflate to that much, so many small requests at once could hold gigabytes. Two bounds:
* a ratio: a body may inflate to `max_ratio` times its compressed size at most (zlib's output
  buffer never grows past it, whatever the body holds);
* a budget: before a body inflates, the most it may inflate to (the ratio's bound, or the request
  limit when smaller) is reserved from one budget the whole server shares, and returned when the
  request's answer is made. A body the budget cannot take now is answered 503 (retry later).
Bodies inflate on one thread of their own (zlib lets go of the GIL): inflating megabytes takes
milliseconds, and on the loop many bodies at once would hold every other client up; on the shared
worker threads, eight at once took every core. One at a time, the rest of the machine serves on.
The budget's accounting runs on the event loop only: no lock.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from inferd.errors import OverloadedError
from inferd.protocol import http_compression


class DecodedBytesBudget:
    def __init__(self, capacity_bytes: int, max_ratio: int) -> None:
        """`capacity_bytes`: --max-decoded-bytes-in-flight; `max_ratio`: --max-compression-ratio."""
        self.capacity_bytes = capacity_bytes
        self.max_ratio = max_ratio
        self.held_bytes = 0
        self._inflater = ThreadPoolExecutor(1, thread_name_prefix="inferd-inflate")

    async def inflate(self, body: bytes, encoding: bytes | None, limit_bytes: int) -> bytes:
        """`body` decoded (held to `limit_bytes` and the ratio), on the inflating thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self._inflater, http_compression.decode_body, body, encoding, limit_bytes, self.max_ratio
        )

    def bound(self, compressed_bytes: int, limit_bytes: int) -> int:
        """The most a body of `compressed_bytes` may inflate to, under a request limit of `limit_bytes`."""
        return min(limit_bytes, self.max_ratio * compressed_bytes)

    def reserve(self, size_bytes: int) -> int:
        """Hold `size_bytes` of the budget (returned to `release`), or OverloadedError when it lacks them."""
        if self.held_bytes + size_bytes > self.capacity_bytes:
            raise OverloadedError(
                f"compressed request bodies being served hold {self.held_bytes} bytes once inflated; this one "
                f"may inflate to {size_bytes} more, past the server's budget of {self.capacity_bytes} "
                "(--max-decoded-bytes-in-flight): retry later",
                retry_after_s=1.0,
            )
        self.held_bytes += size_bytes
        return size_bytes

    def release(self, size_bytes: int) -> None:
        self.held_bytes -= size_bytes

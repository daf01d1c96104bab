"""When a client tries a call again: on a 503 (UNAVAILABLE, OVERLOADED, MODEL_NOT_READY, or a
server it could not reach), after the server's `Retry-After` when it sent one and else after an
exponential backoff with full jitter (so a crowd of clients that failed together does not return
together), and never past the call's deadline."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from inferd.errors import DeadlineUnreachableError, UnavailableError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_retries: int = 3
    """Tries after the first; 0 turns retries off."""
    backoff_s: float = 0.05
    """The first backoff's upper bound; it doubles with each retry."""
    max_backoff_s: float = 2.0

    def wait_s(self, retry: int, retry_after_s: float | None) -> float:
        """How long to wait before retry number `retry` (0-based)."""
        backoff = random.uniform(0, min(self.max_backoff_s, self.backoff_s * 2**retry))
        return max(backoff, retry_after_s or 0.0)


NO_RETRIES = RetryPolicy(max_retries=0)


async def call_with_retries(call: Callable[[float], Awaitable[T]], policy: RetryPolicy, timeout_s: float) -> T:
    """`call(seconds_left)`, tried again on a retryable error while the policy and the deadline allow."""
    deadline = time.monotonic() + timeout_s
    retry = 0
    while True:
        try:
            return await call(max(0.0, deadline - time.monotonic()))
        except UnavailableError as exc:
            # A deadline the server already judged unreachable will not be reached by waiting longer.
            if retry >= policy.max_retries or isinstance(exc, DeadlineUnreachableError):
                raise
            wait_s = policy.wait_s(retry, exc.retry_after_s)
            if time.monotonic() + wait_s >= deadline:
                raise
            await asyncio.sleep(wait_s)
            retry += 1

"""Structured logs: one JSON object per line (or plain text), carrying the current request's id.

The request id lives in a context variable that the transports set per request, so every log line
emitted while serving a request, in any layer, carries it without being passed around.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import orjson

from inferd.config.server import LogFormat

current_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("inferd_request_id", default="")

# LogRecord attributes that are not user fields; anything else passed in `extra` is emitted.
_STANDARD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", ""):
            record.request_id = current_request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRIBUTES and value not in ("", None):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s%(rid)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", "")
        record.rid = f" [{request_id}]" if request_id else ""
        return super().format(record)


def configure_logging(log_format: LogFormat, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format is LogFormat.JSON else TextFormatter())
    handler.addFilter(_RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


@dataclass(slots=True)
class _Bucket:
    tokens: float
    refilled_s: float
    suppressed: int = 0


class RequestErrorLog:
    """The log lines of the errors requests are answered with. A server fault is always logged; a
    client's mistake or an overload refusal is a warning, `burst` of each kind at once and then
    one a second, the next line saying how many like it were left out. Those come in floods
    (4x MiniLM's throughput sheds 300 requests a second, a hostile client sends bad requests as
    fast as it can): a line each cost the event loop a twentieth of its time and fills disks. The
    kinds (a door and an error code) are a fixed set, so the buckets are bounded."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 10,
        per_second: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._burst = burst
        self._per_second = per_second
        self._clock = clock
        self._buckets: dict[Hashable, _Bucket] = {}

    def log(self, fault: bool, kind: Hashable, message: str, *args: object, extra: dict[str, Any]) -> None:
        if fault:
            self._logger.error(message, *args, extra=extra)
            return
        now = self._clock()
        bucket = self._buckets.get(kind)
        if bucket is None:
            bucket = self._buckets[kind] = _Bucket(self._burst, now)
        bucket.tokens = min(self._burst, bucket.tokens + (now - bucket.refilled_s) * self._per_second)
        bucket.refilled_s = now
        if bucket.tokens < 1:
            bucket.suppressed += 1
            return
        bucket.tokens -= 1
        if bucket.suppressed:
            message += " (%d more like it not logged)"
            args = (*args, bucket.suppressed)
            extra = {**extra, "suppressed": bucket.suppressed}
            bucket.suppressed = 0
        self._logger.warning(message, *args, extra=extra)

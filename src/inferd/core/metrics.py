"""What core reports about its work. The Prometheus adapter lives in `server.prometheus`; core only
knows this protocol, so tests and tools can run it with no metrics at all."""

from __future__ import annotations

from typing import Protocol


class Metrics(Protocol):
    def request_finished(self, model: str, version: str, outcome: str, duration_s: float) -> None:
        """`outcome` is "success" or the failing ErrorCode's value; `version` "" if none was resolved."""
        ...


class NoMetrics:
    def request_finished(self, model: str, version: str, outcome: str, duration_s: float) -> None:
        return None

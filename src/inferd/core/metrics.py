"""What core reports about its work. The Prometheus adapter lives in `server.prometheus`; core only
knows this protocol, so tests and tools can run it with no metrics at all."""

from __future__ import annotations

from typing import Protocol

from inferd.types import Timing


class Metrics(Protocol):
    def request_finished(self, model: str, version: str, outcome: str, duration_s: float, timing: Timing) -> None:
        """`outcome` is "success" or the failing ErrorCode's value; `version` "" if none was resolved."""
        ...

    def batch_executed(self, model: str, version: str, rows: int, compute_s: float) -> None:
        """One execution of the runtime, on a batch of `rows` rows from one or more requests."""
        ...


class NoMetrics:
    def request_finished(self, model: str, version: str, outcome: str, duration_s: float, timing: Timing) -> None:
        return None

    def batch_executed(self, model: str, version: str, rows: int, compute_s: float) -> None:
        return None

"""What core reports about its work, and to whom. The Prometheus adapter lives in
`server.prometheus`; core only knows this protocol, so tests and tools can run with no metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from inferd.types import LoadTimings, RequestTiming

# Why a version loaded, the label its phases are counted under: asked (startup, a poll, the load
# API, on demand under a budget), or the first request after its model was scaled to zero.
LOAD = "load"
COLD_START = "cold_start"
LOAD_CAUSES = (LOAD, COLD_START)


class Metrics(Protocol):
    def request_finished(
        self,
        model: str,
        version: str,
        protocol: str,
        outcome: str,
        duration_s: float,
        rows: int,
        timing: RequestTiming,
    ) -> None:
        """`outcome` is "success" or the failing ErrorCode's value; `protocol` the door it came by."""
        ...

    def request_unresolved(self, protocol: str, outcome: str) -> None:
        """A request that found no model version to serve it (unknown, or not ready) ended with `outcome`."""
        ...

    def response_encoded(self, model: str, version: str, protocol: str, encode_s: float) -> None:
        """A response to a request that came by `protocol` (its door) was written in `encode_s`."""
        ...

    def shadow_finished(self, endpoint: str, shadow: str, outcome: str, duration_s: float) -> None:
        """A copy of a request to `endpoint` sent to its `shadow` ended with `outcome`."""
        ...

    def shadow_dropped(self, endpoint: str, shadow: str) -> None:
        """A copy was not sent: the shadow had as many copies waiting and running as it may."""
        ...

    def shadow_compared(self, endpoint: str, shadow: str, agreed: bool, diffs: Mapping[str, float]) -> None:
        """A shadow's answer was compared with the primary's: whether they agreed, |diff| max by output."""
        ...

    def batch_executed(self, model: str, version: str, rows: int, compute_infer_s: float) -> None:
        """One execution of the runtime, on a batch of `rows` rows from one or more requests."""
        ...

    def version_loaded(self, model: str, timings: LoadTimings, cause: str = LOAD) -> None:
        """A version loaded, its phases counted under `cause` ("load", or "cold_start": the first
        request after the model was scaled to zero)."""
        ...

    def version_load_failed(self, model: str) -> None: ...

    def model_unloaded(self, model: str) -> None: ...

    def model_evicted(self, model: str) -> None: ...

    def model_scaled_to_zero(self, model: str) -> None:
        """A model was unloaded because it stayed idle for its idle_unload_seconds."""
        ...

    def on_demand_hit(self) -> None:
        """A request found its model loaded (counted only when on-demand loading is on)."""
        ...

    def on_demand_miss(self) -> None:
        """A request found its model not loaded and loads it."""
        ...

    def cache_answered(self, model: str, version: str, hit: bool, duration_s: float) -> None:
        """The response cache had the request's answer (`hit`) or not, after `duration_s` in it."""
        ...

    def cache_evicted(self, model: str) -> None:
        """An answer of `model` left the response cache for the byte budget."""
        ...

    def cache_size(self, size_bytes: int) -> None:
        """What the response cache's local entries hold now."""
        ...

    def cache_redis_failed(self) -> None:
        """A command of the response cache's Redis tier failed or timed out (a miss), or an entry there did not read."""
        ...


class NoMetrics:
    def cache_answered(self, model: str, version: str, hit: bool, duration_s: float) -> None:
        return None

    def cache_evicted(self, model: str) -> None:
        return None

    def cache_size(self, size_bytes: int) -> None:
        return None

    def cache_redis_failed(self) -> None:
        return None

    def request_finished(
        self,
        model: str,
        version: str,
        protocol: str,
        outcome: str,
        duration_s: float,
        rows: int,
        timing: RequestTiming,
    ) -> None:
        return None

    def request_unresolved(self, protocol: str, outcome: str) -> None:
        return None

    def response_encoded(self, model: str, version: str, protocol: str, encode_s: float) -> None:
        return None

    def shadow_finished(self, endpoint: str, shadow: str, outcome: str, duration_s: float) -> None:
        return None

    def shadow_dropped(self, endpoint: str, shadow: str) -> None:
        return None

    def shadow_compared(self, endpoint: str, shadow: str, agreed: bool, diffs: Mapping[str, float]) -> None:
        return None

    def batch_executed(self, model: str, version: str, rows: int, compute_infer_s: float) -> None:
        return None

    def version_loaded(self, model: str, timings: LoadTimings, cause: str = LOAD) -> None:
        return None

    def version_load_failed(self, model: str) -> None:
        return None

    def model_unloaded(self, model: str) -> None:
        return None

    def model_evicted(self, model: str) -> None:
        return None

    def model_scaled_to_zero(self, model: str) -> None:
        return None

    def on_demand_hit(self) -> None:
        return None

    def on_demand_miss(self) -> None:
        return None

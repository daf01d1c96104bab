"""Fakes for unit tests: a runtime that doubles its input and records every batch it ran."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inferd.config.model import ModelSignature, TensorSpec
from inferd.core.scheduler import Work
from inferd.errors import InvalidRequestError
from inferd.types import DataType, InferRequest, RequestContext, RequestTiming


class FakeRuntime:
    """y = 2 * x. Rejects a batch holding a negative value (as an engine rejects bad input).

    `gate`, when given, holds every execution until it is set, so a test can keep an instance busy;
    `may_run_inline` False stands for a runtime that may block (a Python model); `extra_rows`
    (negative: fewer) makes it answer that many rows more than it got, as a broken model would.
    """

    def __init__(
        self,
        gate: threading.Event | None = None,
        compute_s: float = 0.0,
        *,
        may_run_inline: bool = True,
        extra_rows: int = 0,
    ) -> None:
        self.may_run_inline = may_run_inline
        self.extra_rows = extra_rows
        self.batches: list[int] = []
        self.gate = gate
        # Stands for the model's own compute time (a busy wait: it holds the thread as compute does).
        self.compute_s = compute_s
        self.signature = ModelSignature(
            inputs=(TensorSpec("x", DataType.FP32, (-1, -1)),), outputs=(TensorSpec("y", DataType.FP32, (-1, -1)),)
        )
        self.started = threading.Event()

    def execute(
        self, inputs: Mapping[str, np.ndarray[Any, Any]], output_names: Sequence[str], deadline_s: float | None = None
    ) -> dict[str, Any]:
        self.started.set()
        if self.gate is not None:
            self.gate.wait(timeout=30)
        if self.compute_s:
            until = time.perf_counter() + self.compute_s
            while time.perf_counter() < until:
                pass
        x = inputs["x"]
        self.batches.append(int(x.shape[0]))
        if (x < 0).any():
            raise InvalidRequestError("negative input")
        y = x * 2
        if self.extra_rows > 0:
            y = np.concatenate([y, y[: self.extra_rows]])
        elif self.extra_rows < 0:
            y = y[: self.extra_rows]
        return {"y": y}

    def close(self) -> None:
        return None


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def fake_work(
    feeds: Mapping[str, np.ndarray[Any, Any]],
    names: Sequence[str] = ("y",),
    *,
    timing: RequestTiming | None = None,
    request_id: str = "r",
    parameters: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Work:
    """A scheduler's unit of work for `feeds` (rows: their first dimension), its request bare."""
    request = InferRequest(
        model_name="fake",
        model_version="",
        inputs=(),
        parameters=parameters or {},
        context=RequestContext(request_id, timing=timing or RequestTiming()),
    )
    rows = next(iter(feeds.values())).shape[0]
    return Work(request, feeds, rows, names, **fields)

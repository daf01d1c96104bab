"""Shadow variants: a copy of an endpoint's sampled requests goes to a candidate model after the
client has its answer; the candidate's answer is compared with the client's, never sent.

A shadow must cost the clients nothing, so:

- the copy is made only once the primary answer exists (the inference call offers it, and the
  copy's task runs after the call has handed its answer to the transport), from the request's
  decoded tensors: nothing is read or decoded again;
- it runs in the BACKGROUND admission class (`core.scheduler`): only in the room real-time
  requests leave, never ahead of one;
- at most `MAX_RUNNING` copies of one shadow run at once and `MAX_WAITING` wait; a copy beyond
  them is dropped and counted (`inferd_shadow_dropped_total`), so a slow shadow holds at most
  that many requests' tensors, whatever the rate;
- its errors reach no client; a shadow that keeps failing (`OFF_AFTER_FAILURES` in a row) turns
  itself off and says why, until the endpoint is set again.

Each answer is compared with the primary's as `inferd validate` compares (`inferd.comparison`,
its default tolerances): whether they agree, and the largest |diff| seen per output. With
`"log": true` each compared pair is appended to `<state dir>/shadow/<endpoint>.<shadow>.jsonl`,
one line a pair: the request's inputs by name (what `inferd validate --inputs` reads, so the two
models can be compared offline on the very traffic) and both answers under `"_answers"`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from inferd.comparison import Tolerances, compare_output
from inferd.core.metrics import Metrics
from inferd.core.request_window import SUCCESS, RequestWindow
from inferd.errors import InferdError
from inferd.types import SHADOW_COPY, DataType, InferRequest, InferResponse, RequestContext, Tensor

logger = logging.getLogger(__name__)

MAX_RUNNING = 4
MAX_WAITING = 64
OFF_AFTER_FAILURES = 50
# A failed copy's outcome in its shadow's window (the error code is in the log line that says why).
FAILED = "failed"
# A shadow's log keeps at most this many pairs; then it stops, and says so once.
MAX_LOGGED_PAIRS = 10_000

# Runs a copy as a request of its own (the dispatcher's infer, in the background admission class).
ShadowInfer = Callable[[InferRequest], Awaitable[InferResponse]]


@dataclass
class ShadowState:
    """One shadow variant as it runs: its sampling, queue, counts, comparisons and whether it is on."""

    endpoint: str
    name: str
    model: str
    version: str
    sample: float
    log: Path | None = None
    clock: Callable[[], float] = time.monotonic
    window: RequestWindow = field(init=False)
    waiting_or_running: int = 0
    dropped: int = 0
    compared: int = 0
    agreed: int = 0
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    # (compared, agreed) by the variant whose answer was the primary: a rollout's drift guard reads
    # the baseline's (the others' would blame the baseline for a third variant's answers).
    by_variant: dict[str, tuple[int, int]] = field(default_factory=dict)
    off_reason: str = ""
    logged: int = 0
    _credit: float = 0.0
    _failures_in_a_row: int = 0
    _running: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.window = RequestWindow(self.clock)
        self._running = asyncio.Semaphore(MAX_RUNNING)

    def sampled(self) -> bool:
        """Whether this request is copied: exactly `sample` of them, spread evenly (no RNG)."""
        self._credit += self.sample
        if self._credit >= 1.0:
            self._credit -= 1.0
            return True
        return False

    def failed(self, latency_s: float, why: str) -> None:
        self.window.observe(latency_s, FAILED)
        self._failures_in_a_row += 1
        if self._failures_in_a_row >= OFF_AFTER_FAILURES and not self.off_reason:
            self.off_reason = f"turned off after {self._failures_in_a_row} failures in a row; the last: {why}"
            logger.warning("endpoint '%s': shadow '%s' %s", self.endpoint, self.name, self.off_reason)

    def succeeded(self, latency_s: float, agreed: bool, diffs: dict[str, float], answered_by: str = "") -> None:
        """A copy's answer compared with the primary's, which the variant `answered_by` gave."""
        self.window.observe(latency_s, SUCCESS)
        self._failures_in_a_row = 0
        self.compared += 1
        self.agreed += agreed
        compared, agreed_before = self.by_variant.get(answered_by, (0, 0))
        self.by_variant[answered_by] = (compared + 1, agreed_before + agreed)
        for output, diff in diffs.items():
            self.max_abs_diff[output] = max(diff, self.max_abs_diff.get(output, 0.0))


class ShadowTraffic:
    """Copies requests to shadows and compares the answers; one for the server."""

    def __init__(self, infer: ShadowInfer, metrics: Metrics) -> None:
        self._infer = infer
        self._metrics = metrics
        self._tasks: set[asyncio.Task[None]] = set()

    def offer(self, shadows: list[ShadowState], request: InferRequest, response: InferResponse) -> None:
        """A primary `response` to `request` exists: copy the request to each shadow that samples it."""
        for shadow in shadows:
            if shadow.off_reason or not shadow.sampled():
                continue
            if shadow.waiting_or_running >= MAX_RUNNING + MAX_WAITING:
                shadow.dropped += 1
                self._metrics.shadow_dropped(shadow.endpoint, shadow.name)
                continue
            shadow.waiting_or_running += 1
            task = asyncio.get_running_loop().create_task(self._run(shadow, request, response))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, shadow: ShadowState, request: InferRequest, primary: InferResponse) -> None:
        try:
            async with shadow._running:
                context = RequestContext(request.context.request_id, None, SHADOW_COPY)
                copy = replace(request, model_name=shadow.model, model_version=shadow.version, context=context)
                started = time.perf_counter()
                try:
                    answer = await self._infer(copy)
                except InferdError as exc:
                    elapsed = time.perf_counter() - started
                    shadow.failed(elapsed, f"{exc.code.value}: {exc.message}")
                    self._metrics.shadow_finished(shadow.endpoint, shadow.name, exc.code.value, elapsed)
                    return
                elapsed = time.perf_counter() - started
                agreed, diffs = compare(primary, answer)
                route = request.context.route
                shadow.succeeded(elapsed, agreed, diffs, route.variant if route is not None else "")
                self._metrics.shadow_finished(shadow.endpoint, shadow.name, "success", elapsed)
                self._metrics.shadow_compared(shadow.endpoint, shadow.name, agreed, diffs)
                if shadow.log is not None and shadow.logged < MAX_LOGGED_PAIRS:
                    shadow.logged += 1
                    line = pair_line(request, primary, answer, agreed)
                    await asyncio.to_thread(_append, shadow.log, line)
                    if shadow.logged == MAX_LOGGED_PAIRS:
                        logger.warning("shadow log %s holds %d pairs: it takes no more", shadow.log, MAX_LOGGED_PAIRS)
        finally:
            shadow.waiting_or_running -= 1

    async def close(self) -> None:
        """Stop the copies still waiting or running (a shutdown: clients are not waiting on them)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def compare(primary: InferResponse, shadow: InferResponse) -> tuple[bool, dict[str, float]]:
    """Whether the shadow's answer agrees with the primary's (each output within `inferd validate`'s
    default tolerances; text outputs equal), and the largest |diff| of each numeric output."""
    agreed, diffs = True, {}
    theirs = {tensor.name: tensor for tensor in shadow.outputs}
    for tensor in primary.outputs:
        other = theirs.get(tensor.name)
        if other is None or other.data.shape != tensor.data.shape:
            agreed = False
            continue
        if tensor.datatype is DataType.BYTES or other.datatype is DataType.BYTES:
            agreed &= bool(np.array_equal(tensor.data, other.data))
            continue
        comparison = compare_output(tensor.name, [tensor.data], [other.data], Tolerances())
        diffs[tensor.name] = comparison.abs_diff_max
        agreed &= comparison.passed
    return agreed, diffs


def pair_line(request: InferRequest, primary: InferResponse, shadow: InferResponse, agreed: bool) -> str:
    """One compared pair as JSON: the inputs by name (`inferd validate --inputs` reads them), then
    both answers and the verdict."""
    document: dict[str, Any] = {tensor.name: _json_tensor(tensor) for tensor in request.inputs}
    document["_answers"] = {
        "request_id": request.context.request_id,
        "agreed": agreed,
        "primary": {t.name: _json_tensor(t) for t in primary.outputs},
        "shadow": {t.name: _json_tensor(t) for t in shadow.outputs},
    }
    return json.dumps(document)


def _json_tensor(tensor: Tensor) -> dict[str, Any]:
    if tensor.datatype is DataType.BYTES:
        content: list[Any] = [bytes(v).decode("utf-8", "replace") for v in tensor.data.reshape(-1)]
    else:
        content = tensor.data.reshape(-1).tolist()
    return {"content": content, "shape": list(tensor.data.shape)}


def _append(path: Path, line: str) -> None:
    with path.open("a", encoding="utf-8") as file:
        file.write(line + "\n")

"""Generated requests (`inferd.testing.strategies`) thrown at every door of a real server, HTTP
and gRPC (KServe's ModelInfer, TF Serving's Predict): bodies near valid and far from it, headers,
versions and models of every kind. Whatever arrives, the answer is a 2xx, a 4xx or a 503 that says
to retry (overload, not ready), never another 5xx and never a hang, and the server keeps serving.
The counts are printed (`-s`) and checked, so a generator that stopped generating cannot pass
unnoticed; `benchmarks/fuzz.py` runs the same calls by the hundred thousand."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from inferd.testing.doors import EveryDoor
from inferd.testing.fuzzing import GrpcSender, HttpSender, Tally
from inferd.testing.strategies import GrpcCall, HttpCall, grpc_calls, http_calls
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e

HTTP_CALLS = 400
GRPC_CALLS = 150
TIMEOUT_S = 10.0
SETTINGS = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def tally() -> Iterator[Tally]:
    counted = Tally()
    yield counted
    print(f"\nfuzzed {counted.requests} requests: {dict(counted.by_class)}; by door {dict(counted.by_door)}")


def check(tally: Tally, before: int, wanted: int, every_door: EveryDoor) -> None:
    sent = tally.requests - before
    assert tally.failures == [], "\n".join(tally.failures)
    # hypothesis may stop short of max_examples when it runs out of distinct cases; never far short.
    assert sent >= wanted // 2, f"only {sent} of {wanted} requests were generated"
    assert every_door.server.process.poll() is None, "the server died"
    assert http_request(every_door.server, "GET", "/v2/health/ready").status == 200


def test_http_doors_answer_no_5xx(every_door: EveryDoor, tally: Tally) -> None:
    sender, before = HttpSender(every_door.server.http_port, TIMEOUT_S), tally.requests

    @settings(SETTINGS, max_examples=HTTP_CALLS)
    @given(call=http_calls())
    def each(call: HttpCall) -> None:
        sender.send(call, tally)

    try:
        each()
    finally:
        sender.close()
    check(tally, before, HTTP_CALLS, every_door)


def test_grpc_doors_answer_no_internal_error(every_door: EveryDoor, tally: Tally) -> None:
    sender, before = GrpcSender(every_door.server.grpc_port, every_door.tfserving_grpc_port, TIMEOUT_S), tally.requests

    @settings(SETTINGS, max_examples=GRPC_CALLS)
    @given(call=grpc_calls())
    def each(call: GrpcCall) -> None:
        sender.send(call, tally)

    try:
        each()
    finally:
        sender.close()
    check(tally, before, GRPC_CALLS, every_door)

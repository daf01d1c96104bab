"""A fleet's figures from the replicas' own /metrics pages (real HTTP servers on 127.0.0.1 serving
pages the test writes), and the histogram quantile as Prometheus computes it."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inferd.server.fleet_metrics import (
    MetricsSourceError,
    ScrapeSource,
    histogram_quantile,
    parse_metrics,
)
from inferd.testing.fakes import FakeClock
from inferd.types import WINDOW_S

pytestmark = pytest.mark.timeout(30)

BOUNDS = (0.001, 0.01, 0.1)


def page(successes: int, errors: int, fast: int, pinned: int = 0) -> str:
    """A replica's endpoint series: variant `green` of endpoint `shop`, `fast` of its successes
    under 1 ms and the others between 10 and 100 ms; `pinned` requests pinned by clients."""
    variant = 'endpoint="shop",variant="green"'
    lines = [
        "# HELP inferd_endpoint_requests_total Inference requests to endpoints.",
        "# TYPE inferd_endpoint_requests_total counter",
        f'inferd_endpoint_requests_total{{{variant},routed="weight",outcome="success"}} {successes}',
        f'inferd_endpoint_requests_total{{{variant},routed="weight",outcome="INTERNAL"}} {errors}',
        f'inferd_endpoint_requests_total{{{variant},routed="pinned",outcome="success"}} {pinned}',
        "# HELP inferd_endpoint_request_duration_seconds Successful requests to endpoints.",
        "# TYPE inferd_endpoint_request_duration_seconds histogram",
    ]
    cumulative = (fast, fast, successes, successes)
    for bound, count in zip((*BOUNDS, math.inf), cumulative, strict=True):
        le = "+Inf" if bound == math.inf else repr(bound)
        lines.append(f'inferd_endpoint_request_duration_seconds_bucket{{{variant},routed="weight",le="{le}"}} {count}')
    lines.append(f'inferd_endpoint_request_duration_seconds_count{{{variant},routed="weight"}} {successes}')
    lines.append(f'inferd_endpoint_request_duration_seconds_sum{{{variant},routed="weight"}} 1.0')
    return "\n".join(lines) + "\n"


class Replica:
    """A /metrics page on 127.0.0.1, what the test set last (or no answer at all)."""

    def __init__(self) -> None:
        self.text = page(0, 0, 0)
        self.down = False
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if replica.down:
                    self.send_error(503)
                    return
                body = replica.text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replicas() -> Iterator[tuple[Replica, Replica]]:
    pair = (Replica(), Replica())
    yield pair
    for replica in pair:
        replica.close()


def test_a_page_is_read_for_requests_routed_by_weight_only() -> None:
    counts = parse_metrics(page(90, 10, 60, pinned=5))[("shop", "green")]
    assert (counts.requests, counts.errors) == (100, 10)  # the 5 pinned are not the judge's
    assert counts.buckets == {0.001: 60, 0.01: 60, 0.1: 90, math.inf: 90}


def test_the_quantile_is_prometheus_histogram_quantile() -> None:
    buckets = {0.001: 60.0, 0.01: 60.0, 0.1: 90.0, math.inf: 90.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.001 * 45 / 60)  # within the first, from 0
    assert histogram_quantile(0.9, buckets) == pytest.approx(0.01 + 0.09 * (81 - 60) / 30)
    # A rank in +Inf's bucket is the highest finite bound.
    assert histogram_quantile(0.99, {0.1: 50.0, math.inf: 100.0}) == 0.1
    assert histogram_quantile(0.99, {0.1: 0.0, math.inf: 0.0}) is None


def test_a_window_is_the_replicas_counts_since_its_start_summed(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    clock = FakeClock()
    source = ScrapeSource([a.address, f"http://{b.address}/metrics"], clock=clock)

    async def scenario() -> None:
        a.text, b.text = page(100, 0, 100), page(50, 50, 50)  # before the window
        await source.refresh()
        clock.advance(30)
        a.text, b.text = page(190, 10, 190), page(60, 60, 60)
        summary = await source.summary("shop", "green", 20)
        # Over the last 20 s: A 90 successes and 10 failures, B 10 and 10.
        assert (summary.requests, summary.errors) == (120, 20)
        assert summary.p99_ms is not None and summary.p99_ms < 1.0  # every success under 1 ms
        # Requests are counted from the first reading of each replica (not their whole lives).
        assert await source.requests("shop", "green") == 100 + 20
        # B restarts: its counters start again from zero, and all it counted since is new (what it
        # counted in the window before the restart stays counted).
        clock.advance(1)
        b.text = page(5, 5, 0)
        summary = await source.summary("shop", "green", 20)
        assert (summary.requests, summary.errors) == (130, 25)
        assert await source.requests("shop", "green") == 120 + 10  # never back, whatever restarts
        assert summary.p99_ms is not None and 10 < summary.p99_ms <= 100  # B's 5 successes were slow

    asyncio.run(scenario())


def test_a_replica_that_does_not_answer_keeps_its_last_reading_and_none_answering_is_an_error(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    clock = FakeClock()
    source = ScrapeSource([a.address, b.address], clock=clock)

    async def scenario() -> None:
        a.text, b.text = page(10, 0, 10), page(10, 0, 10)
        await source.refresh()
        clock.advance(1)
        b.down = True
        a.text = page(20, 0, 20)
        assert await source.requests("shop", "green") == 10
        assert list(source.unanswered) == [f"http://{b.address}/metrics"]
        # Back, with what it counted meanwhile: counted once.
        clock.advance(1)
        b.down, b.text = False, page(25, 0, 25)
        assert await source.requests("shop", "green") == 10 + 15
        clock.advance(1)
        b.text = "not a metrics page {"  # left out, as one that does not answer
        assert await source.requests("shop", "green") == 25 and list(source.unanswered)
        clock.advance(1)
        a.down = True
        with pytest.raises(MetricsSourceError, match="no replica answered"):
            await source.refresh()

    asyncio.run(scenario())


def test_readings_older_than_the_window_are_dropped(replicas: tuple[Replica, Replica]) -> None:
    a, _ = replicas
    clock = FakeClock()
    source = ScrapeSource([a.address], clock=clock)

    async def scenario() -> None:
        for second in range(100):
            clock.advance(0 if second == 0 else 1)
            a.text = page(4 * second, 0, 4 * second)
            await source.refresh()
        kept = source._readings[source.replicas[0]]
        assert len(kept) <= WINDOW_S + 2
        # The minute's window still starts where it should: 60 readings of 4 requests.
        assert (await source.summary("shop", "green", WINDOW_S)).requests == 4 * 60

    asyncio.run(scenario())


def test_a_replica_is_named_by_host_and_port_or_url() -> None:
    with pytest.raises(ValueError, match="is not host:port"):
        ScrapeSource(["ftp://somewhere/metrics"])
    assert ScrapeSource(["127.0.0.1:9100"]).replicas == ["http://127.0.0.1:9100/metrics"]
    assert ScrapeSource(["https://r1:9100/custom"]).replicas == ["https://r1:9100/custom"]

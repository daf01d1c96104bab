"""Endpoints' routing: weights, pins and sticky keys, and each variant's window of requests."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from inferd.core.endpoints import (
    MAX_PRECOMPUTED_PICKS,
    Endpoint,
    Endpoints,
    EndpointSpec,
    RoundRobin,
    Shadow,
    Variant,
    rendezvous,
    round_robin_period,
    spec_document,
    spec_from_document,
)
from inferd.core.request_window import WINDOW_MAX_REQUESTS, RequestWindow, combined_summary
from inferd.core.state_dir import StateDir
from inferd.core.statistics import LATENCY_BUCKETS_S, Histogram
from inferd.errors import InvalidRequestError
from inferd.testing.fakes import FakeClock
from inferd.types import WINDOW_S

pytestmark = pytest.mark.timeout(30)


def spec(*weights: float, sticky: str = "") -> EndpointSpec:
    names = ("blue", "green", "red", "gold")
    return EndpointSpec(
        "e", tuple(Variant(names[i], f"m{i}", "", weight) for i, weight in enumerate(weights)), sticky=sticky
    )


def test_weights_split_requests_exactly_and_spread_out() -> None:
    endpoint = Endpoint(spec(90, 10))
    picks = [endpoint.route().variant for _ in range(5000)]
    assert Counter(picks) == {"blue": 4500, "green": 500}
    # Spread: no run of blue is longer than the weights allow (9 blues between greens).
    runs = "".join("b" if p == "blue" else "g" for p in picks).split("g")
    assert max(len(run) for run in runs) <= 9


def test_round_robin_keeps_fractional_weights_shares() -> None:
    rr = RoundRobin([1.5, 0.5, 0.0])
    picks = Counter(rr.pick() for _ in range(4000))
    assert picks == {0: 3000, 1: 1000}


@pytest.mark.parametrize(
    ("weights", "scaled"),
    [
        ((90, 10), (9, 1)),
        ((1.5, 0.5, 0.0), (3, 1, 0)),
        ((20000, 10000), (2, 1)),
        ((9999, 1), (9999, 1)),  # a period of MAX_PRECOMPUTED_PICKS, the longest made in advance
        ((0.9, 0.1), (9, 1)),
        ((0.7, 0.2, 0.1), (7, 2, 1)),
        ((33.3, 66.7), (333, 667)),
        ((0.001, 0.999), (1, 999)),
        ((1,), (1,)),
    ],
)
def test_a_short_period_of_picks_is_made_in_advance_with_exact_shares(
    weights: tuple[float, ...], scaled: tuple[int, ...]
) -> None:
    period = round_robin_period(weights)
    assert period is not None and len(period) == sum(scaled)
    assert Counter(period) == {index: count for index, count in enumerate(scaled) if count}
    if all(float(weight * 2).is_integer() for weight in weights):
        # Weights whose sums are exact in floats (halves): the very picks the round robin makes live.
        live = RoundRobin(weights)
        assert period == [live.pick() for _ in range(len(period))]
    # Spread as the round robin spreads: no variant waits more than its share's gap for a pick.
    for index, count in enumerate(scaled):
        if count:
            at = [i for i, pick in enumerate(period + period) if pick == index]
            assert max(b - a for a, b in itertools.pairwise(at)) <= math.ceil(len(period) / count) + 1
    # An endpoint of those weights routes by the period, again and again.
    endpoint = Endpoint(EndpointSpec("e", tuple(Variant(f"v{i}", "m", "", w) for i, w in enumerate(weights))))
    assert [endpoint.route().variant for _ in range(3 * len(period))] == [f"v{i}" for i in period] * 3


@pytest.mark.parametrize(
    "weights",
    [(0.12345, 1), (MAX_PRECOMPUTED_PICKS, 1), (1,) * 400, (1e308, 1e308, 1e307)],
    ids=["digits", "long-period", "many-variants", "huge"],
)
def test_weights_of_a_long_period_are_picked_live_with_the_same_shares(weights: tuple[float, ...]) -> None:
    assert round_robin_period(weights) is None
    endpoint = Endpoint(EndpointSpec("e", tuple(Variant(f"v{i}", "m", "", w) for i, w in enumerate(weights))))
    live = RoundRobin(weights)
    picks = [endpoint.route().variant for _ in range(2000)]
    assert picks == [f"v{live.pick()}" for _ in range(2000)]
    if len(weights) == 400:  # each in turn
        assert picks[:800] == [f"v{i}" for i in range(400)] * 2
    if weights[0] == 1e308:  # weights whose sum is not a float: scaled, so 10/10/1 as they say
        counts = Counter(picks)
        assert all(abs(counts[f"v{i}"] - 2000 * share / 21) <= 1 for i, share in enumerate((10, 10, 1)))


def test_a_pinned_variant_is_served_whatever_its_weight() -> None:
    endpoint = Endpoint(spec(100, 0))
    assert {endpoint.route(pinned="green").variant for _ in range(10)} == {"green"}
    with pytest.raises(InvalidRequestError, match="has no variant 'nope' \\(its variants: blue, green\\)"):
        endpoint.route(pinned="nope")


def test_a_sticky_key_keeps_its_variant_and_the_shares_hold() -> None:
    endpoint = Endpoint(spec(80, 20, sticky="X-User-Id"))
    keys = [f"user-{i}" for i in range(2000)]
    first = {key: endpoint.route(key=key).variant for key in keys}
    for _ in range(3):
        assert {key: endpoint.route(key=key).variant for key in keys} == first
    share = Counter(first.values())["green"] / len(keys)
    assert abs(share - 0.2) < 0.03, share
    # Another process, another replica: the same keys reach the same variants (nothing but the key
    # and the variants' names and weights decides).
    assert {key: Endpoint(spec(80, 20, sticky="X-User-Id")).route(key=key).variant for key in keys} == first


def test_without_sticky_a_key_is_ignored() -> None:
    endpoint = Endpoint(spec(50, 50))
    assert [endpoint.route(key="same").variant for _ in range(4)] == ["blue", "green", "blue", "green"]


def moves(before: EndpointSpec, after: EndpointSpec, keys: list[str]) -> list[tuple[str, str]]:
    """(old variant, new variant) of each key whose variant changed."""
    pairs = [
        (before.variants[rendezvous(key, before.variants)].name, after.variants[rendezvous(key, after.variants)].name)
        for key in keys
    ]
    return [(old, new) for old, new in pairs if old != new]


KEYS = [f"user-{i}" for i in range(3000)]


def test_raising_a_canary_from_10_to_20_percent_moves_only_keys_to_it() -> None:
    changed = moves(spec(90, 10, sticky="k"), spec(80, 20, sticky="k"), KEYS)
    assert changed and set(changed) == {("blue", "green")}
    # The share green gained (a tenth of the keys), not a reshuffle.
    assert abs(len(changed) / len(KEYS) - 0.10) < 0.02, len(changed)


def test_weights_are_relative_so_raising_one_moves_keys_only_to_it() -> None:
    # Three variants: raising green alone (the others' weights as they were) moves keys only to green.
    changed = moves(spec(80, 10, 10, sticky="k"), spec(80, 20, 10, sticky="k"), KEYS)
    assert changed and {new for _, new in changed} == {"green"}


def test_a_key_moves_only_off_a_variant_that_lost_or_onto_one_that_gained() -> None:
    changed = moves(spec(80, 10, 10, sticky="k"), spec(70, 20, 10, sticky="k"), KEYS)
    assert changed and all(old == "blue" or new == "green" for old, new in changed)


def test_a_zero_weight_variant_gets_no_sticky_keys() -> None:
    variants = spec(1, 0, sticky="k").variants
    assert {rendezvous(f"k{i}", variants) for i in range(500)} == {0}


@pytest.mark.parametrize(
    ("variants", "sticky", "message"),
    [
        ((), "", "has no variants"),
        ((Variant("a", "m"), Variant("a", "m2")), "", "names variant 'a' more than once"),
        ((Variant("a", "m", weight=0),), "", "every weight is 0"),
        ((Variant("a", "m", weight=-1),), "", "is not a number >= 0"),
        ((Variant("a", "m", weight=math.nan),), "", "is not a number >= 0"),
        ((Variant("a", "m", version="x"),), "", "version 'x' is not a number"),
        ((Variant("a/b", "m"),), "", "variant name 'a/b'"),
        ((Variant("a", ""),), "", "names no model"),
        ((Variant("a", "m"),), "bad header", "is not a header name"),
    ],
)
def test_a_spec_that_cannot_serve_is_refused_saying_why(
    variants: tuple[Variant, ...], sticky: str, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        EndpointSpec("e", variants, sticky)


def test_a_window_reports_the_last_minute_only() -> None:
    clock = FakeClock()
    window = RequestWindow(clock)
    for i in range(100):
        window.observe(i / 1000, "INTERNAL" if i % 10 == 0 else "success")
    clock.advance(WINDOW_S / 2)
    for _ in range(50):
        window.observe(0.5, "success")
    summary = window.summary()
    assert (summary.requests, summary.errors) == (150, 10)
    clock.advance(WINDOW_S / 2 + 1)
    summary = window.summary()
    assert (summary.requests, summary.errors, summary.p50_ms, summary.p99_ms) == (50, 0, 500.0, 500.0)
    assert (window.requests_total, window.errors_total) == (150, 10)
    clock.advance(WINDOW_S)
    assert window.summary().requests == 0 and window.summary().p99_ms is None


def test_a_reader_between_a_requests_two_appends_sees_only_whole_requests() -> None:
    """`observe` appends a request's time, then its seconds: /metrics' thread may read in between,
    and must neither count the half-written request nor pair a time with the wrong seconds."""
    clock = FakeClock()
    window = RequestWindow(clock)
    window.observe(0.002, "success")
    window.observe(0.004, "INTERNAL")
    window._append(clock())  # the next request's time, its seconds not yet appended
    summary = window.summary()
    assert (summary.requests, summary.errors, summary.p50_ms) == (2, 1, pytest.approx(3.0))
    totals = window.totals()
    assert totals.outcomes == {"success": 1, "INTERNAL": 1} and totals.seconds_total == pytest.approx(0.002)
    assert window.requests_total == 2


def test_a_success_recorded_without_a_frame_counts_as_observe_counts_it_and_trim_holds_the_bound() -> None:
    clock = FakeClock()
    fast, slow = RequestWindow(clock), RequestWindow(clock)
    count = 2 * WINDOW_MAX_REQUESTS
    for index in range(count):
        fast.succeeded([fast.clock(), index / 1e6])
        slow.observe(index / 1e6, "success")  # drops the oldest an eighth at a time, as it goes
    assert fast.summary().requests == count > slow.summary().requests  # held until trimmed
    fast.trim()  # what the server does every TRIM_INTERVAL_S: the newest kept, the totals whole
    trimmed, told = fast.totals(), slow.totals()
    assert fast.summary().requests == WINDOW_MAX_REQUESTS and trimmed.outcomes == told.outcomes
    assert trimmed.bucket_counts == told.bucket_counts and trimmed.seconds_total == pytest.approx(told.seconds_total)
    assert fast.requests_total == slow.requests_total == count
    assert fast.summary().p50_ms == pytest.approx((count - WINDOW_MAX_REQUESTS / 2) / 1000, abs=0.002)
    endpoints = Endpoints(clock)
    endpoint = endpoints.set(spec(90, 10))
    route = endpoint.route()
    for _ in range(2 * WINDOW_MAX_REQUESTS + 3):
        route.succeeded([route.clock(), 0.001])
    endpoints.trim()
    assert endpoint.windows[route.variant].summary().requests == WINDOW_MAX_REQUESTS
    assert endpoint.windows[route.variant].requests_total == 2 * WINDOW_MAX_REQUESTS + 3
    pinned = endpoint.route(pinned="green")  # the pinned requests' windows too
    pinned.succeeded([pinned.clock(), 0.001] * (2 * WINDOW_MAX_REQUESTS))
    endpoints.trim()
    assert endpoint.pinned_windows["green"].summary().requests == WINDOW_MAX_REQUESTS


def test_a_changed_endpoint_keeps_the_windows_of_the_variants_it_keeps() -> None:
    endpoints = Endpoints()
    endpoints.set(spec(90, 10)).windows["blue"].observe(0.01, "success")
    changed = endpoints.set(spec(50, 50))
    assert changed.windows["blue"].requests_total == 1
    moved = endpoints.set(EndpointSpec("e", (Variant("blue", "other-model"),)))
    assert moved.windows["blue"].requests_total == 0


def test_specs_survive_the_state_directory(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    kept = [spec(90, 10, sticky="X-User-Id"), EndpointSpec("f", (Variant("only", "m", "2", 1.0),))]
    state.write("endpoints", {"endpoints": [spec_document(s) for s in kept]})
    again = StateDir(tmp_path / "state").read("endpoints")
    assert [spec_from_document(entry) for entry in again["endpoints"]] == kept
    assert not list((tmp_path / "state").glob(".*partial"))
    assert StateDir(tmp_path / "other").read("endpoints") is None


def test_shadows_are_checked_and_kept_with_the_spec() -> None:
    with pytest.raises(InvalidRequestError, match="sample 0 is not a share"):
        EndpointSpec("e", (Variant("a", "m"),), shadows=(Shadow("s", "m2", sample=0),))
    with pytest.raises(InvalidRequestError, match="names variant 'a' more than once"):
        EndpointSpec("e", (Variant("a", "m"),), shadows=(Shadow("a", "m2"),))
    kept = EndpointSpec("e", (Variant("a", "m"),), shadows=(Shadow("s", "m2", "3", 0.25, log=True),))
    assert spec_from_document(spec_document(kept)) == kept


def test_variants_windows_sum_up_as_one() -> None:
    clock = FakeClock()
    first, second = RequestWindow(clock), RequestWindow(clock)
    for latency in (0.001, 0.002):
        first.observe(latency, "success")
    second.observe(0.003, "UNAVAILABLE")
    summary = combined_summary([first, second])
    assert (summary.requests, summary.errors, summary.p50_ms) == (3, 1, pytest.approx(2.0))


def test_a_windows_totals_count_every_request_it_was_told_of_as_a_histogram_would() -> None:
    """What /metrics shows: outcomes and the successes' buckets, over requests the window has long
    dropped (by age and by count) as over those it holds; a shed request (0 s, -0.0 once negated)
    is a failure."""
    clock = FakeClock()
    window = RequestWindow(clock)
    reference = Histogram.with_bounds(LATENCY_BUCKETS_S)
    rng = np.random.default_rng(7)
    failures = 0
    for round_index in range(3):
        for latency in [*rng.exponential(0.01, WINDOW_MAX_REQUESTS // 2 + 7).tolist(), 0.001, 0.0025]:
            window.observe(latency, "success")
            reference.observe(latency)
        window.observe(0.0, "UNAVAILABLE")
        failures += 1
        if round_index == 1:
            clock.advance(WINDOW_S + 1)
            assert window.summary().requests == 0  # all dropped by age
        before = window.totals()
        assert before.outcomes == {"success": reference.count, "UNAVAILABLE": failures}
        assert before.bucket_counts == reference.counts
        assert before.seconds_total == pytest.approx(reference.total)
    assert window.requests_total == reference.count + failures and window.errors_total == failures
    endpoints = Endpoints(clock)
    endpoint = endpoints.set(spec(90, 10))
    endpoint.windows["blue"].observe(0.01, "success")
    endpoint.pinned_windows["blue"].observe(0.02, "INVALID_ARGUMENT")
    series = {(name, variant, routed): totals.outcomes for name, variant, routed, totals in endpoints.totals()}
    # By weight and pinned apart (a rollout judges the first); a variant nobody pinned has no pinned
    # series, while every variant's by-weight series is there from zero.
    assert series == {
        ("e", "blue", "weight"): {"success": 1},
        ("e", "blue", "pinned"): {"success": 0, "INVALID_ARGUMENT": 1},
        ("e", "green", "weight"): {"success": 0},
    }


def test_a_rollouts_compared_answers_are_the_candidates_shadows_on_the_baselines_requests() -> None:
    shadows = (Shadow("off", "m1", "", 1.0), Shadow("on", "m1", "", 1.0), Shadow("other", "m2", "", 1.0))
    endpoint = Endpoint(EndpointSpec("e", spec(90, 10, 0).variants, shadows=shadows))
    off, on, _ = endpoint.shadows
    off.off_reason = "turned off after 50 failures in a row"
    on.succeeded(0.001, True, {}, "blue")
    on.succeeded(0.001, False, {}, "blue")
    on.succeeded(0.001, False, {}, "red")  # a third variant's answer is not the baseline's
    assert endpoint.compared_answers("green", "blue") == (2, 1)  # green runs m1: the shadow still on
    assert endpoint.compared_answers("green", "red") == (1, 0)
    assert endpoint.compared_answers("red", "blue") == (0, 0)  # "other" runs red's m2: nothing compared yet
    assert endpoint.compared_answers("blue", "green") is None  # no shadow runs blue's m0

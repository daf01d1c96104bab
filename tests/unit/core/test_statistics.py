"""The statistics keep a request's phases per door it came by, executions per model version, and
answer Triton's statistics extension with every door's numbers added up."""

from __future__ import annotations

import dataclasses

from inferd.core.statistics import ServingStatistics
from inferd.types import ENSEMBLE_STEP, PROTOCOLS, Door, ModelStatistics, RequestTiming

# Binary fractions: sums of them are exact in any order, so totals compare equal, not close.
DECODE_S, QUEUE_S, BATCH_WAIT_S, INFER_S, ENCODE_S = 0.5**10, 0.5**9, 0.5**8, 0.5**7, 0.5**6


def timing(scale: int = 1) -> RequestTiming:
    return RequestTiming(
        decode_s=DECODE_S * scale,
        queue_s=QUEUE_S * scale,
        batch_wait_s=BATCH_WAIT_S * scale,
        compute_infer_s=INFER_S * scale,
        rows=scale,
    )


def served(statistics: ServingStatistics, protocol: str, scale: int = 1) -> None:
    """One successful request by `protocol`, its response written and its execution counted."""
    statistics.request_finished("m", "1", protocol, "success", 0.5**5 * scale, scale, timing(scale))
    statistics.response_encoded("m", "1", protocol, ENCODE_S * scale)
    statistics.batch_executed("m", "1", scale, INFER_S * scale)


def test_each_door_s_requests_have_their_own_phases() -> None:
    statistics = ServingStatistics()
    served(statistics, Door.KSERVE_HTTP)
    served(statistics, Door.KSERVE_GRPC, scale=2)
    served(statistics, Door.KSERVE_GRPC, scale=4)
    phases = statistics.snapshot()[("m", "1")].phases
    assert set(phases) == {"kserve_http", "kserve_grpc"}
    http, grpc = phases["kserve_http"], phases["kserve_grpc"]
    for histogram, one_s in (
        ("duration", 0.5**5),
        ("decode", DECODE_S),
        ("queue", QUEUE_S),
        ("batch_wait", BATCH_WAIT_S),
        ("compute", INFER_S),
        ("encode", ENCODE_S),
    ):
        assert (getattr(http, histogram).count, getattr(http, histogram).total) == (1, one_s), histogram
        assert (getattr(grpc, histogram).count, getattr(grpc, histogram).total) == (2, 6 * one_s), histogram


def test_the_encode_time_lands_under_the_door_given() -> None:
    statistics = ServingStatistics()
    statistics.request_finished("m", "1", "sagemaker", "success", 0.001, 1, timing())
    statistics.response_encoded("m", "1", "sagemaker", ENCODE_S)
    phases = statistics.snapshot()[("m", "1")].phases
    assert set(phases) == {"sagemaker"}
    assert (phases["sagemaker"].encode.count, phases["sagemaker"].encode.total) == (1, ENCODE_S)


def test_executions_stay_per_model_version() -> None:
    """An execution may serve requests of several doors: it is counted once, under no door."""
    statistics = ServingStatistics()
    for protocol in PROTOCOLS:
        served(statistics, protocol)
    stats = statistics.snapshot()[("m", "1")]
    assert set(stats.phases) == set(PROTOCOLS)  # bounded: the doors and the ensemble's steps
    assert stats.execution.count == stats.batch_size.count == len(PROTOCOLS)
    assert stats.batches == {1: [len(PROTOCOLS), INFER_S * len(PROTOCOLS)]}


def test_a_failed_request_is_counted_by_its_door_and_makes_no_phases() -> None:
    statistics = ServingStatistics()
    statistics.request_finished("m", "1", "openai", "INVALID_ARGUMENT", 0.25, 0, RequestTiming())
    stats = statistics.snapshot()[("m", "1")]
    assert stats.outcomes == {("openai", "INVALID_ARGUMENT"): 1}
    assert stats.phases == {}
    failed = statistics.model_statistics("m", "1")
    assert (failed.fail.count, failed.fail.ns, failed.success.count) == (1, 250_000_000, 0)


def test_triton_statistics_add_up_every_door() -> None:
    """The same requests by one door or by many: the statistics extension answers the same."""
    one_door, many_doors = ServingStatistics(), ServingStatistics()
    doors = (Door.KSERVE_HTTP, Door.KSERVE_GRPC, Door.OPENAI, ENSEMBLE_STEP)
    for scale, door in enumerate(doors, start=1):
        served(one_door, Door.KSERVE_HTTP, scale)
        served(many_doors, door, scale)
    one_door.request_finished("m", "1", Door.KSERVE_HTTP, "INTERNAL", 0.125, 0, RequestTiming())
    many_doors.request_finished("m", "1", Door.TORCHSERVE, "INTERNAL", 0.125, 0, RequestTiming())

    expected = one_door.model_statistics("m", "1")
    added = many_doors.model_statistics("m", "1")
    assert without_clock(added) == without_clock(expected)
    # 1 + 2 + 3 + 4 = 10 times one request's numbers, in 4 successes.
    assert (added.success.count, added.success.ns) == (4, int(10 * 0.5**5 * 1e9))
    assert (added.queue.count, added.queue.ns) == (4, int(10 * (QUEUE_S + BATCH_WAIT_S) * 1e9))
    assert (added.compute_infer.count, added.compute_infer.ns) == (4, int(10 * INFER_S * 1e9))
    assert (added.fail.count, added.inference_count, added.execution_count) == (1, 10, 4)


def test_a_snapshot_is_a_copy() -> None:
    statistics = ServingStatistics()
    served(statistics, Door.KSERVE_HTTP)
    snapshot = statistics.snapshot()
    served(statistics, Door.KSERVE_HTTP)
    served(statistics, Door.TFSERVING_GRPC)
    phases = snapshot[("m", "1")].phases
    assert set(phases) == {"kserve_http"}
    assert phases["kserve_http"].duration.count == phases["kserve_http"].encode.count == 1


def without_clock(statistics: ModelStatistics) -> ModelStatistics:
    """`statistics` but for the wall-clock time of its last inference."""
    return dataclasses.replace(statistics, last_inference_ms=0)

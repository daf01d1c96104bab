"""The response cache's logic (core.response_cache): keys that tell apart what answers differently,
fingerprints of what a version runs, the byte budget and TTL, one execution for identical requests,
errors never kept nor shared, and the client's bypass."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest

from inferd.config.model import ModelConfig
from inferd.config.response_cache import CacheSettings, parse_cache_config
from inferd.core.response_cache import (
    ENTRY_OVERHEAD_BYTES,
    ResponseCache,
    request_key,
    version_fingerprint,
    version_key,
)
from inferd.core.statistics import ServingStatistics
from inferd.errors import InternalError
from inferd.types import DataType, InferRequest, InferResponse, RequestContext, RequestedOutput, Tensor

VERSION = version_key("m", 1, b"\1" * 32)


def request(*tensors: Tensor, outputs: tuple[str, ...] = (), request_id: str = "r") -> InferRequest:
    return InferRequest("m", "", tensors, tuple(RequestedOutput(name) for name in outputs),
                        context=RequestContext(request_id))  # fmt: skip


def fp32(name: str, values: list[float], shape: tuple[int, ...] | None = None) -> Tensor:
    data = np.array(values, np.float32)
    return Tensor(name, DataType.FP32, shape or data.shape, data.reshape(shape or data.shape))


def texts(name: str, values: list[bytes]) -> Tensor:
    return Tensor(name, DataType.BYTES, (len(values),), np.array(values, dtype=object))


def answer(value: float, size: int = 4) -> InferResponse:
    return InferResponse("m", "1", "r", (Tensor("y", DataType.FP32, (size,), np.full(size, value, np.float32)),))


class Model:
    """What the cache runs on a miss: counts its runs and answers `value` (else the run's number);
    `gated`: each run waits until `release` is set (requests arriving meanwhile find it running)."""

    def __init__(self, value: float | None = None, gated: bool = False) -> None:
        self.runs = 0
        self.value = value
        self.release = asyncio.Event()
        if not gated:
            self.release.set()

    async def run(self) -> InferResponse:
        self.runs += 1
        number = self.runs
        await self.release.wait()
        return answer(self.value if self.value is not None else float(number))


def test_keys_tell_apart_what_answers_differently() -> None:
    base = request_key(VERSION, request(fp32("x", [1, 2, 3, 4])))
    assert base == request_key(VERSION, request(fp32("x", [1, 2, 3, 4]), request_id="other"))
    different = [
        request(fp32("x", [1, 2, 3, 5])),  # data
        request(fp32("x", [1, 2, 3, 4], (2, 2))),  # shape
        request(Tensor("x", DataType.INT32, (4,), np.array([1, 2, 3, 4], np.int32))),  # datatype
        request(fp32("z", [1, 2, 3, 4])),  # name
        request(fp32("x", [1, 2, 3, 4]), outputs=("y",)),  # outputs asked for
    ]
    keys = {request_key(VERSION, r) for r in different}
    assert base not in keys and len(keys) == len(different)
    assert request_key(version_key("m", 2, b"\1" * 32), request(fp32("x", [1, 2, 3, 4]))) != base
    assert request_key(version_key("m", 1, b"\2" * 32), request(fp32("x", [1, 2, 3, 4]))) != base
    # Inputs in any order are the same request; texts are length-prefixed, so no two lists collide.
    two = [fp32("a", [1]), fp32("b", [2])]
    assert request_key(VERSION, request(*two)) == request_key(VERSION, request(*reversed(two)))
    assert request_key(VERSION, request(texts("t", [b"ab", b"c"]))) != request_key(
        VERSION, request(texts("t", [b"a", b"bc"]))
    )


def test_a_version_s_fingerprint_is_its_content(tmp_path: Path) -> None:
    model = tmp_path / "a" / "m"
    (model / "1").mkdir(parents=True)
    (model / "2").mkdir()
    (model / "1" / "model.onnx").write_bytes(b"weights one")
    (model / "2" / "model.onnx").write_bytes(b"weights two")
    (model / "config.pbtxt").write_text("max_batch_size: 8")
    config = ModelConfig(name="m", max_batch_size=8)
    first = version_fingerprint(config, model / "1", model)
    # Another copy of the same files (another server's): the same fingerprint.
    shutil.copytree(model, tmp_path / "b" / "m")
    assert version_fingerprint(config, tmp_path / "b" / "m" / "1", tmp_path / "b" / "m") == first
    assert version_fingerprint(config, model / "2", model) != first
    (model / "2" / "model.onnx").write_bytes(b"weights 2")  # another version's files are not this one's
    assert version_fingerprint(config, model / "1", model) == first
    assert version_fingerprint(ModelConfig(name="m", max_batch_size=4), model / "1", model) != first
    (model / "labels.txt").write_text("cat\ndog\n")  # a shared file
    assert version_fingerprint(config, model / "1", model) != first
    (model / "labels.txt").unlink()
    (model / "1" / "model.onnx").write_bytes(b"weights uno")
    assert version_fingerprint(config, model / "1", model) != first


async def test_one_execution_answers_identical_requests_that_come_while_it_runs() -> None:
    statistics = ServingStatistics()
    cache = ResponseCache(CacheSettings(1 << 20), statistics)
    model = Model(7.0, gated=True)
    run, release = model.run, model.release

    requests = [request(fp32("x", [1, 2]), request_id=str(i)) for i in range(100)]
    tasks = [asyncio.create_task(cache.answer(VERSION, "1", r, run)) for r in requests]
    await asyncio.sleep(0)
    release.set()
    responses = await asyncio.gather(*tasks)
    assert model.runs == 1
    assert [r.request_id for r in responses[1:]] == [str(i) for i in range(1, 100)]  # each its own id
    assert all(r.outputs[0].data.tolist() == [7.0] * 4 for r in responses)
    assert [r.context.cache for r in requests].count("miss") == 1
    assert [r.context.cache for r in requests].count("hit") == 99
    stats = statistics.model_statistics("m", "1")
    assert (stats.cache_hit.count, stats.cache_miss.count) == (99, 1)
    # Kept: a later identical request runs nothing; its answer's arrays cannot be written into.
    later = await cache.answer(VERSION, "1", request(fp32("x", [1, 2])), run)
    assert model.runs == 1 and not later.outputs[0].data.flags.writeable


async def test_a_failed_execution_is_neither_kept_nor_handed_to_the_requests_waiting_for_it() -> None:
    cache = ResponseCache(CacheSettings(1 << 20), ServingStatistics())
    release = asyncio.Event()
    calls = 0

    async def run() -> InferResponse:
        nonlocal calls
        calls += 1
        first = calls == 1
        await release.wait()
        if first:
            raise InternalError("the first run fails")
        return answer(float(calls))

    tasks = [asyncio.create_task(cache.answer(VERSION, "1", request(fp32("x", [3])), run)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], InternalError)
    assert all(isinstance(r, InferResponse) for r in results[1:])  # each ran for itself
    assert calls == 5
    assert len(cache.local) == 0  # the waiters ran outside the cache's one flight: nothing kept for them

    async def fails() -> InferResponse:
        raise InternalError("no")

    with pytest.raises(InternalError):
        await cache.answer(VERSION, "1", request(fp32("x", [4])), fails)
    assert len(cache.local) == 0


async def test_the_budget_evicts_the_least_recently_used_and_the_gauge_stays_within_it() -> None:
    statistics = ServingStatistics()
    entry = 4 * 4 + 32 + ENTRY_OVERHEAD_BYTES  # an answer of 4 floats, its key, the overhead
    cache = ResponseCache(CacheSettings(3 * entry), statistics)

    async def run_for(value: float) -> InferResponse:
        return answer(value)

    for value in (1.0, 2.0, 3.0):
        await cache.answer(VERSION, "1", request(fp32("x", [value])), lambda v=value: run_for(v))
    assert statistics.cache_bytes == 3 * entry and not statistics.cache_evictions
    await cache.answer(VERSION, "1", request(fp32("x", [1.0])), lambda: run_for(-1))  # 1 is now the most recent
    await cache.answer(VERSION, "1", request(fp32("x", [4.0])), lambda: run_for(4.0))  # evicts 2
    assert statistics.cache_evictions == {"m": 1} and statistics.cache_bytes == 3 * entry
    kept = request(fp32("x", [1.0]))
    assert (await cache.answer(VERSION, "1", kept, lambda: run_for(-1))).outputs[0].data[0] == 1.0
    evicted = request(fp32("x", [2.0]))
    assert (await cache.answer(VERSION, "1", evicted, lambda: run_for(-2))).outputs[0].data[0] == -2.0
    assert evicted.context.cache == "miss"
    # An answer larger than the whole budget is never kept.
    await cache.answer(VERSION, "1", request(fp32("x", [9.0])), lambda: asyncio.sleep(0, answer(9.0, size=1000)))
    assert statistics.cache_bytes <= 3 * entry


async def test_entries_expire_after_their_ttl() -> None:
    now = [100.0]
    cache = ResponseCache(CacheSettings(1 << 20, ttl_s=10), ServingStatistics(), clock=lambda: now[0])
    model = Model()
    run = model.run

    await cache.answer(VERSION, "1", request(fp32("x", [1])), run)
    now[0] += 9.9
    await cache.answer(VERSION, "1", request(fp32("x", [1])), run)
    assert model.runs == 1
    now[0] += 0.2
    late = request(fp32("x", [1]))
    assert (await cache.answer(VERSION, "1", late, run)).outputs[0].data[0] == 2.0
    assert model.runs == 2 and late.context.cache == "miss"


async def test_a_bypass_runs_the_model_and_keeps_its_fresh_answer() -> None:
    cache = ResponseCache(CacheSettings(1 << 20), ServingStatistics())
    model = Model()
    run = model.run

    await cache.answer(VERSION, "1", request(fp32("x", [1])), run)
    fresh = await cache.answer(VERSION, "1", request(fp32("x", [1])), run, bypass=True)
    assert model.runs == 2 and fresh.outputs[0].data[0] == 2.0
    assert (await cache.answer(VERSION, "1", request(fp32("x", [1])), run)).outputs[0].data[0] == 2.0


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        ((), None),
        (("local,size=1048576",), CacheSettings(1 << 20)),
        (("local,size=256MiB,ttl_s=600",), CacheSettings(256 << 20, 600.0)),
        ((" local , size = 1KB ",), CacheSettings(1000)),
        (("local,size=1KB", "local,ttl_s=5"), CacheSettings(1000, 5.0)),  # Triton's: one setting a flag
    ],
)
def test_cache_config_reads_triton_s_form(specs: tuple[str, ...], expected: CacheSettings | None) -> None:
    assert parse_cache_config(specs) == expected


@pytest.mark.parametrize(
    ("specs", "said"),
    [
        (("redis2,size=1",), "the cache is one of local, redis"),
        (("local",), "needs its byte budget"),
        (("local,size=0",), "at least 1 byte"),
        (("local,size=lots",), "is not a size"),
        (("local,size=1,ttl_s=-1",), "ttl_s must be a number of seconds above 0"),
        (("local,size=1,ttl_s=nan",), "ttl_s must be a number of seconds above 0"),
        (("local,size=1,colour=red",), "'colour=red' is not one of size=, ttl_s="),
        (("local,size=1,size=2",), "(each once)"),
        (("local,size=1", "local,size=2"), "(each once)"),
        (("local,size=inf",), "size must be at least 1 byte, and finite"),
    ],
)
def test_cache_config_refusals_name_the_value(specs: tuple[str, ...], said: str) -> None:
    with pytest.raises(ValueError, match="--cache-config") as raised:
        parse_cache_config(specs)
    assert said in str(raised.value)


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        (("redis,url=redis://127.0.0.1:6379/0",), CacheSettings(redis_url="redis://127.0.0.1:6379/0")),
        (
            ("local,size=1MiB", "redis,url=rediss://cache:6380/1,ttl_s=30,timeout_ms=50"),
            CacheSettings(1 << 20, None, "rediss://cache:6380/1", 30.0, 0.05),
        ),
    ],
)
def test_cache_config_reads_a_redis_tier(specs: tuple[str, ...], expected: CacheSettings) -> None:
    assert parse_cache_config(specs) == expected


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("redis", "needs url=redis://host:port/db"),
        ("redis,url=http://x", "needs url=redis://host:port/db"),
        ("redis,url=redis://x,size=1", "'size=1' is not one of url=, ttl_s=, timeout_ms="),
        ("redis,url=redis://x,timeout_ms=0", "timeout_ms must be a number of milliseconds above 0"),
    ],
)
def test_redis_cache_config_refusals(spec: str, said: str) -> None:
    with pytest.raises(ValueError, match="--cache-config") as raised:
        parse_cache_config([spec])
    assert said in str(raised.value)


def test_outputs_round_trip_through_redis_s_format_and_a_damaged_value_does_not_read() -> None:
    from inferd.core.response_cache_redis import decode_outputs, encode_outputs

    outputs = (
        Tensor("f", DataType.FP32, (2, 3), np.arange(6, dtype=np.float32).reshape(2, 3)),
        Tensor("s", DataType.BYTES, (2,), np.array([b"", "wörld".encode()], dtype=object)),
        Tensor("b", DataType.BF16, (), np.array(1.5, dtype=DataType.BF16.numpy_dtype)),
        Tensor("i", DataType.INT64, (0, 4), np.zeros((0, 4), np.int64)),
        Tensor("t", DataType.BOOL, (1,), np.array([True])),
    )
    value = encode_outputs(outputs)
    for before, after in zip(outputs, decode_outputs(value), strict=True):
        assert (after.name, after.datatype, after.shape) == (before.name, before.datatype, before.shape)
        assert after.data.dtype == before.data.dtype
        if before.datatype is DataType.BYTES:
            assert after.data.tolist() == [b"", "wörld".encode()]
        else:
            assert after.data.tobytes() == before.data.tobytes()
    for damaged in (value[:-1], value + b"\0", b"IRC0" + value[4:], value[:6], b"IRC1\xff\xff\xff\x7f{}"):
        with pytest.raises((ValueError, KeyError, TypeError)):
            decode_outputs(damaged)


async def test_a_redis_that_does_not_answer_is_a_miss_and_is_left_alone_a_while() -> None:
    statistics = ServingStatistics()
    settings = CacheSettings(redis_url="redis://127.0.0.1:1/0", redis_timeout_s=0.5)  # nothing listens there
    cache = ResponseCache(settings, statistics)
    model = Model(1.0)
    run = model.run

    for _ in range(3):
        assert (await cache.answer(VERSION, "1", request(fp32("x", [1])), run)).outputs[0].data[0] == 1.0
    assert model.runs == 3  # no local tier: each request ran the model
    assert statistics.cache_redis_errors == 1  # the first failed; the tier was then skipped
    await cache.close()


async def test_when_the_first_request_s_client_leaves_one_waiter_runs_the_model_for_the_others() -> None:
    cache = ResponseCache(CacheSettings(1 << 20), ServingStatistics())
    model = Model(5.0, gated=True)
    run, release = model.run, model.release

    first = asyncio.create_task(cache.answer(VERSION, "1", request(fp32("x", [1])), run))
    await asyncio.sleep(0)
    waiters = [asyncio.create_task(cache.answer(VERSION, "1", request(fp32("x", [1])), run)) for _ in range(20)]
    await asyncio.sleep(0)
    first.cancel()  # its client left
    await asyncio.sleep(0)
    release.set()
    responses = await asyncio.gather(*waiters)
    assert model.runs == 2 and all(r.outputs[0].data[0] == 5.0 for r in responses)
    assert len(cache.local) == 1  # the second run's answer was kept


async def test_a_waiter_keeps_its_own_deadline_and_background_requests_never_hold_real_time_ones() -> None:
    import time

    from inferd.errors import DeadlineUnreachableError

    cache = ResponseCache(CacheSettings(1 << 20), ServingStatistics())
    model = Model(1.0, gated=True)
    run, release = model.run, model.release

    background = asyncio.create_task(cache.answer(VERSION, "1", request(fp32("x", [1])), run, admission="background"))
    await asyncio.sleep(0)
    # A real-time request does not wait for the background one: it runs the model itself.
    realtime = asyncio.create_task(cache.answer(VERSION, "1", request(fp32("x", [1])), run, admission="real_time"))
    await asyncio.sleep(0)
    assert model.runs == 2
    hurried = request(fp32("x", [1]))
    hurried.context.deadline_s = time.monotonic() + 0.05
    with pytest.raises(DeadlineUnreachableError):
        await cache.answer(VERSION, "1", hurried, run, admission="real_time")
    release.set()
    await asyncio.gather(background, realtime)


async def test_waiters_get_a_read_only_copy_and_hits_their_outputs_in_the_order_they_asked() -> None:
    cache = ResponseCache(CacheSettings(1 << 20), ServingStatistics())
    release = asyncio.Event()
    leader_answer = InferResponse("m", "1", "r", (
        Tensor("y", DataType.FP32, (1,), np.array([1.0], np.float32)),
        Tensor("z", DataType.FP32, (1,), np.array([2.0], np.float32)),
    ))  # fmt: skip

    async def run() -> InferResponse:
        await release.wait()
        return leader_answer

    leader = asyncio.create_task(cache.answer(VERSION, "1", request(fp32("x", [1]), outputs=("y", "z")), run))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cache.answer(VERSION, "1", request(fp32("x", [1]), outputs=("z", "y")), run))
    await asyncio.sleep(0)
    release.set()
    mine, shared = await asyncio.gather(leader, waiter)
    assert mine is leader_answer
    assert [t.name for t in shared.outputs] == ["z", "y"]  # as the waiter asked
    assert all(not t.data.flags.writeable and not np.shares_memory(t.data, leader_answer.outputs[0].data)
               for t in shared.outputs)  # fmt: skip


def test_hits_are_not_counted_as_queued_or_computed(tmp_path: Path) -> None:
    from inferd.types import RequestTiming

    statistics = ServingStatistics()
    computed = RequestTiming(queue_s=0.5, compute_infer_s=1.0, rows=1)
    statistics.request_finished("m", "1", "kserve_http", "success", 2.0, 1, computed)
    statistics.request_finished("m", "1", "kserve_http", "success", 0.001, 0, RequestTiming(cache_hit=True))
    statistics.cache_answered("m", "1", True, 0.00001)
    stats = statistics.model_statistics("m", "1")
    assert stats.success.count == 2 and stats.cache_hit.count == 1
    # Triton's queue counts hits (at 0 ns); its compute counts do not.
    assert stats.compute_infer.count == 1 and stats.queue.count == 2
    assert statistics.snapshot()[("m", "1")].phases["kserve_http"].compute.count == 1
    # A hit that then failed (an answer over the limit) counts as neither: no count goes below 0.
    statistics.cache_answered("m", "1", True, 0.00001)
    statistics.request_finished("m", "1", "kserve_http", "RESPONSE_TOO_LARGE", 0.001, 0, RequestTiming(cache_hit=True))
    assert statistics.model_statistics("m", "1").compute_infer.count == 1


def test_python_bytecode_does_not_change_a_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.py").write_text("class Model: ...\n")
    config = ModelConfig(name="m")
    before = version_fingerprint(config, tmp_path / "m" / "1", tmp_path / "m")
    (tmp_path / "m" / "1" / "__pycache__").mkdir()
    (tmp_path / "m" / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"bytecode")
    assert version_fingerprint(config, tmp_path / "m" / "1", tmp_path / "m") == before


async def test_a_redis_that_hangs_is_left_alone_longer_each_time_and_tried_again_by_one_request() -> None:
    """A listener that takes connections and never answers (a stopped Redis): a lookup waits its
    timeout once; then the tier is skipped, and when the window is up one request alone probes."""
    import socket

    from inferd.core.response_cache_redis import RedisTier

    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    listener.setblocking(False)

    async def accept_and_say_nothing() -> None:
        loop = asyncio.get_running_loop()
        while True:
            connection, _ = await loop.sock_accept(listener)
            held.append(connection)

    acceptor = asyncio.create_task(accept_and_say_nothing())
    now = [1000.0]
    statistics = ServingStatistics()
    url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    tier = RedisTier(url, None, 0.2, statistics, clock=lambda: now[0])
    try:
        assert await tier.get(b"k" * 32) is None
        assert statistics.cache_redis_errors == 1
        assert await tier.get(b"k" * 32) is None  # left alone: no command, no wait
        assert statistics.cache_redis_errors == 1
        now[0] += 1.01  # the window is up: one request probes, the others skip Redis meanwhile
        lookups = await asyncio.gather(*(tier.get(b"k" * 32) for _ in range(5)))
        assert lookups == [None] * 5 and statistics.cache_redis_errors == 2
        now[0] += 1.5  # the second window is 2 s: still left alone
        assert await tier.get(b"k" * 32) is None and statistics.cache_redis_errors == 2
    finally:
        acceptor.cancel()
        await tier.close()
        for connection in held:
            connection.close()
        listener.close()

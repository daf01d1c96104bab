#!/usr/bin/env python3
"""Hostile connections on the serving port cost the good clients nothing: the tiny model served at a
steady rate by wrk while, on the same port, 500 slowloris connections trickle their heads a byte a
second, a pipelining flood sends requests it never reads the answers of, and an oversized-body
stream declares 300 MB bodies and keeps sending. Quiet and attacked runs alternate (`--rounds`);
the table gives the good clients' throughput and p99 in each, the attackers' counts, and the
server's RSS, open file descriptors and threads before and after.

    .venv/bin/python benchmarks/abuse.py [--seconds 20] [--rounds 2] [--slowloris 500]

Targets (issue "Hardening", part 4): attacked throughput >= 0.9x quiet, p99 within 2x, and RSS and
file descriptors back near their start once the attack ends. The server runs with its defaults
(`--max-connections 4096`, `--read-timeout 10`, `--write-timeout 30`), every feature on.

Good load: wrk (C), closed loop with a per-request pause (`delay()` in its Lua script) so that the
server runs at about `--load` of the rate it sustains flat out (measured first), not saturated:
an attack's cost shows as lost throughput or a longer tail rather than hiding in a saturated queue.
The attackers run in their own process (asyncio), at their own pace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import itertools
import json
import multiprocessing
import multiprocessing.synchronize
import os
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving import Measurement, Model, Setup, _wait_until_quiet, build_repository, paced_wrk, tiny_model

from inferd.testing.models import identity_model, python_model, write_config
from inferd.testing.server import free_port, run_server
from inferd.types import DataType

console = Console(width=150)
OVERSIZED_BYTES = 300 * 1024 * 1024


# -- the attackers ------------------------------------------------------------------------------


@dataclass
class AttackCounts:
    slowloris_opened: int = 0
    slowloris_closed_by_server: int = 0
    pipelined_sent: int = 0
    flood_connections: int = 0
    oversized_refused: int = 0
    oversized_bytes_sent: int = 0
    errors: dict[str, int] = field(default_factory=dict)


async def _slowloris(port: int, stop: asyncio.Event, counts: AttackCounts) -> None:
    """One connection at a time that sends a request head one byte a second; reopened when closed."""
    head = b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 10_000
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as error:
            counts.errors[type(error).__name__] = counts.errors.get(type(error).__name__, 0) + 1
            await asyncio.sleep(1)
            continue
        counts.slowloris_opened += 1
        try:
            for byte in head:
                if stop.is_set() or reader.at_eof():
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    if await asyncio.wait_for(reader.read(65536), 1.0) == b"":
                        break  # the server closed it
            else:
                continue
            if not stop.is_set():
                counts.slowloris_closed_by_server += 1
        except (ConnectionError, OSError):
            counts.slowloris_closed_by_server += 1
        finally:
            writer.close()


async def _pipelining_flood(port: int, stop: asyncio.Event, counts: AttackCounts) -> None:
    """Pipelined requests as fast as the socket takes them, no answer ever read; reopened when closed."""
    request = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n" * 64
    while not stop.is_set():
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(1)
            continue
        counts.flood_connections += 1
        try:
            while not stop.is_set():
                writer.write(request)
                counts.pipelined_sent += 64
                await asyncio.wait_for(writer.drain(), 1.0)
        except (TimeoutError, ConnectionError, OSError):
            await asyncio.sleep(0.1)  # blocked or closed: the server stopped reading us; start over
        finally:
            writer.close()


async def _oversized(port: int, stop: asyncio.Event, counts: AttackCounts) -> None:
    """A 300 MB Content-Length, then body bytes as fast as the server takes them, the 413 or not."""
    head = f"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {OVERSIZED_BYTES}\r\n\r\n".encode()
    chunk = b"\0" * 65536
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(1)
            continue
        answer = asyncio.create_task(reader.read(64))
        try:
            writer.write(head)
            while not stop.is_set() and not writer.is_closing():
                writer.write(chunk)
                counts.oversized_bytes_sent += len(chunk)
                await asyncio.wait_for(writer.drain(), 1.0)
        except (TimeoutError, ConnectionError, OSError):
            pass  # the server stopped reading or closed: open another
        finally:
            with contextlib.suppress(TimeoutError, ConnectionError, OSError, asyncio.CancelledError):
                if (await asyncio.wait_for(answer, 1.0)).startswith(b"HTTP/1.1 413"):
                    counts.oversized_refused += 1
            writer.close()


ATTACKS = ("slowloris", "flood", "oversized")


def attack(
    port: int,
    attacks: tuple[str, ...],
    slowloris: int,
    seconds: float,
    ready: multiprocessing.synchronize.Event,
    queue: object,
) -> None:
    """The attackers' process: the `attacks` for `seconds`, then their counts on `queue`."""

    async def run() -> AttackCounts:
        counts = AttackCounts()
        stop = asyncio.Event()
        slowloris_count = slowloris if "slowloris" in attacks else 0
        tasks = [asyncio.create_task(_slowloris(port, stop, counts)) for _ in range(slowloris_count)]
        if "flood" in attacks:
            tasks += [asyncio.create_task(_pipelining_flood(port, stop, counts)) for _ in range(4)]
        if "oversized" in attacks:
            tasks += [asyncio.create_task(_oversized(port, stop, counts)) for _ in range(4)]
        deadline = time.monotonic() + 10
        while counts.slowloris_opened < slowloris_count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        ready.set()
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.wait(tasks, timeout=5)
        for task in tasks:
            task.cancel()
        return counts

    queue.put(asyncio.run(run()))  # type: ignore[attr-defined]


# -- the good clients ---------------------------------------------------------------------------


@dataclass
class ServerUse:
    rss_mb: float
    fds: int
    threads: int
    connections: int

    @classmethod
    def of(cls, pid: int) -> ServerUse:
        process = psutil.Process(pid)
        return cls(
            process.memory_info().rss / 2**20,
            process.num_fds(),
            process.num_threads(),
            len(process.net_connections(kind="tcp")),
        )


# -- request attacks: one small request that asks for gigabytes or seconds (issue 28, 1c) ---------

REQUEST_ATTACKS = ("tf-repeat", "inline-big", "compressed-flood", "openai-many-texts", "shm-regions")
# Stands for the tokenizer / mean_pooling: an inline model (it only computes, fast on the probe's
# one empty text) whose work grows with its texts: 20 passes of numpy over each (which, as ONNX
# Runtime does, lets go of the GIL while it computes).
EMBEDDER_MODEL = """
import numpy as np


class Model:
    may_run_inline = True

    def execute(self, inputs):
        spaces = []
        for text in inputs["text"].ravel():
            characters = np.frombuffer(text, dtype=np.uint8)
            for _ in range(20):
                count = int(np.count_nonzero(characters == 32))
            spaces.append(count if len(characters) else 0)
        return {"embedding": np.repeat(np.array(spaces, dtype=np.float32)[:, None], 4, axis=1)}
"""
EMBEDDER_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "text" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "embedding" data_type: TYPE_FP32 dims: [ 4 ] } ]
parameters { key: "embedding_input" value { string_value: "text" } }
"""


def _request_attack_repository(root: Path, model: Model) -> Path:
    build_repository(root, model, None, Setup(batching=True))
    identity_model(root / "identity_bytes" / "1" / "model.onnx", DataType.BYTES, ["batch", -1])
    python_model(root / "embedder" / "1", EMBEDDER_MODEL)
    write_config(root / "embedder", EMBEDDER_CONFIG)
    return root


def _attack_calls(name: str, http_port: int, tf_port: int) -> Callable[[], str]:
    """One attacking call of `name` (blocking), returning its outcome (HTTP status or gRPC code)."""
    if name == "tf-repeat":
        import grpc

        from inferd.protocol.tfserving_pb import tensorflow_pb2 as tf_pb
        from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb
        from inferd.protocol.tfserving_pb import tensorflow_serving_pb2_grpc as serving_grpc

        # 562 bytes: one 512-byte string repeated over [1, 1000000].
        request = serving_pb.PredictRequest()
        request.model_spec.name = "identity_bytes"
        proto = request.inputs["INPUT0"]
        proto.dtype = tf_pb.DT_STRING
        proto.string_val.append(b"s" * 512)
        proto.tensor_shape.dim.add(size=1)
        proto.tensor_shape.dim.add(size=1_000_000)
        channel = grpc.insecure_channel(f"127.0.0.1:{tf_port}", options=[("grpc.max_receive_message_length", -1)])
        stub = serving_grpc.PredictionServiceStub(channel)

        def tf_repeat() -> str:
            try:
                stub.Predict(request, timeout=120)
            except grpc.RpcError as error:
                return error.code().name
            return "OK"

        return tf_repeat
    if name == "inline-big":
        # 13 million one-byte BYTES elements (95 KB deflated) to an identity model, then one 8 MiB
        # text to the inline embedder, in turn.
        count = 13_000_000
        header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, count],
                                         "parameters": {"binary_data_size": 5 * count}}]}).encode()  # fmt: skip
        elements = zlib.compress(header + b"\x01\x00\x00\x00a" * count, 9)
        text = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                       "data": ["word " * (8 * 2**20 // 5)]}]}).encode()  # fmt: skip
        turn = itertools.cycle(
            [
                ("/v2/models/identity_bytes/infer", elements,
                 {"Content-Encoding": "deflate", "Inference-Header-Content-Length": str(len(header))}),
                ("/v2/models/embedder/infer", text, {}),
            ]
        )  # fmt: skip
        return lambda: _post(http_port, *next(turn))
    if name == "compressed-flood":
        bomb = zlib.compress(b"0" * (64 * 2**20), 9)  # 65 KB that inflate to 64 MiB
        return lambda: _post(http_port, "/v2/models/tiny/infer", bomb, {"Content-Encoding": "deflate"})
    if name == "shm-regions":
        # Regions without end on one 4 KB object (each of its clients its own): they once held a
        # descriptor each, and 10,000 used up the process's (new connections reset, loads failed).
        from multiprocessing import shared_memory

        segment = shared_memory.SharedMemory(create=True, size=4096)
        _SEGMENTS.append(segment)
        names = itertools.count()
        register = json.dumps({"key": f"/{segment.name}", "offset": 0, "byte_size": 64}).encode()

        def shm_region() -> str:
            path = f"/v2/systemsharedmemory/region/{segment.name}_{next(names)}/register"
            return _post(http_port, path, register, {"Content-Type": "application/json"})

        return shm_region
    if name == "openai-many-texts":
        body = json.dumps({"model": "embedder", "input": ["word " * 800] * 2048}).encode()  # 2,048 texts of 4 KB
        return lambda: _post(http_port, "/openai/v1/embeddings", body, {"Content-Type": "application/json"})
    raise ValueError(name)


# The shared memory objects an attacker made, removed once it is done.
_SEGMENTS: list[Any] = []


def _post(port: int, path: str, body: bytes, headers: dict[str, str]) -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        response.read()
        return str(response.status)
    except OSError as error:
        return type(error).__name__
    finally:
        connection.close()


def request_attacker(name: str, http_port: int, tf_port: int, connections: int, seconds: float, queue: object) -> None:
    """The attackers' process: `connections` clients repeating `name`'s call for `seconds`; the
    outcomes' counts go on `queue`."""
    outcomes: dict[str, int] = {}
    deadline = time.monotonic() + seconds

    def client() -> None:
        call = _attack_calls(name, http_port, tf_port)
        while time.monotonic() < deadline:
            outcome = call()
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

    with ThreadPoolExecutor(connections) as pool:
        for future in [pool.submit(client) for _ in range(connections)]:
            future.result()
    if _SEGMENTS:  # leave the server as it was for the next attack
        _post(http_port, "/v2/systemsharedmemory/unregister", b"", {})
        for segment in _SEGMENTS:
            segment.close()
            segment.unlink()
    queue.put(outcomes)  # type: ignore[attr-defined]


@dataclass
class Watch:
    """What the server's other clients saw meanwhile, and its memory."""

    health_ms: list[float] = field(default_factory=list)
    health_failures: int = 0
    good_ms: list[float] = field(default_factory=list)
    good_failures: int = 0
    peak_rss_mb: float = 0.0
    peak_fds: int = 0


async def _watch(port: int, pid: int, body: bytes, stop: asyncio.Event, watch: Watch) -> None:
    """/v2/health/live every 10 ms and a good client calling the tiny model back to back, each on a
    connection of its own; the server's RSS every 20 ms."""

    async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> bool:
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
        await reader.readexactly(length)
        return head.startswith(b"HTTP/1.1 200")

    async def client(request: bytes, pause_s: float, latencies: list[float], failed: Callable[[], None]) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while not stop.is_set():
            started = time.perf_counter()
            try:
                ok = await asyncio.wait_for(exchange(reader, writer, request), 30)
            except (TimeoutError, OSError, asyncio.IncompleteReadError):
                ok = False
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            latencies.append((time.perf_counter() - started) * 1000)
            if not ok:
                failed()
            await asyncio.sleep(pause_s)
        writer.close()

    def health_failed() -> None:
        watch.health_failures += 1

    def good_failed() -> None:
        watch.good_failures += 1

    async def memory() -> None:
        process = psutil.Process(pid)
        while not stop.is_set():
            watch.peak_rss_mb = max(watch.peak_rss_mb, process.memory_info().rss / 2**20)
            watch.peak_fds = max(watch.peak_fds, process.num_fds())
            await asyncio.sleep(0.02)

    health = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    good = (b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    await asyncio.gather(
        client(health, 0.01, watch.health_ms, health_failed), client(good, 0.0, watch.good_ms, good_failed), memory()
    )


def run_request_attacks(args: argparse.Namespace, attacks: tuple[str, ...]) -> None:
    model = tiny_model()
    body = model.v2_json()
    rows = []
    with tempfile.TemporaryDirectory(prefix="inferd-abuse-") as scratch_dir:
        scratch = Path(scratch_dir)
        repository = _request_attack_repository(scratch / "repository", model)
        tf_port = free_port()
        with run_server(repository, scratch / "server.log", "--tfserving-grpc-port", str(tf_port)) as server:
            pid = server.process.pid
            for name in ("quiet", *attacks):
                _wait_until_quiet(timeout_s=10)
                before_mb = psutil.Process(pid).memory_info().rss / 2**20
                watch, stop = Watch(), asyncio.Event()
                outcomes: dict[str, int] = {}
                attacker: BaseProcess | None = None
                if name != "quiet":
                    context = multiprocessing.get_context("spawn")
                    results = context.Queue()
                    connections = 8 if name == "compressed-flood" else 2
                    attacker = context.Process(
                        target=request_attacker,
                        args=(name, server.http_port, tf_port, connections, args.seconds, results),
                    )
                    attacker.start()

                async def observe(watch: Watch, stop: asyncio.Event, attacker: BaseProcess | None) -> None:
                    task = asyncio.create_task(_watch(server.http_port, pid, body, stop, watch))
                    await asyncio.sleep(args.seconds + 2)  # the attacker's start-up, then its run
                    while attacker is not None and attacker.is_alive():
                        await asyncio.sleep(0.1)
                    stop.set()
                    await task

                asyncio.run(observe(watch, stop, attacker))
                if attacker is not None:
                    outcomes = results.get(timeout=60)
                    attacker.join(30)
                after_mb = psutil.Process(pid).memory_info().rss / 2**20
                rows.append((name, outcomes, before_mb, watch, after_mb))
                console.print(f"{name}: done ({outcomes or 'no attacker'})")
            alive = server.process.poll() is None

    table = Table(
        title=f"Request attacks ({args.seconds:.0f} s each; health every 10 ms; a good client on the tiny model)"
    )
    for column in ("attack", "attacker outcomes", "RSS MiB before", "peak", "after", "fds peak", "health worst ms",
                   "health p99 ms", "health failed", "good req/s", "good p99 ms", "good failed"):  # fmt: skip
        table.add_column(column, justify="right")
    for name, outcomes, before_mb, watch, after_mb in rows:
        good = sorted(watch.good_ms) or [0.0]
        health = sorted(watch.health_ms) or [0.0]
        table.add_row(
            name,
            ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items())) or "-",
            f"{before_mb:.0f}",
            f"{watch.peak_rss_mb:.0f}",
            f"{after_mb:.0f}",
            str(watch.peak_fds),
            f"{health[-1]:.1f}",
            f"{health[int(0.99 * (len(health) - 1))]:.1f}",
            str(watch.health_failures),
            f"{len(watch.good_ms) / (args.seconds + 2):,.0f}",
            f"{good[int(0.99 * (len(good) - 1))]:.2f}",
            str(watch.good_failures),
        )
    console.print(table)
    console.print(f"server alive after: {alive}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="each quiet or attacked run (default 20)")
    parser.add_argument("--rounds", type=int, default=2, help="quiet/attacked pairs, alternated (default 2)")
    parser.add_argument("--slowloris", type=int, default=500, help="slowloris connections (default 500)")
    every = (*ATTACKS, *REQUEST_ATTACKS)
    parser.add_argument(
        "--attacks", default=",".join(every), help=f"which, comma-separated (default {','.join(every)})"
    )
    parser.add_argument("--load", type=float, default=0.5, help="good load as a share of the flat-out rate (0.5)")
    args = parser.parse_args()
    chosen = tuple(name.strip() for name in args.attacks.split(",") if name.strip())
    if unknown := set(chosen) - set(every):
        parser.error(f"unknown attacks {sorted(unknown)}; choose from {', '.join(every)}")
    if requests := tuple(name for name in chosen if name in REQUEST_ATTACKS):
        run_request_attacks(args, requests)
    attacks = tuple(name for name in chosen if name in ATTACKS)
    if not attacks:
        return 0

    model = tiny_model()
    body = model.v2_json()
    with tempfile.TemporaryDirectory(prefix="inferd-abuse-") as scratch_dir:
        scratch = Path(scratch_dir)
        repository = build_repository(scratch / "repository", model, None, Setup(batching=True))
        with run_server(repository, scratch / "server.log") as server:
            url = f"http://127.0.0.1:{server.http_port}/v2/models/tiny/infer"
            paced_wrk(url, body, 0, 3, scratch)  # warm up
            flat_out = paced_wrk(url, body, 0, args.seconds / 2, scratch).throughput
            rate = flat_out * args.load
            console.print(f"flat out {flat_out:,.0f} req/s; good clients held at about {rate:,.0f} req/s")
            before = ServerUse.of(server.process.pid)
            quiet: list[Measurement] = []
            attacked: list[Measurement] = []
            counts: list[AttackCounts] = []
            during: list[ServerUse] = []
            for round_number in range(args.rounds):
                _wait_until_quiet()
                quiet.append(paced_wrk(url, body, rate, args.seconds, scratch))
                console.print(f"round {round_number + 1}: quiet {quiet[-1].throughput:,.0f} req/s")
                context = multiprocessing.get_context("spawn")
                ready, results = context.Event(), context.Queue()
                attacker = context.Process(
                    target=attack,
                    args=(server.http_port, attacks, args.slowloris, args.seconds + 4, ready, results),
                )
                attacker.start()
                ready.wait(30)
                time.sleep(2)  # the slowloris connections are all open and trickling
                attacked.append(paced_wrk(url, body, rate, args.seconds, scratch))
                during.append(ServerUse.of(server.process.pid))
                counts.append(results.get(timeout=args.seconds + 60))
                attacker.join(30)
                console.print(f"round {round_number + 1}: attacked {attacked[-1].throughput:,.0f} req/s")
            # What the attack left: connections close by their own timeouts (read 10 s, linger 2 s).
            deadline = time.monotonic() + 30
            after = ServerUse.of(server.process.pid)
            while after.connections > before.connections + 2 and time.monotonic() < deadline:
                time.sleep(1)
                after = ServerUse.of(server.process.pid)
            alive = server.process.poll() is None
    report(args, flat_out, quiet, attacked, counts, before, during, after, alive)
    return 0


def report(
    args: argparse.Namespace,
    flat_out: float,
    quiet: list[Measurement],
    attacked: list[Measurement],
    counts: list[AttackCounts],
    before: ServerUse,
    during: list[ServerUse],
    after: ServerUse,
    alive: bool,
) -> None:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    def spread(values: list[float], scale: float = 1.0, fmt: str = ",.0f") -> str:
        return f"{min(values) / scale:{fmt}}-{max(values) / scale:{fmt}}"

    table = Table(title=f"Good clients (wrk, 16 connections, ~{args.load:.0%} of {flat_out:,.0f} req/s flat out)")
    for column in ("run", "req/s (median)", "range", "p50 ms", "p99 ms (median)", "p99 range", "failed"):
        table.add_column(column, justify="right")
    for label, runs in (("quiet", quiet), ("attacked", attacked)):
        table.add_row(
            label,
            f"{median([m.throughput for m in runs]):,.0f}",
            spread([m.throughput for m in runs]),
            f"{median([m.p50_us for m in runs]) / 1000:.2f}",
            f"{median([m.p99_us for m in runs]) / 1000:.2f}",
            spread([m.p99_us for m in runs], 1000, ".2f"),
            str(sum(m.failures for m in runs)),
        )
    console.print(table)
    throughput_ratio = median([m.throughput for m in attacked]) / median([m.throughput for m in quiet])
    p99_ratio = median([m.p99_us for m in attacked]) / median([m.p99_us for m in quiet])
    console.print(
        f"attacked / quiet: throughput {throughput_ratio:.3f}x (target >= 0.9), p99 {p99_ratio:.2f}x (target <= 2)"
    )

    attacks = Table(title="Attackers (per attacked run)")
    for column in ("round", "slowloris opened", "closed by server", "pipelined sent", "flood conns",
                   "oversized 413s", "oversized MB sent"):  # fmt: skip
        attacks.add_column(column, justify="right")
    for number, count in enumerate(counts, 1):
        attacks.add_row(
            str(number),
            f"{count.slowloris_opened:,}",
            f"{count.slowloris_closed_by_server:,}",
            f"{count.pipelined_sent:,}",
            f"{count.flood_connections:,}",
            f"{count.oversized_refused:,}",
            f"{count.oversized_bytes_sent / 2**20:,.0f}",
        )
    console.print(attacks)

    use = Table(title="Server")
    for column in ("when", "RSS MiB", "open fds", "threads", "TCP connections"):
        use.add_column(column, justify="right")
    use.add_row("before", f"{before.rss_mb:.0f}", str(before.fds), str(before.threads), str(before.connections))
    for number, point in enumerate(during, 1):
        use.add_row(
            f"attack {number}", f"{point.rss_mb:.0f}", str(point.fds), str(point.threads), str(point.connections)
        )
    use.add_row("after", f"{after.rss_mb:.0f}", str(after.fds), str(after.threads), str(after.connections))
    console.print(use)
    console.print(f"server alive after: {alive}; pid {os.getpid()} done")


if __name__ == "__main__":
    raise SystemExit(main())

"""Sending generated calls (`inferd.testing.strategies.calls`) to a real server and judging the
answers, for the e2e fuzz test and `benchmarks/fuzz.py` alike.

An answer is judged by its class: a success, the client's error, a retryable refusal (a 503, or
gRPC UNAVAILABLE, whose body carries an overload or not-ready code: the server is fine and says
so), or a server error (any other 5xx, gRPC INTERNAL or UNKNOWN): the last must never happen. A
call that gets no answer within its timeout is a hang.
"""

from __future__ import annotations

import http.client
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson

from inferd.testing.strategies.calls import GrpcCall, HttpCall

# Codes that say "try again": an overload, a deadline the queue cannot meet, a model or server not ready.
RETRYABLE_CODES = frozenset({"OVERLOADED", "DEADLINE_UNREACHABLE", "MODEL_NOT_READY", "UNAVAILABLE"})
CLASSES = ("2xx", "4xx", "retryable 503", "5xx", "hang")
_CLIENT_GRPC = {
    "INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED", "FAILED_PRECONDITION",
    "OUT_OF_RANGE", "CANCELLED",
}  # fmt: skip


def error_code(body: bytes) -> str:
    """inferd's error code in any door's error body (OpenAI: error.code, TorchServe: error_code)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(document, dict):
        return ""
    inner = document.get("error")
    found = inner.get("code") if isinstance(inner, dict) else document.get("error_code", document.get("code"))
    return found if isinstance(found, str) else ""


def http_class(status: int, body: bytes) -> str:
    if status < 300:
        return "2xx"
    if status < 500:
        return "4xx"
    if status == 503 and error_code(body) in RETRYABLE_CODES:
        return "retryable 503"
    return "5xx"


def grpc_class(status: str, code: str) -> str:
    if status == "OK":
        return "2xx"
    if status in _CLIENT_GRPC:
        return "4xx"
    if status == "UNAVAILABLE" and code in RETRYABLE_CODES:
        return "retryable 503"
    return "5xx"


@dataclass
class Tally:
    """Answers counted by class and by door; the first server errors and hangs, described."""

    by_class: Counter[str] = field(default_factory=Counter)
    by_door: Counter[str] = field(default_factory=Counter)
    by_door_class: Counter[tuple[str, str]] = field(default_factory=Counter)
    # The error codes of the retryable refusals: which overload or readiness they were.
    retry_codes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    keep: int = 20

    @property
    def requests(self) -> int:
        return sum(self.by_class.values())

    def add(self, door: str, kind: str, detail: str = "", code: str = "") -> None:
        if kind == "retryable 503":
            self.retry_codes[code] += 1
        self.by_class[kind] += 1
        self.by_door[door] += 1
        self.by_door_class[door, kind] += 1
        if kind in ("5xx", "hang") and len(self.failures) < self.keep:
            self.failures.append(f"{door}: {kind}: {detail}"[:600])

    def merge(self, other: Tally) -> None:
        self.by_class.update(other.by_class)
        self.by_door.update(other.by_door)
        self.by_door_class.update(other.by_door_class)
        self.retry_codes.update(other.retry_codes)
        self.failures.extend(other.failures[: max(0, self.keep - len(self.failures))])


class HttpSender:
    """One kept-alive connection; a new one after any failure (the server may close after an error)."""

    def __init__(self, port: int, timeout_s: float) -> None:
        self._port = port
        self._timeout_s = timeout_s
        self._connection: http.client.HTTPConnection | None = None

    def send(self, call: HttpCall, tally: Tally) -> None:
        for attempt in range(2):
            connection = self._connection or http.client.HTTPConnection("127.0.0.1", self._port, self._timeout_s)
            self._connection = connection
            try:
                connection.request(call.method, call.path, body=call.body, headers=call.headers)
                response = connection.getresponse()
                body = response.read()
            except TimeoutError:
                self.close()
                tally.add(call.door, "hang", f"{call.method} {call.path} {call.body[:200]!r}")
                return
            except (OSError, http.client.HTTPException, ConnectionError):
                self.close()  # a connection the server closed after its last answer: once more, anew
                if attempt:
                    raise
                continue
            if response.will_close:
                self.close()
            kind = http_class(response.status, body)
            detail = f"{call.method} {call.path} -> {response.status} {body[:300]!r}"
            tally.add(call.door, kind, detail, error_code(body) if kind == "retryable 503" else "")
            return

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class GrpcSender:
    """KServe's ModelInfer and TF Serving's Predict, each on its own port (by the call's door)."""

    def __init__(self, kserve_port: int, tfserving_port: int, timeout_s: float) -> None:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        from inferd.protocol.tfserving_pb import tensorflow_serving_pb2_grpc

        self._grpc = grpc
        self._timeout_s = timeout_s
        self._channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for port in (kserve_port, tfserving_port)]
        self._calls: dict[str, Any] = {
            "kserve_grpc": service_pb2_grpc.GRPCInferenceServiceStub(self._channels[0]).ModelInfer,
            "tfserving_grpc": tensorflow_serving_pb2_grpc.PredictionServiceStub(self._channels[1]).Predict,  # type: ignore[no-untyped-call]
        }

    def send(self, call: GrpcCall, tally: Tally) -> None:
        try:
            self._calls[call.door](call.message, timeout=self._timeout_s)
        except self._grpc.RpcError as error:
            status = error.code().name
            if status == "DEADLINE_EXCEEDED":
                tally.add(call.door, "hang", str(call.message)[:300])
                return
            code = dict(error.trailing_metadata() or ()).get("inferd-code", "")
            tally.add(call.door, grpc_class(status, code), f"{status} {code} {error.details()}", code)
            return
        tally.add(call.door, "2xx")

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

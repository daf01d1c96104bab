"""A door's codec pair: how a front door's raw request becomes `InferRequest`s, and their responses
its answer.

A door is a route-table entry plus a codec. `server.inference_call.InferenceCall` does everything
else alike for every door and both transports: it resolves the target, sheds before decoding,
resolves the deadline, sets the request id, counts and times the request, answers Server-Timing and
maps errors. A codec is pure: `decode(raw, target, context, signature)` reads bytes (or a message)
into requests, `encode(responses, decoded)` writes the answer; no I/O beyond the shared memory
regions a client registered (read at decode, written at encode), so each is unit-tested alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, Protocol, TypeVar

from inferd.config.model import ModelConfig
from inferd.types import Door, InferRequest, InferResponse, ModelMetadata, RequestContext

RawT = TypeVar("RawT", contravariant=True)
StateT = TypeVar("StateT")
AnswerT = TypeVar("AnswerT", covariant=True)


# NOTE: the per-request types here are plain slotted dataclasses, not frozen ones: a frozen one's
# construction costs about a microsecond more, paid several times by every request.
@dataclass(slots=True)
class Target:
    """The model (and version) a call is for, as the door names it."""

    model: str
    version: str = ""
    # TF Serving's version label ("stable"): the call resolves it through the model's config.
    label: str = ""
    # What the codec already read to find the model (OpenAI's parsed body), handed to `decode`,
    # so a body is parsed once; None where the route names the model.
    preread: Any = None


class Signature:
    """The serving version's config and, when a codec asks, its metadata (made then: the stream and
    OpenAI's codec read the config alone), for codecs that read a body by the model's inputs."""

    def __init__(self, config: ModelConfig, describe: Callable[[], ModelMetadata]) -> None:
        self.config = config
        self._describe = describe

    @cached_property
    def metadata(self) -> ModelMetadata:
        return self._describe()


@dataclass(slots=True)
class Decoded(Generic[StateT]):
    """A door's decoded request: the requests to run (one, or a body split in several, as OpenAI's
    texts are in chunks of the model's batch size), and what `encode` needs of the body."""

    requests: tuple[InferRequest, ...]
    state: StateT


class HttpBody(Protocol):
    """An HTTP door's raw request: the body (inflated when it was compressed) and the headers (names
    lower-cased). The server's own request is one, so an uncompressed body is handed on as it came."""

    @property
    def body(self) -> bytes: ...

    @property
    def headers(self) -> Mapping[bytes, bytes]: ...


@dataclass(slots=True)
class InflatedBody:
    """A compressed request's body, inflated, with its headers: an `HttpBody`."""

    body: bytes
    headers: Mapping[bytes, bytes]


@dataclass(slots=True)
class HttpAnswer:
    """An HTTP door's answer to a call that succeeded: the body and its content headers."""

    body: bytes
    headers: list[tuple[bytes, bytes]]


class Codec(Protocol[RawT, StateT, AnswerT]):
    @property
    def door(self) -> Door: ...

    @property
    def reads_signature(self) -> bool:
        """Whether `decode` reads the body by the model's signature (a class constant: a call per
        request would cost more than the answer)."""
        ...

    def decode(
        self, raw: RawT, target: Target, context: RequestContext, signature: Signature | None
    ) -> Decoded[StateT]: ...

    def encode(self, responses: Sequence[InferResponse], decoded: Decoded[StateT]) -> AnswerT: ...


# An HTTP door's codec; its routes name the target, or a function of the body finds it (OpenAI's).
HttpCodec = Codec[HttpBody, StateT, HttpAnswer]


class GrpcCodec(Codec[Any, StateT, Any], Protocol[StateT]):
    """A gRPC door's codec: its messages name their target."""

    def target(self, message: Any) -> Target: ...


class StreamCodec(GrpcCodec[StateT], Protocol[StateT]):
    """A codec of a stream's requests, each answered by one or more messages."""

    def encode_streamed(self, response: InferResponse, decoded: Decoded[StateT]) -> Any:
        """One of the request's responses as the stream's message."""
        ...

    def stream_ended(self, decoded: Decoded[StateT]) -> Sequence[Any]:
        """What the stream sends after a request's last response (Triton's empty final response)."""
        ...

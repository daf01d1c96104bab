"""The domain types every layer shares: datatypes, tensors, requests and responses.

Tensors hold numpy arrays. BYTES tensors are numpy object arrays whose elements are `bytes`; BF16
tensors hold `ml_dtypes.bfloat16` arrays.
Nothing here imports from inferd or does I/O.
"""

from __future__ import annotations

import enum
import itertools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import ml_dtypes
import numpy as np


class DataType(enum.Enum):
    """The KServe v2 tensor datatypes, valued by their wire names."""

    BOOL = "BOOL"
    UINT8 = "UINT8"
    UINT16 = "UINT16"
    UINT32 = "UINT32"
    UINT64 = "UINT64"
    INT8 = "INT8"
    INT16 = "INT16"
    INT32 = "INT32"
    INT64 = "INT64"
    FP16 = "FP16"
    BF16 = "BF16"
    FP32 = "FP32"
    FP64 = "FP64"
    BYTES = "BYTES"

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        return _NUMPY_DTYPES[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element on the wire; 0 for BYTES, whose elements carry their own length."""
        return 0 if self is DataType.BYTES else _NUMPY_DTYPES[self].itemsize

    @classmethod
    def from_wire(cls, name: str) -> DataType:
        """Raises ValueError for a name that is not a v2 datatype."""
        # A dict lookup: Enum's own call costs a microsecond, paid per tensor per request.
        datatype = _DATATYPES_BY_WIRE_NAME.get(name) if isinstance(name, str) else None
        if datatype is None:
            raise ValueError(f"{name!r} is not a v2 datatype")
        return datatype

    @classmethod
    def from_numpy(cls, dtype: np.dtype[Any]) -> DataType:
        if dtype.kind in ("O", "S", "U"):
            return DataType.BYTES
        try:
            return _DATATYPES_BY_NUMPY[np.dtype(dtype).newbyteorder("=")]
        except KeyError:
            raise ValueError(f"numpy dtype {dtype} has no v2 datatype") from None


# Little-endian everywhere: the v2 binary extension and gRPC raw contents are little-endian.
_NUMPY_DTYPES: dict[DataType, np.dtype[Any]] = {
    DataType.BOOL: np.dtype(np.bool_),
    DataType.UINT8: np.dtype("<u1"),
    DataType.UINT16: np.dtype("<u2"),
    DataType.UINT32: np.dtype("<u4"),
    DataType.UINT64: np.dtype("<u8"),
    DataType.INT8: np.dtype("<i1"),
    DataType.INT16: np.dtype("<i2"),
    DataType.INT32: np.dtype("<i4"),
    DataType.INT64: np.dtype("<i8"),
    DataType.FP16: np.dtype("<f2"),
    # bfloat16 as ml_dtypes defines it (numpy has none), the type tritonclient and JAX use too.
    DataType.BF16: np.dtype(ml_dtypes.bfloat16),
    DataType.FP32: np.dtype("<f4"),
    DataType.FP64: np.dtype("<f8"),
    DataType.BYTES: np.dtype(object),
}
_DATATYPES_BY_WIRE_NAME = {dt.value: dt for dt in DataType}
_DATATYPES_BY_NUMPY = {dtype.newbyteorder("="): dt for dt, dtype in _NUMPY_DTYPES.items() if dt is not DataType.BYTES}


# How a request to an endpoint reached its variant, as /metrics' `routed` label says: by the
# endpoint's weights (and sticky hash), or pinned by the client's header. Rollouts judge the first
# only, on one server (core.rollout) as across a fleet (inferd.rollout_queries).
ROUTED_BY_WEIGHT = "weight"
ROUTED_PINNED = "pinned"
# How far back a rollout's judge looks at most: the last minute of a step.
WINDOW_S = 60.0


class Door(enum.StrEnum):
    """The door a request comes in by, valued as the `protocol` label of the metrics names it."""

    KSERVE_HTTP = "kserve_http"
    KSERVE_GRPC = "kserve_grpc"  # unary ModelInfer and the ModelStreamInfer stream alike
    TFSERVING_REST = "tfserving_rest"
    TFSERVING_GRPC = "tfserving_grpc"
    SAGEMAKER = "sagemaker"
    OPENAI = "openai"
    TORCHSERVE = "torchserve"


# The `protocol` label of an ensemble's step: the ensemble's own request counts under its door.
ENSEMBLE_STEP = "ensemble"
# The `protocol` label of an endpoint's shadow copy: counted apart from the client's own request.
SHADOW_COPY = "shadow"
# The `protocol` label of a batch transform's requests, made in-process (`inferd batch`).
BATCH_TRANSFORM = "batch"
PROTOCOLS = (*(door.value for door in Door), ENSEMBLE_STEP, SHADOW_COPY, BATCH_TRANSFORM)


_REQUEST_ID_PREFIX = os.urandom(4).hex()
_request_counter = itertools.count(1)


def new_request_id() -> str:
    """A 16-hex-digit id for requests that bring none: a random per-process prefix and a counter
    (unique within the process, distinct across processes, no system call per request)."""
    return f"{_REQUEST_ID_PREFIX}{next(_request_counter) & 0xFFFFFFFF:08x}"


def element_count(shape: tuple[int, ...]) -> int:
    """Python ints, so a hostile shape cannot overflow into a small number."""
    return math.prod(shape)


@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    datatype: DataType
    shape: tuple[int, ...]
    data: np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class RequestedOutput:
    name: str
    # Wire-level wishes (such as binary_data) travel untouched to the encoder.
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class InferRequest:
    model_name: str
    # "" means the version the model's policy serves by default (the newest ready one).
    model_version: str
    inputs: tuple[Tensor, ...]
    # Empty means "every output of the model".
    outputs: tuple[RequestedOutput, ...] = ()
    parameters: Mapping[str, Any] = field(default_factory=dict)
    # The v2 `id` the client sent, echoed verbatim in the response ("" when absent).
    id: str = ""
    # Who asked, by which door, until when, and where its time went: one object, built once by the
    # call that took the request (server.inference_call), read by every layer below.
    context: RequestContext = field(default_factory=lambda: RequestContext())


class EndpointRoute(Protocol):
    """Where a request to an endpoint went (`core.endpoints.Route`): its answer names the variant,
    and its outcome is counted under the endpoint and variant."""

    @property
    def endpoint(self) -> str: ...

    @property
    def variant(self) -> str: ...

    @property
    def variant_header(self) -> bytes: ...

    @property
    def shadowed(self) -> bool: ...

    def observe(self, latency_s: float, outcome: str) -> None:
        """The request ended `latency_s` after it began, with `outcome` ("success" or the error code)."""
        ...

    @property
    def succeeded(self) -> Callable[[list[float]], None]:
        """Record a success as [its end on `clock`, its seconds]: `observe`'s success, with no
        Python frame (the dispatcher's call on every successful request to an endpoint)."""
        ...

    @property
    def clock(self) -> Callable[[], float]: ...


@dataclass(slots=True)
class RequestContext:
    """A request's context, as the call that took it resolved it once: carried on the request into
    the scheduler's unit of work and the executions, never looked up from a context variable (only
    the logging's request id is one, for log lines written far from any request)."""

    # Correlates logs, errors and headers: X-Request-ID (gRPC metadata), else the body's own id
    # (v2's `id`), else generated.
    request_id: str = ""
    # When the client stops waiting, on time.monotonic()'s clock; None when it did not say.
    # Resolved once, from whichever header or field the door carries.
    deadline_s: float | None = None
    # The door it came in by (a Door, ENSEMBLE_STEP or SHADOW_COPY): a label of its metrics.
    door: str = Door.KSERVE_HTTP
    timing: RequestTiming = field(default_factory=lambda: RequestTiming())
    trace: object = None
    """The server's handle on this request's trace (`inferd.server.tracing.RequestTrace`) when it
    traces the request, else None. Opaque to core, which hands it back to the tracer with the
    execution that served the request (`inferd.core.tracing`)."""
    route: EndpointRoute | None = None
    """Set when the request named an endpoint: the variant it was routed to (`core.endpoints`)."""
    cache_bypass: bool = False
    """The client asked for a fresh answer (`Cache-Control: no-cache`): the response cache is not read."""
    cache: str = ""
    """Set by the response cache for a model that caches: "hit" or "miss" (of several requests, a
    miss if any missed); "" otherwise."""

    def request(
        self,
        model: str,
        version: str,
        inputs: Sequence[Tensor],
        outputs: Sequence[RequestedOutput] = (),
        parameters: Mapping[str, Any] | None = None,
        id: str = "",
    ) -> InferRequest:
        """A request of this context: its id made now when neither the transport nor the body (`id`,
        v2's) gave one."""
        if not self.request_id:
            self.request_id = id or new_request_id()
        return InferRequest(
            model, version, tuple(inputs), tuple(outputs), parameters if parameters is not None else {}, id, self
        )


@dataclass(slots=True)
class RequestTiming:
    """Where one request's time went, in seconds. Each layer fills in its own part as the request
    passes (the transport: decode and encode; the core: queue, batch-wait and compute), so this one
    object is mutable while the request types around it are frozen."""

    decode_s: float = 0.0
    queue_s: float = 0.0
    """Waiting for a free instance."""
    batch_wait_s: float = 0.0
    """Waiting, with an instance free, for more requests to join the batch."""
    compute_input_s: float = 0.0
    """Merging the batch's inputs."""
    compute_infer_s: float = 0.0
    """Running the batch on the runtime."""
    compute_output_s: float = 0.0
    """Splitting the batch's outputs back per request."""
    encode_s: float = 0.0
    rows: int = 0
    """Rows of this request."""
    batch_rows: int = 0
    """Rows of the batch the request ran in (its own and its neighbours')."""
    cache_hit: bool = False
    """The response cache answered it: it was never queued nor computed."""

    @property
    def compute_s(self) -> float:
        return self.compute_input_s + self.compute_infer_s + self.compute_output_s


@dataclass(frozen=True, slots=True)
class InferResponse:
    model_name: str
    model_version: str
    request_id: str
    outputs: tuple[Tensor, ...]
    id: str = ""

    def as_numpy(self, name: str) -> np.ndarray[Any, Any]:
        """The output named `name` (as tritonclient's results name it); KeyError names the outputs there are."""
        for tensor in self.outputs:
            if tensor.name == name:
                return tensor.data
        raise KeyError(f"the response has no output {name!r}; it has {[t.name for t in self.outputs]}")


@dataclass(frozen=True, slots=True)
class LoadTimings:
    """Where a model version's load went, in seconds: the cold-start breakdown."""

    session_s: float
    """Creating the runtime sessions (reading the file, optimizing the graph)."""
    warmup_s: float
    """The config's warm-up samples and the timing runs that place the model."""
    fetch_s: float = 0.0
    """Bringing the files to a local folder (0 for a local repository)."""


@dataclass(frozen=True, slots=True)
class ModelIndexEntry:
    """One row of the repository index: a model version, or a model without any ("" version)."""

    name: str
    version: str = ""
    # A ModelState value; "" for a model of the repository that was never loaded.
    state: str = ""
    reason: str = ""
    # How the version's last successful load spent its time.
    timings: LoadTimings | None = None


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True, slots=True)
class DurationStatistic:
    """Triton's StatisticDuration: how many, and their total time in nanoseconds."""

    count: int = 0
    ns: int = 0


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    batch_size: int
    compute_input: DurationStatistic
    compute_infer: DurationStatistic
    compute_output: DurationStatistic


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """Cumulative counts and durations of one model version (Triton's statistics extension)."""

    name: str
    version: str
    last_inference_ms: int
    inference_count: int
    execution_count: int
    success: DurationStatistic
    fail: DurationStatistic
    queue: DurationStatistic
    compute_input: DurationStatistic
    compute_infer: DurationStatistic
    compute_output: DurationStatistic
    batches: tuple[BatchStatistics, ...]
    # Answers the response cache gave, and those it did not have (then the model ran), with the
    # time each took in the cache.
    cache_hit: DurationStatistic = field(default_factory=lambda: DurationStatistic())
    cache_miss: DurationStatistic = field(default_factory=lambda: DurationStatistic())

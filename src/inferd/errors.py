"""The error tree. Each error carries a stable `ErrorCode`; `protocol.status` maps codes to HTTP and
gRPC statuses in exactly two tables, so no layer below the wire knows about status numbers.

    InferdError
    ├── InvalidRequestError          the request itself is wrong (400 / INVALID_ARGUMENT)
    │   ├── MalformedRequestError        not parseable: JSON, header length, binary sizes
    │   ├── TensorDataError              data does not match its declared shape/datatype
    │   ├── UnknownTensorError           input or output name the model does not have
    │   ├── MissingInputError            a required input is absent
    │   ├── DatatypeMismatchError        datatype differs from the model's
    │   ├── ShapeMismatchError           shape differs from the model's (non-batch dims)
    │   ├── BatchSizeError               batch dimension missing, too large or inconsistent
    │   ├── MethodNotAllowedError        wrong HTTP method for the path (405)
    │   ├── LoadRequestError             a repository load asked for could not be done (the reason attached)
    │   ├── UnsupportedError             a request the server's configuration does not allow (model control mode)
    │   ├── UnsupportedMediaTypeError    a Content-Type (or Content-Encoding) the door does not read (415)
    │   ├── NotAcceptableError           an Accept the door cannot answer (406)
    │   ├── AlreadyExistsError           a name taken already (409)
    │   └── ModelRaisedError             a model's code raised on this request's rows (Python models)
    ├── UnauthenticatedError         no credentials, or credentials the server does not know (401)
    ├── PermissionDeniedError        known credentials that do not cover the operation (403)
    ├── RequestTooLargeError         body above the server's limit (413 / RESOURCE_EXHAUSTED)
    ├── ModelTooLargeError           a model cannot fit the memory budget even after eviction (507)
    ├── TooManyModelsError           the server holds as many models loaded from folders as it may (507)
    ├── NotFoundError                (404 / NOT_FOUND)
    │   ├── ModelNotFoundError
    │   └── VersionNotFoundError
    ├── UnavailableError             (503 / UNAVAILABLE), with a Retry-After estimate when known
    │   ├── ModelNotReadyError           loading, unloading or failed to load (reason attached)
    │   ├── OverloadedError              the model's queue is full, or a request timed out in it
    │   └── DeadlineUnreachableError     the request's deadline cannot be met: refused at once
    ├── ModelLoadError               raised while loading; becomes the model's failure reason
    │   └── ModelConfigError             config.pbtxt cannot be parsed or is inconsistent
    └── InternalError                a bug or a runtime failure (500 / INTERNAL)
        └── ModelOutputError             a model's outputs break its contract: the model's fault
"""

from __future__ import annotations

import enum
import functools
import os
import re
from typing import Any, ClassVar, TypeVar


class ErrorCode(enum.Enum):
    """Stable, machine-readable codes; clients may branch on them."""

    MALFORMED_REQUEST = "MALFORMED_REQUEST"
    INVALID_TENSOR_DATA = "INVALID_TENSOR_DATA"
    UNKNOWN_TENSOR = "UNKNOWN_TENSOR"
    MISSING_INPUT = "MISSING_INPUT"
    DATATYPE_MISMATCH = "DATATYPE_MISMATCH"
    SHAPE_MISMATCH = "SHAPE_MISMATCH"
    BATCH_SIZE = "BATCH_SIZE"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    METHOD_NOT_ALLOWED = "METHOD_NOT_ALLOWED"
    LOAD_REQUEST_FAILED = "LOAD_REQUEST_FAILED"
    UNSUPPORTED = "UNSUPPORTED"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    NOT_ACCEPTABLE = "NOT_ACCEPTABLE"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    REQUEST_TOO_LARGE = "REQUEST_TOO_LARGE"
    MODEL_TOO_LARGE = "MODEL_TOO_LARGE"
    TOO_MANY_MODELS = "TOO_MANY_MODELS"
    MODEL_NOT_FOUND = "MODEL_NOT_FOUND"
    VERSION_NOT_FOUND = "VERSION_NOT_FOUND"
    NOT_FOUND = "NOT_FOUND"
    MODEL_NOT_READY = "MODEL_NOT_READY"
    UNAVAILABLE = "UNAVAILABLE"
    OVERLOADED = "OVERLOADED"
    DEADLINE_UNREACHABLE = "DEADLINE_UNREACHABLE"
    MODEL_LOAD_FAILED = "MODEL_LOAD_FAILED"
    MODEL_CONFIG_INVALID = "MODEL_CONFIG_INVALID"
    MODEL_RAISED = "MODEL_RAISED"
    MODEL_OUTPUT_INVALID = "MODEL_OUTPUT_INVALID"
    INTERNAL = "INTERNAL"


def with_triton_phrase(phrase: str, message: str) -> str:
    """Triton's words for the same condition first (client programs written for Triton match on
    them: "Request for unknown model", ...), then inferd's own message. The README's table lists them."""
    return f"{phrase}: {message}"


class InferdError(Exception):
    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        tensor: str | None = None,
        expected: str | None = None,
        actual: str | None = None,
        server_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.tensor = tensor
        self.expected = expected
        self.actual = actual
        # The message as the server's log writes it, with what clients are not shown (the server's
        # file paths, a library's source locations); None when it is the message itself.
        self.server_message = server_message
        # Set by whichever layer knows it, so the wire can report it even for undecodable requests.
        self.request_id: str | None = None
        # Set by the inference call when the request went to an endpoint's variant: the error
        # answer names it, as a successful one does.
        self.variant: str | None = None

    @property
    def logged(self) -> str:
        """What the server's log says: the full message, paths included."""
        return self.server_message or self.message

    def details(self) -> dict[str, Any]:
        """The machine-readable fields that sit beside the message on the wire."""
        fields: dict[str, Any] = {"code": self.code.value}
        if self.tensor is not None:
            fields["tensor"] = self.tensor
        if self.expected is not None:
            fields["expected"] = self.expected
        if self.actual is not None:
            fields["actual"] = self.actual
        return fields


class InvalidRequestError(InferdError):
    code = ErrorCode.INVALID_ARGUMENT


class MalformedRequestError(InvalidRequestError):
    code = ErrorCode.MALFORMED_REQUEST


class TensorDataError(InvalidRequestError):
    code = ErrorCode.INVALID_TENSOR_DATA


class UnknownTensorError(InvalidRequestError):
    code = ErrorCode.UNKNOWN_TENSOR


class MissingInputError(InvalidRequestError):
    code = ErrorCode.MISSING_INPUT


class DatatypeMismatchError(InvalidRequestError):
    code = ErrorCode.DATATYPE_MISMATCH


class ShapeMismatchError(InvalidRequestError):
    code = ErrorCode.SHAPE_MISMATCH


class BatchSizeError(InvalidRequestError):
    code = ErrorCode.BATCH_SIZE


class MethodNotAllowedError(InvalidRequestError):
    code = ErrorCode.METHOD_NOT_ALLOWED

    def __init__(self, message: str, *, allowed: tuple[str, ...]) -> None:
        super().__init__(message)
        # The methods the path takes, for the HTTP Allow header.
        self.allowed = allowed


class LoadRequestError(InvalidRequestError):
    """The client asked to load a model whose files or config are broken; what served still serves."""

    code = ErrorCode.LOAD_REQUEST_FAILED


class UnsupportedError(InvalidRequestError):
    code = ErrorCode.UNSUPPORTED


class StreamOnlyModelError(UnsupportedError):
    """A call that takes one response made to a decoupled model, which answers with a stream of
    them. The core says so in no transport's words; each transport names itself (`unary_call`), as
    Triton's HTTP and gRPC answers do."""

    def __init__(self, model: str) -> None:
        super().__init__(
            f"model '{model}' is decoupled: it answers a request with a stream of responses; call it over gRPC's "
            "ModelStreamInfer "
            "(tritonclient's start_stream and async_stream_infer)"
        )

    def unary_call(self, transport: str) -> UnsupportedError:
        """This error as `transport` ("HTTP end point", "ModelInfer RPC") words it."""
        worded = UnsupportedError(
            f"{transport} doesn't support models with decoupled transaction policy: {self.message}"
        )
        worded.request_id = self.request_id
        return worded


class UnsupportedMediaTypeError(InvalidRequestError):
    """A body in a Content-Type the door does not read (415)."""

    code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class UnsupportedEncodingError(UnsupportedMediaTypeError):
    """A body in a Content-Encoding the server does not read (415, with the Accept-Encoding it does)."""

    def __init__(self, message: str, *, accepted: str) -> None:
        super().__init__(message)
        self.accepted = accepted


class NotAcceptableError(InvalidRequestError):
    """An Accept header that names no type the door can answer in (406)."""

    code = ErrorCode.NOT_ACCEPTABLE


class AlreadyExistsError(InvalidRequestError):
    """A name taken already: a model loaded under it (409)."""

    code = ErrorCode.ALREADY_EXISTS


class UnauthenticatedError(InferdError):
    """No credentials where the server asks for them, or a token it does not hold (401)."""

    code = ErrorCode.UNAUTHENTICATED


class PermissionDeniedError(InferdError):
    """A token the server holds, for another scope: an inference token on a management route (403)."""

    code = ErrorCode.PERMISSION_DENIED


class RequestTooLargeError(InferdError):
    code = ErrorCode.REQUEST_TOO_LARGE


class ModelTooLargeError(InferdError):
    code = ErrorCode.MODEL_TOO_LARGE


class TooManyModelsError(InferdError):
    """A model load refused because the server holds as many such models as it may: SageMaker's
    contract asks for 507 then, and the platform unloads a model it no longer uses and retries."""

    code = ErrorCode.TOO_MANY_MODELS


class NotFoundError(InferdError):
    code = ErrorCode.NOT_FOUND


class ModelNotFoundError(NotFoundError):
    code = ErrorCode.MODEL_NOT_FOUND


class VersionNotFoundError(NotFoundError):
    code = ErrorCode.VERSION_NOT_FOUND


class UnavailableError(InferdError):
    code = ErrorCode.UNAVAILABLE

    def __init__(self, message: str, *, retry_after_s: float | None = None, **fields: str | None) -> None:
        super().__init__(message, **fields)
        # How long the client should wait before retrying, when the server can estimate it.
        self.retry_after_s = retry_after_s

    def details(self) -> dict[str, Any]:
        fields = super().details()
        if self.retry_after_s is not None:
            fields["retry_after_ms"] = round(self.retry_after_s * 1000, 3)
        return fields


class OverloadedError(UnavailableError):
    code = ErrorCode.OVERLOADED


class DeadlineUnreachableError(UnavailableError):
    code = ErrorCode.DEADLINE_UNREACHABLE


class ModelNotReadyError(UnavailableError):
    code = ErrorCode.MODEL_NOT_READY


class ModelLoadError(InferdError):
    code = ErrorCode.MODEL_LOAD_FAILED


class ModelConfigError(ModelLoadError):
    code = ErrorCode.MODEL_CONFIG_INVALID


class InternalError(InferdError):
    code = ErrorCode.INTERNAL


class ModelRaisedError(InvalidRequestError):
    """A model's own code raised while executing this request (run alone, so it was this request's
    rows): the model's message, with its name and version. Other requests of the batch are served."""

    code = ErrorCode.MODEL_RAISED


class ModelOutputError(InternalError):
    """A model returned outputs that break its own contract (a missing output, the wrong datatype,
    shape or number of rows): the model's fault, never the request's."""

    code = ErrorCode.MODEL_OUTPUT_INVALID


E = TypeVar("E", bound=InferdError)


def with_context(error: E, context: str) -> E:
    """The same error (class, code and fields) with `context` put before its message: where, inside
    a larger operation, it happened (an ensemble's step, say). The original is left as it was."""
    located = copied(error)
    located.message = f"{context}: {error.message}"
    located.args = (located.message,)
    if error.server_message is not None:
        located.server_message = f"{context}: {error.server_message}"
    return located


def relative_to_model_folder(error: E, model_dir: str) -> E:
    """`error` as clients see it: paths inside the model's folder `model_dir` (on the server) named
    relative to it (`1/model.py`), the folder itself as "the model's folder". The server's log keeps
    the full message (`logged`). The error itself when its message names no such path.

    The one place a model's server paths leave messages: whoever knows a model's folder (its
    loading, its runtime) passes the errors it raises through here."""
    message = error.message
    for folder in dict.fromkeys((model_dir, os.path.realpath(model_dir))):  # as given, and as resolved
        folder = folder.rstrip("/")
        if not folder:
            continue
        # Not inside a longer name (`/srv/models/m` in `/srv/models/m2/...`, `m` in `/srv/item/`).
        message = re.sub(
            r"(?<![\w./-])" + re.escape(folder) + r"(?:(/)|(?![\w-]|\.\w))",
            lambda found: "" if found.group(1) else "the model's folder",
            message,
        )
    if message == error.message:
        return error
    shown = copied(error)
    shown.message = message
    shown.args = (message,)
    shown.server_message = error.logged
    shown.request_id = error.request_id
    return shown


def copied(error: E) -> E:
    """A copy of `error` (class, code, message and fields) for one of several requests that share
    its cause (a merged batch's), without the request id, which each request sets to its own."""
    # Not copy.copy: that calls __init__ again, whose arguments differ per class.
    copy = type(error).__new__(type(error))
    copy.__dict__.update(error.__dict__)
    copy.args = error.args
    copy.__traceback__ = error.__traceback__
    copy.request_id = None
    return copy


def error_from_code(
    code: ErrorCode,
    message: str,
    *,
    tensor: str | None = None,
    expected: str | None = None,
    actual: str | None = None,
    retry_after_s: float | None = None,
) -> InferdError:
    """The error of this code, rebuilt from its wire fields: what a client raises for a server's
    machine-readable error, so callers catch `ShapeMismatchError` rather than parse messages."""
    cls = _classes_by_code().get(code, InferdError)
    # Not cls(...): subclasses add constructor arguments (MethodNotAllowedError's `allowed`).
    error = cls.__new__(cls)
    InferdError.__init__(error, message, tensor=tensor, expected=expected, actual=actual)
    if isinstance(error, UnavailableError):
        error.retry_after_s = retry_after_s
    if isinstance(error, MethodNotAllowedError):
        error.allowed = ()
    return error


@functools.cache  # the tree is fixed once the module is imported
def error_classes() -> dict[ErrorCode, tuple[type[InferdError], ...]]:
    """Every class of the error tree, by its code: the most general first (a class before its
    subclasses), the others by name. The docs' error reference lists them."""
    classes: dict[ErrorCode, list[type[InferdError]]] = {}
    pending: list[type[InferdError]] = [InferdError]
    while pending:
        cls = pending.pop(0)
        if cls not in classes.get(cls.code, []):
            classes.setdefault(cls.code, []).append(cls)
        pending.extend(sorted(cls.__subclasses__(), key=lambda sub: sub.__name__))
    return {code: tuple(found) for code, found in classes.items()}


@functools.cache
def _classes_by_code() -> dict[ErrorCode, type[InferdError]]:
    """The class a code is raised as: its most general one."""
    return {code: found[0] for code, found in error_classes().items()}

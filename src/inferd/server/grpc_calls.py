"""How a gRPC method's call is answered, for every gRPC door: its result, or its error aborting
the call with the status from `protocol.status`'s table, the message, and trailing metadata
carrying the request id and inferd's machine-readable fields (inferd-code, inferd-tensor, ...)."""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from inferd.errors import InferdError, InternalError, UnavailableError
from inferd.protocol.endpoint_headers import VARIANT_HEADER
from inferd.protocol.request_id import REQUEST_ID_HEADER, header_value
from inferd.protocol.status import grpc_status
from inferd.server.logging import RequestErrorLog
from inferd.types import new_request_id

logger = logging.getLogger("inferd.grpc")
_errors_log = RequestErrorLog(logger)

T = TypeVar("T")


async def call(context: grpc.aio.ServicerContext, method: str, build: Callable[[], T]) -> T:
    async def run() -> T:
        return build()

    return await call_async(context, method, run)


async def call_async(context: grpc.aio.ServicerContext, method: str, build: Callable[[], Awaitable[T]]) -> T:
    try:
        return await build()
    except InferdError as exc:
        await abort(context, method, exc, metadata_request_id(context) or new_request_id())
    except Exception:
        await abort_unexpected(context, method, metadata_request_id(context))
    raise AssertionError("unreachable: abort raises")


async def abort(context: grpc.aio.ServicerContext, method: str, error: InferdError, request_id: str) -> None:
    status = grpc_status(error.code)
    _errors_log.log(
        status is grpc.StatusCode.INTERNAL,
        error.code,
        "%s -> %s %s: %s",
        method,
        status.name,
        error.code.value,
        error.logged,
        extra={"request_id": request_id},
    )
    # The machine-readable fields the REST body carries, as trailing metadata: inferd-code, inferd-tensor, ...
    details = tuple(
        (f"inferd-{key.replace('_', '-')}", header_value(str(value))) for key, value in error.details().items()
    )
    retry_after: tuple[tuple[str, str], ...] = ()
    if isinstance(error, UnavailableError) and error.retry_after_s is not None:
        retry_after = (("retry-after", str(max(1, math.ceil(error.retry_after_s)))),)
    variant = ((VARIANT_HEADER, header_value(error.variant)),) if error.variant is not None else ()
    context.set_trailing_metadata(((REQUEST_ID_HEADER, header_value(request_id)), *details, *retry_after, *variant))
    await context.abort(status, error.message)


async def abort_unexpected(context: grpc.aio.ServicerContext, method: str, request_id: str) -> None:
    request_id = request_id or new_request_id()
    logger.exception("unexpected error in %s", method, extra={"request_id": request_id})
    await abort(context, method, InternalError("internal error; see the server log"), request_id)


def metadata_request_id(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_HEADER:
            return str(value)
    return ""

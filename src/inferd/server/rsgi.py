"""inferd's REST edge on granian (experimental: `inferd serve --http-server granian`).

granian (Rust, hyper) parses HTTP and writes responses on its own thread; each request is handed
to this module's RSGI callback as a task on inferd's event loop (the one grpc.aio runs on), which
builds the same `HttpRequest` that `server.http11` builds and answers the `HttpApp`'s
`HttpResponse` with one `response_bytes`. `GranianServer` has `HttpServer`'s surface (`start`,
`port`, `shutdown`), so app.py can pick either.

`HttpLimits` on this edge, held natively, around granian, or not at all:
* `max_head_bytes`: hyper's read buffer (`max_buffer_size`, at least 8 KiB) bounds the head: 431.
* `read_timeout_s` for the head: hyper's `header_read_timeout` (it closes; no 408 is written).
* `keep_alive_s`: no setting; hyper's header-read timer also runs while a kept-alive connection
  waits for its next request, so an idle connection closes after `read_timeout_s`.
* `max_request_bytes`: here, by the declared Content-Length (the body is never read: 413, then
  hyper closes) or, chunked, as the body streams in.
* `spool`: here, as in http11: an async submit's body past the spool's `memory_bytes` is written
  to a file as it streams in, up to the spool's own limit, and handed over as `body_file`.
A body shorter than its Content-Length (the client went midway) reaches no handler, and its file
is removed. A chunked body cut off between two chunks looks whole to this edge (granian ends the
stream as it does at the last chunk): it reaches the handler as far as it came.
* `min_body_bytes_per_s`: here, by a sweep over the bodies being read (as http11 does): a body
  behind its pace has its read cancelled and gets 408. A body under 64 KiB is read whole and must
  arrive within `read_timeout_s` of its head.
* `write_timeout_s`: by the kernel: TCP_USER_TIMEOUT on the listening socket (inherited by every
  accepted one) drops a connection whose sent bytes, zero-window probes included, stay
  unacknowledged that long.
* `max_connections`: granian's `backpressure`, a semaphore taken before each accept and held for
  the connection's life: one more connection waits in the listen backlog instead of getting 503.
* `max_pipelined`: hyper answers pipelined requests one at a time and reads no further than
  `max_buffer_size` ahead: bounded in bytes, not requests.
* `linger_s`: hyper's own close after a refusal.
A client that disconnects cancels its request as in http11, but only once it has been in flight
for a sweep (a quarter second): granian does not cancel it, and a watcher per request would cost
every request a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from inferd.server.auth import is_loopback_host
from inferd.server.http11 import BodySpool, Handler, HttpLimits, HttpRequest, HttpResponse

if TYPE_CHECKING:
    from granian._granian import RSGIHTTPProtocol as HTTPProtocol
    from granian.rsgi import Scope

    from inferd.server.tls import TlsFiles

logger = logging.getLogger("inferd.http")

# A body declared under this size is read whole, and must arrive within the read timeout; a larger
# or chunked one is read as it streams in, its pace checked against what has arrived.
_READ_WHOLE_BELOW = 64 * 1024
_CLOSE = ("connection", "close")


class _BodyClock:
    """A body being read: when its head ended, what has arrived, and whether the sweep cut it off."""

    __slots__ = ("allowance", "expired", "received", "started")

    def __init__(self, started: float, allowance: float) -> None:
        self.started = started
        self.allowance = allowance
        self.received = 0
        self.expired = False


class _BodyTimeout(Exception):
    pass


class _BodyCutOff(Exception):
    def __init__(self, received: int) -> None:
        super().__init__(received)
        self.received = received


class _BodyTooLarge(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class GranianServer:
    """Serves `handler` on one listening socket with granian's embedded server, in this event loop."""

    def __init__(self, handler: Handler, limits: HttpLimits | None = None) -> None:
        self.handler = handler
        self.limits = limits or HttpLimits()
        self._port = 0
        self._server: Any = None
        self._serving: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        # Requests in flight (their tasks and protocols); those a sweep saw in flight before; the
        # disconnect watchers of those; the tasks cancelled on purpose (a client gone, a shutdown).
        self._in_flight: dict[asyncio.Task[Any], HTTPProtocol] = {}
        self._seen: set[asyncio.Task[Any]] = set()
        self._watchers: dict[asyncio.Task[Any], asyncio.Future[Any]] = {}
        self._dropped: set[asyncio.Task[Any]] = set()
        self._reading: dict[asyncio.Task[Any], _BodyClock] = {}

    async def start(self, host: str, port: int, *, backlog: int = 2048, tls: TlsFiles | None = None) -> None:
        from granian._granian import SocketHolder
        from granian.constants import HTTPModes, Interfaces, SSLProtocols
        from granian.http import HTTP1Settings
        from granian.log import LogLevels
        from granian.server.embed import Server

        limits = self.limits
        listener = socket.create_server((host, port), backlog=backlog)
        # The write timeout: the kernel drops a connection whose client acknowledges nothing
        # (its window shut) for this long. Accepted sockets inherit it.
        listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(limits.write_timeout_s * 1000))
        listener.setblocking(False)
        self._port = int(listener.getsockname()[1])
        # granian's listener owns the descriptor from here (and closes it when it stops).
        holder = SocketHolder(listener.detach(), False, backlog)  # type: ignore[call-arg]

        class _Embedded(Server):
            def _init_shared_socket(self) -> None:
                self._ssp, self._shd = None, holder  # type: ignore[assignment]

        self._server = _Embedded(
            self,
            address=host,
            port=self._port,
            interface=Interfaces.RSGI,
            http=HTTPModes.http1,
            websockets=False,
            backlog=backlog,
            backpressure=limits.max_connections,
            http1_settings=HTTP1Settings(
                header_read_timeout=int(limits.read_timeout_s * 1000),
                keep_alive=True,
                max_buffer_size=max(8192, limits.max_head_bytes),
            ),
            # granian's own lines go to inferd's handlers (root) rather than to its stdout handler.
            log_level=LogLevels.warning,
            log_dictconfig={"loggers": {"_granian": {"handlers": [], "propagate": True}}},
            ssl_cert=tls.cert if tls is not None else None,
            ssl_key=tls.key if tls is not None else None,
            ssl_protocol_min=SSLProtocols.tls12,
            ssl_ca=tls.client_ca if tls is not None else None,
            ssl_client_verify=tls is not None and tls.client_ca is not None,
        )
        loop = asyncio.get_running_loop()
        self._serving = loop.create_task(self._server.serve())
        self._sweeper = loop.create_task(self._sweep())

    @property
    def port(self) -> int:
        return self._port

    async def shutdown(self, timeout_s: float) -> None:
        """Stop accepting; answer what is in flight (up to `timeout_s`), then cancel the rest."""
        if self._server is None:
            return
        self._server.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
        deadline = time.monotonic() + timeout_s
        while self._in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for task in list(self._in_flight):
            self._drop(task)
        if self._serving is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._serving

    async def _sweep(self) -> None:
        limits = self.limits
        while True:
            await asyncio.sleep(min(0.25, limits.read_timeout_s / 4))
            now = time.monotonic()
            for task, clock in list(self._reading.items()):
                if now - clock.started > clock.allowance + clock.received / limits.min_body_bytes_per_s:
                    clock.expired = True
                    task.cancel()
            # granian does not cancel a request whose client left: a request in flight for a whole
            # sweep gets a watcher that does (the fast ones never pay for it).
            for task in self._seen.intersection(self._in_flight).difference(self._watchers):
                watcher = asyncio.ensure_future(self._in_flight[task].client_disconnect())
                watcher.add_done_callback(lambda _, task=task: self._drop(task))  # type: ignore[misc]
                self._watchers[task] = watcher
            self._seen = set(self._in_flight)

    def _drop(self, task: asyncio.Task[Any]) -> None:
        """Cancel a request nobody will read the answer of."""
        if task in self._in_flight and not task.done():
            self._dropped.add(task)
            task.cancel()

    # -- RSGI -------------------------------------------------------------------------------------

    async def __rsgi__(self, scope: Scope, protocol: HTTPProtocol) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._in_flight[task] = protocol
        try:
            request = await self._request(scope, protocol, task)
            if isinstance(request, HttpResponse):  # the body could not be read
                response, keep_alive = request, False
            else:
                try:
                    response = await self.handler(request)
                except Exception:
                    logger.exception("unhandled error serving %s %s", scope.method, scope.path)
                    response = HttpResponse(500, b"internal error; see the server log", close=True)
                finally:
                    if request.body_file is not None:  # not taken by the handler
                        request.body_file.unlink(missing_ok=True)
                keep_alive = request.keep_alive and not response.close
            headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in response.headers]
            if not keep_alive:
                headers.append(_CLOSE)
            protocol.response_bytes(response.status, headers, response.body)
        except asyncio.CancelledError:
            if task not in self._dropped:
                raise
            task.uncancel()  # the client left, or the server stops: nobody to answer
        finally:
            del self._in_flight[task]
            self._dropped.discard(task)
            watcher = self._watchers.pop(task, None)
            if watcher is not None:
                watcher.cancel()

    async def _request(
        self, scope: Scope, protocol: HTTPProtocol, task: asyncio.Task[Any]
    ) -> HttpRequest | HttpResponse:
        # Names come lower-cased; a repeated header keeps its last value, as in http11.
        headers = {name.encode(): value.encode() for name, value in scope.headers.items()}
        request = HttpRequest(
            method=scope.method,
            path=scope.path,  # percent-decoded by granian
            query=scope.query_string.encode(),
            headers=headers,
            body=b"",
            # hyper keeps or closes the connection as the client asked; only a refusal closes it here.
            keep_alive=True,
            local_peer=is_loopback_host(scope.client.rpartition(":")[0]),
        )
        declared = headers.get(b"content-length")
        spool = self.limits.spool
        if spool is not None and scope.method == "POST" and scope.path.endswith(spool.suffix.decode()):
            limit, request.limit = spool.max_bytes, (spool.max_bytes, spool.setting)
        else:
            spool, limit = None, self.limits.max_request_bytes
            request.limit = (limit, "--max-request-bytes")
        if declared is not None and declared.isdigit():
            size = int(declared)
            if size > limit:
                # Refused from its head: the body is never read.
                request.oversized, request.keep_alive = size, False
                return request
            if size == 0:
                return request
        elif b"transfer-encoding" not in headers:
            return request
        else:
            size = -1
        try:
            body = await self._read_body(protocol, task, size, limit, spool)
            if isinstance(body, Path):
                request.body_file = body
            else:
                request.body = body
        except _BodyTooLarge as exc:
            request.oversized, request.keep_alive = exc.size, False
        except _BodyTimeout:
            rate = self.limits.min_body_bytes_per_s
            return HttpResponse(408, f"request body arriving slower than {rate:g} bytes/s".encode(), close=True)
        except _BodyCutOff as exc:  # the client is gone: nothing of it reaches a handler
            return HttpResponse(400, f"request body cut off after {exc.received} of {size} bytes".encode(), close=True)
        return request

    async def _read_body(
        self, protocol: HTTPProtocol, task: asyncio.Task[Any], size: int, limit: int, spool: BodySpool | None
    ) -> bytes | Path:
        """The body: `size` bytes as declared, or -1 (chunked: up to `limit`); on a route that
        spools (`spool`), one past its `memory_bytes` goes to a file as it arrives (its path).

        A small body is read whole, and must arrive within `read_timeout_s` of its head; a larger
        or chunked one is read as it streams in, at `min_body_bytes_per_s` on average after that
        grace (http11's rule)."""
        clock = _BodyClock(time.monotonic(), self.limits.read_timeout_s)
        self._reading[task] = clock
        spooled: tuple[BinaryIO, Path] | None = None
        try:
            if 0 <= size < _READ_WHOLE_BELOW:
                whole: bytes = await protocol()
                if len(whole) != size:
                    raise _BodyCutOff(len(whole))
                return whole
            chunks: list[bytes] = []
            async for chunk in protocol:
                clock.received += len(chunk)
                if clock.received > limit:
                    raise _BodyTooLarge(clock.received)
                if spooled is not None:
                    spooled[0].write(chunk)  # NOTE: on the loop, as in http11: a disk keeps up with a socket
                    continue
                chunks.append(chunk)
                if spool is not None and clock.received > spool.memory_bytes:
                    spooled = spool.open()
                    spooled[0].writelines(chunks)
                    chunks = []
            if 0 <= size != clock.received:
                # granian ends the body's stream when the client goes: it was cut off. (NOTE: a
                # chunked body cut off between chunks cannot be told from a whole one here.)
                raise _BodyCutOff(clock.received)
            if spooled is not None:
                spooled[0].close()
                path, spooled = spooled[1], None
                return path
            return b"".join(chunks)
        except asyncio.CancelledError:
            if not clock.expired:
                raise
            task.uncancel()
            raise _BodyTimeout from None
        finally:
            del self._reading[task]
            if spooled is not None:  # cut off, too large or too slow: not kept
                spooled[0].close()
                spooled[1].unlink(missing_ok=True)

"""`Client`: the blocking face of `AsyncClient`, for scripts, notebooks and threads.

    with Client("http://localhost:8000") as client:
        client.infer("add_sub", {"INPUT0": a, "INPUT1": b}).as_numpy("OUTPUT0")

The calls run on an event loop of the client's own, on a daemon thread, so a `Client` works from
any thread (several at once share its connections) and inside a program that runs an event loop
of its own (a notebook) as well.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, TypeVar, Unpack

from inferd.client.aio import AsyncClient, ClientOptions, Inputs
from inferd.client.async_jobs import AsyncJob
from inferd.types import InferRequest, InferResponse, ModelIndexEntry, ModelMetadata, ModelStatistics, ServerMetadata

T = TypeVar("T")


class Client:
    def __init__(self, url: str, **options: Unpack[ClientOptions]) -> None:
        """The arguments are `AsyncClient`'s."""
        self._client = AsyncClient(url, **options)
        self.url, self.protocol = self._client.url, self._client.protocol
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="inferd-client", daemon=True)
        self._thread.start()

    def infer(
        self,
        model: str,
        inputs: Inputs,
        *,
        outputs: Iterable[str] = (),
        version: str = "",
        request_id: str = "",
        parameters: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> InferResponse:
        return self._run(
            self._client.infer(
                model,
                inputs,
                outputs=outputs,
                version=version,
                request_id=request_id,
                parameters=parameters,
                timeout_s=timeout_s,
            )
        )

    def infer_request(self, request: InferRequest, *, timeout_s: float | None = None) -> InferResponse:
        return self._run(self._client.infer_request(request, timeout_s=timeout_s))

    def server_live(self, *, timeout_s: float | None = None) -> bool:
        return self._run(self._client.server_live(timeout_s=timeout_s))

    def server_ready(self, *, timeout_s: float | None = None) -> bool:
        return self._run(self._client.server_ready(timeout_s=timeout_s))

    def model_ready(self, model: str, version: str = "", *, timeout_s: float | None = None) -> bool:
        return self._run(self._client.model_ready(model, version, timeout_s=timeout_s))

    def server_metadata(self, *, timeout_s: float | None = None) -> ServerMetadata:
        return self._run(self._client.server_metadata(timeout_s=timeout_s))

    def model_metadata(self, model: str, version: str = "", *, timeout_s: float | None = None) -> ModelMetadata:
        return self._run(self._client.model_metadata(model, version, timeout_s=timeout_s))

    def model_config(self, model: str, version: str = "", *, timeout_s: float | None = None) -> dict[str, Any]:
        return self._run(self._client.model_config(model, version, timeout_s=timeout_s))

    def statistics(
        self, model: str = "", version: str = "", *, timeout_s: float | None = None
    ) -> list[ModelStatistics]:
        return self._run(self._client.statistics(model, version, timeout_s=timeout_s))

    def repository_index(self, ready: bool = False, *, timeout_s: float | None = None) -> list[ModelIndexEntry]:
        return self._run(self._client.repository_index(ready, timeout_s=timeout_s))

    def load_model(
        self,
        model: str,
        *,
        config: Mapping[str, Any] | None = None,
        files: Mapping[str, bytes] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self._run(self._client.load_model(model, config=config, files=files, timeout_s=timeout_s))

    def unload_model(self, model: str, *, unload_dependents: bool = False, timeout_s: float | None = None) -> None:
        self._run(self._client.unload_model(model, unload_dependents=unload_dependents, timeout_s=timeout_s))

    def submit_async(self, model: str, inputs: Inputs | None = None, **options: Any) -> AsyncJob:
        """See `AsyncClient.submit_async`."""
        return self._run(self._client.submit_async(model, inputs, **options))

    def async_job(self, inference_id: str, *, wait_s: float = 0.0, timeout_s: float | None = None) -> AsyncJob:
        return self._run(self._client.async_job(inference_id, wait_s=wait_s, timeout_s=timeout_s))

    def wait_async(self, inference_id: str, *, timeout_s: float = 3600.0) -> AsyncJob:
        return self._run(self._client.wait_async(inference_id, timeout_s=timeout_s))

    def cancel_async(self, inference_id: str, *, timeout_s: float | None = None) -> AsyncJob:
        return self._run(self._client.cancel_async(inference_id, timeout_s=timeout_s))

    def list_async(self, *, model: str = "", state: str = "", limit: int = 100) -> list[AsyncJob]:
        return self._run(self._client.list_async(model=model, state=state, limit=limit))

    def call_json(self, method: str, path: str, document: Any = None, *, timeout_s: float | None = None) -> Any:
        return self._run(self._client.call_json(method, path, document, timeout_s=timeout_s))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

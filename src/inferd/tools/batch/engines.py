"""Where a batch job's requests run: an `Engine`.

`LocalEngine` (--engine local, the default) serves the model in this process through core's one
entry point (`core.in_process`), so each mini-batch goes down the dispatcher a server's request
takes (validated, batched by the model's config, answered as declared) with no HTTP hop.
`ServerEngine` (--engine server) sends each mini-batch to a KServe v2 server (inferd, Triton, a
fleet behind a balancer) through inferd's client, asking inferd to run it as background work
(the `inferd_admission` request parameter), so the server's online requests come first.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from inferd.client import NO_RETRIES, AsyncClient, ClientTls
from inferd.core.in_process import InProcessModels
from inferd.types import BATCH_TRANSFORM, ModelMetadata, RequestContext, RequestedOutput, Tensor


class Engine(Protocol):
    """A model that answers mini-batches: its signature, whether it batches, and the call."""

    @property
    def signature(self) -> ModelMetadata: ...

    @property
    def max_batch_size(self) -> int: ...

    async def infer(self, inputs: Sequence[Tensor], outputs: Sequence[str], timeout_s: float) -> tuple[Tensor, ...]:
        """The model's outputs (those named, or all when none is) for `inputs`; an InferdError
        the model or the engine raised, or TimeoutError past `timeout_s`."""
        ...

    async def close(self) -> None: ...


class LocalEngine:
    def __init__(self, models: InProcessModels, model: str, version: str, signature: ModelMetadata, batch: int) -> None:
        self._models = models
        self._model = model
        self._version = version
        self._signature = signature
        self._max_batch_size = batch
        self._cache: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    async def open(
        cls, repositories: Sequence[str], model: str, version: str = "", *, execution_threads: int = 0
    ) -> LocalEngine:
        """`model` of the repositories (folders or fsspec URLs) loaded in this process."""
        cache = tempfile.TemporaryDirectory(prefix="inferd-batch-")
        try:
            models = await InProcessModels.open(
                repositories, [model], Path(cache.name), execution_threads=execution_threads
            )
        except BaseException:
            cache.cleanup()
            raise
        config = await models.config(model, version)
        engine = cls(models, model, version, models.metadata(model, version), config.max_batch_size)
        engine._cache = cache
        return engine

    @property
    def signature(self) -> ModelMetadata:
        return self._signature

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    async def infer(self, inputs: Sequence[Tensor], outputs: Sequence[str], timeout_s: float) -> tuple[Tensor, ...]:
        context = RequestContext(deadline_s=time.monotonic() + timeout_s, door=BATCH_TRANSFORM)
        asked = [RequestedOutput(name) for name in outputs]
        response = await self._models.infer(context.request(self._model, self._version, inputs, asked))
        return response.outputs

    async def close(self) -> None:
        await self._models.close()
        if self._cache is not None:
            self._cache.cleanup()


# The request parameter that asks an inferd server to run a request as background work
# (core.scheduler.ADMISSION_PARAMETER; other KServe v2 servers pass it on unread).
BACKGROUND = {"inferd_admission": "background"}


class ServerEngine:
    def __init__(self, client: AsyncClient, model: str, version: str, signature: ModelMetadata, batch: int) -> None:
        self._client = client
        self._model = model
        self._version = version
        self._signature = signature
        self._max_batch_size = batch

    @classmethod
    async def open(
        cls,
        url: str,
        model: str,
        version: str = "",
        *,
        connections: int,
        tls: ClientTls | None = None,
        token: str | None = None,
    ) -> ServerEngine:
        """`model` of the server at `url` (http(s):// or grpc(s)://), through at most
        `connections` calls at once; the job's own retries are the only ones (the client makes
        none)."""
        client = AsyncClient(
            url, max_in_flight=connections, connections=connections, retry=NO_RETRIES, tls=tls, token=token
        )
        try:
            signature = await client.model_metadata(model, version)
            config = await client.model_config(model, version)
        except BaseException:
            await client.close()
            raise
        return cls(client, model, version, signature, int(config.get("max_batch_size", 0)))

    @property
    def signature(self) -> ModelMetadata:
        return self._signature

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    async def infer(self, inputs: Sequence[Tensor], outputs: Sequence[str], timeout_s: float) -> tuple[Tensor, ...]:
        response = await self._client.infer(
            self._model,
            list(inputs),
            outputs=outputs,
            version=self._version,
            parameters=BACKGROUND,
            timeout_s=timeout_s,
        )
        return response.outputs

    async def close(self) -> None:
        await self._client.close()


@dataclass(frozen=True)
class EngineSpec:
    """Which engine a job runs on, and what it needs to open it."""

    kind: str = "local"  # local | server | ray
    repositories: tuple[str, ...] = ()  # local, ray: the model repositories
    ray_address: str = ""  # ray: the cluster's head (host:port); "": a Ray of this machine
    url: str = ""  # server: the server's URL
    execution_threads: int = 0  # local: worker threads (0: the default)
    tls: ClientTls | None = None  # server
    token: str | None = None  # server


async def open_engine(spec: EngineSpec, model: str, version: str, concurrency: int) -> Engine:
    """The engine `spec` names, ready: the model loaded, or the server's model found."""
    if spec.kind == "server":
        return await ServerEngine.open(
            spec.url, model, version, connections=concurrency, tls=spec.tls, token=spec.token
        )
    return await LocalEngine.open(spec.repositories, model, version, execution_threads=spec.execution_threads)

"""Where a batch job's requests run: an `Engine`.

`LocalEngine` (--engine local, the default) serves the model in this process through core's one
entry point (`core.in_process`), so each mini-batch goes down the dispatcher a server's request
takes (validated, batched by the model's config, answered as declared) with no HTTP hop.
`ServerEngine` (--engine server) sends each mini-batch to a KServe v2 server (inferd, Triton, a
fleet behind a balancer) through inferd's client, asking inferd to run it as background work
(the `inferd_admission` request parameter), so the server's online requests come first.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from inferd.client import NO_RETRIES, AsyncClient, ClientTls
from inferd.core.in_process import InProcessModels
from inferd.tools.batch.options import BatchOptions
from inferd.types import BATCH_TRANSFORM, ModelMetadata, RequestContext, RequestedOutput, Tensor


class Engine(Protocol):
    """A model that answers mini-batches: its signature, whether it batches, and the call."""

    @property
    def signature(self) -> ModelMetadata: ...

    @property
    def max_batch_size(self) -> int: ...

    @property
    def routes_records(self) -> bool:
        """Whether each record's variant is chosen by its key (an endpoint): `infer` then needs
        the rows' keys."""
        ...

    async def infer(
        self, inputs: Sequence[Tensor], outputs: Sequence[str], timeout_s: float, keys: Sequence[str] | None = None
    ) -> tuple[Tensor, ...]:
        """The model's outputs (those named, or all when none is) for `inputs`; an InferdError
        the model or the engine raised, or TimeoutError past `timeout_s`. `keys`: each row's
        record's key, when the engine routes records."""
        ...

    async def close(self) -> None: ...


class _OpenModel:
    """What every engine knows of its model once open: its signature and its batch bound."""

    def __init__(self, signature: ModelMetadata, max_batch_size: int) -> None:
        self._signature = signature
        self._max_batch_size = max_batch_size

    @property
    def signature(self) -> ModelMetadata:
        return self._signature

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size


class LocalEngine(_OpenModel):
    def __init__(self, models: InProcessModels, model: str, version: str, signature: ModelMetadata, batch: int) -> None:
        super().__init__(signature, batch)
        self._models = models
        self._model = model
        self._version = version
        self._cache: tempfile.TemporaryDirectory[str] | None = None
        self._endpoint = models.is_endpoint(model)
        self.variant_records: Counter[str] = Counter()  # an endpoint's records, by the variant they went to

    @classmethod
    async def open(
        cls,
        repositories: Sequence[str],
        model: str,
        version: str = "",
        *,
        execution_threads: int = 0,
        endpoints: Mapping[str, Any] | None = None,
    ) -> LocalEngine:
        """`model` of the repositories (folders or fsspec URLs) loaded in this process; an
        endpoint of `endpoints` (as `inferd serve --endpoints` declares them) loads its variants."""
        cache = tempfile.TemporaryDirectory(prefix="inferd-batch-")
        models: InProcessModels | None = None
        try:
            models = await InProcessModels.open(
                repositories, [model], Path(cache.name), execution_threads=execution_threads, endpoints=endpoints
            )
            config = await models.config(model, version)
            engine = cls(models, model, version, models.metadata(model, version), config.max_batch_size)
        except BaseException:
            if models is not None:  # loaded, but not the version asked
                await models.close()
            cache.cleanup()
            raise
        engine._cache = cache
        return engine

    @property
    def routes_records(self) -> bool:
        return self._endpoint

    async def infer(
        self, inputs: Sequence[Tensor], outputs: Sequence[str], timeout_s: float, keys: Sequence[str] | None = None
    ) -> tuple[Tensor, ...]:
        if not self._endpoint:
            return await self._infer(self._model, self._version, inputs, outputs, timeout_s)
        if keys is None:
            raise ValueError(f"'{self._model}' is an endpoint: each row's key chooses its variant")
        # Each record to its variant; the rows of each variant go as one request, and the answers'
        # rows are put back in the records' order.
        rows_by_variant: dict[tuple[str, str, str], list[int]] = {}
        for row, key in enumerate(keys):
            rows_by_variant.setdefault(self._models.variant_for(self._model, key), []).append(row)
        for (variant, _, _), rows in rows_by_variant.items():
            self.variant_records[variant] += len(rows)
        if len(rows_by_variant) == 1:
            ((_, model, version),) = rows_by_variant
            return await self._infer(model, version, inputs, outputs, timeout_s)
        answers = await asyncio.gather(
            *(
                self._infer(model, version, [_rows(tensor, rows) for tensor in inputs], outputs, timeout_s)
                for (_, model, version), rows in rows_by_variant.items()
            )
        )
        return _scatter(len(keys), list(rows_by_variant.values()), answers)

    async def _infer(
        self, model: str, version: str, inputs: Sequence[Tensor], outputs: Sequence[str], timeout_s: float
    ) -> tuple[Tensor, ...]:
        context = RequestContext(deadline_s=time.monotonic() + timeout_s, door=BATCH_TRANSFORM)
        asked = [RequestedOutput(name) for name in outputs]
        response = await self._models.infer(context.request(model, version, inputs, asked))
        return response.outputs

    async def close(self) -> None:
        await self._models.close()
        if self._cache is not None:
            self._cache.cleanup()


def _rows(tensor: Tensor, rows: list[int]) -> Tensor:
    data = tensor.data[rows]
    return Tensor(tensor.name, tensor.datatype, data.shape, data)


def _scatter(count: int, rows: list[list[int]], answers: Sequence[Sequence[Tensor]]) -> tuple[Tensor, ...]:
    """The answers of several variants, each for its rows, as one answer of `count` rows in order
    (the variants of an endpoint answer with one signature)."""
    scattered = []
    for first in answers[0]:
        data = np.empty((count, *first.data.shape[1:]), dtype=first.data.dtype)
        for answer, taken in zip(answers, rows, strict=True):
            (same,) = [tensor for tensor in answer if tensor.name == first.name]
            data[taken] = same.data
        scattered.append(Tensor(first.name, first.datatype, data.shape, data))
    return tuple(scattered)


# The request parameter that asks an inferd server to run a request as background work
# (core.scheduler.ADMISSION_PARAMETER; other KServe v2 servers pass it on unread).
BACKGROUND = {"inferd_admission": "background"}


class ServerEngine(_OpenModel):
    def __init__(self, client: AsyncClient, model: str, version: str, signature: ModelMetadata, batch: int) -> None:
        super().__init__(signature, batch)
        self._client = client
        self._model = model
        self._version = version

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
    def routes_records(self) -> bool:
        return False  # an endpoint of the server routes each mini-batch (SingleRecord: each record)

    async def infer(
        self, inputs: Sequence[Tensor], outputs: Sequence[str], timeout_s: float, keys: Sequence[str] | None = None
    ) -> tuple[Tensor, ...]:
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


async def open_engine(spec: EngineSpec, options: BatchOptions) -> Engine:
    """The engine `spec` names for the job of `options`, ready: the model (or the endpoint's
    variants) loaded, or the server's model found."""
    model, version = options.model, options.model_version
    if spec.kind == "server":
        return await ServerEngine.open(
            spec.url, model, version, connections=options.max_concurrent_transforms, tls=spec.tls, token=spec.token
        )
    return await LocalEngine.open(
        spec.repositories, model, version, execution_threads=spec.execution_threads, endpoints=options.endpoints
    )

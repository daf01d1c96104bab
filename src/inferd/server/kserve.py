"""The KServe v2 REST door (Triton's HTTP API): `/v2/...`; inference through `server.inference_call` with
`protocol.codecs.kserve`, the other routes by `protocol.json_v2`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferd.core.async_inference import Answer
from inferd.core.async_jobs import Job
from inferd.core.service import InferenceService
from inferd.errors import NotFoundError, UnavailableError, UnsupportedError
from inferd.limits import RequestLimits
from inferd.protocol import json_v2, model_config, sagemaker, shared_memory
from inferd.protocol.codecs.base import Target
from inferd.protocol.codecs.kserve import KServeHttpCodec
from inferd.server.async_api import AsyncApi
from inferd.server.auth import AUTHORIZATION_HEADER, Access, AccessPolicy, check_local_client
from inferd.server.cuda_shared_memory import CudaSharedMemory
from inferd.server.endpoints import EndpointsApi, RolloutsApi
from inferd.server.http import json_response, kserve_error
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.inference_call import InferenceCall
from inferd.server.routes import READ, Params, Route, RouteGroup
from inferd.server.shared_memory import SharedMemoryRegions
from inferd.types import Door

_JSON_HEADERS = [(b"content-type", json_v2.JSON_CONTENT_TYPE)]
_HEADER_LENGTH = b"inference-header-content-length"
_AUTHORIZATION = AUTHORIZATION_HEADER.encode()
# The Open Inference Protocol's health bodies, which KServe's SDK reads (`response.json()["ready"]`)
# and KServe's own server sends; tritonclient reads only the status, which stays 200 / 503.
_LIVE_BODY = json_v2.encode_json({"live": True})
_READY_BODY = json_v2.encode_json({"ready": True})


class KServeDoor:
    def __init__(
        self,
        service: InferenceService,
        call: InferenceCall | None = None,
        regions: SharedMemoryRegions | None = None,
        openapi_document: bytes | None = None,
        *,
        limits: RequestLimits,
        access: AccessPolicy | None = None,
        async_api: AsyncApi | None = None,
    ) -> None:
        """`call`: the server's one inference call (None: a door for tests of its other routes, which
        answers no inference); `limits`: the server's, what one request may hold; `openapi_document`:
        the OpenAPI document of the port's routes (`server.openapi`), which only the code that
        assembles the port's doors knows, served at /v2/openapi.json; `access`: the tokens, for shared
        memory's check of who is on this host; `async_api`: the async inference routes under /v2."""
        self._service = service
        self._call = call
        self._codec = KServeHttpCodec(limits, Door.KSERVE_HTTP, regions)
        self._regions = regions
        self._access = access
        self._cuda_shared_memory = CudaSharedMemory(regions, access)
        self._async_api = async_api
        # Set by whoever assembles the port (server.app.build_router), once its routes are known.
        self.openapi_document = openapi_document

    def routes(self) -> RouteGroup:
        get = self._get
        service = self._service
        return RouteGroup(
            protocol="kserve_http",
            roots=("v2",),
            encode_error=kserve_error,
            routes=(
                Route("/v2", READ, get(lambda _: json_v2.server_metadata_json(service.server_metadata()))),
                Route("/v2/health/live", READ, self._live, Access.PUBLIC),
                Route("/v2/health/ready", READ, self._ready, Access.PUBLIC),
                Route("/v2/openapi.json", READ, self._openapi),
                Route("/v2/models/stats", READ, get(lambda _: json_v2.statistics_json(service.model_statistics()))),
                Route("/v2/models/{model}", READ, get(self._metadata)),
                Route("/v2/models/{model}/versions/{version}", READ, get(self._metadata)),
                Route("/v2/models/{model}/infer", ("POST",), self._infer),
                Route("/v2/models/{model}/versions/{version}/infer", ("POST",), self._infer),
                Route("/v2/models/{model}/ready", READ, self._model_ready, Access.PUBLIC),
                Route("/v2/models/{model}/versions/{version}/ready", READ, self._model_ready, Access.PUBLIC),
                Route("/v2/models/{model}/stats", READ, get(self._statistics)),
                Route("/v2/models/{model}/versions/{version}/stats", READ, get(self._statistics)),
                Route("/v2/models/{model}/config", READ, get(self._config)),
                Route("/v2/models/{model}/versions/{version}/config", READ, get(self._config)),
                Route("/v2/repository/index", ("POST",), self._repository_index),
                Route("/v2/repository/models/{model}/load", ("POST",), self._load, Access.MANAGEMENT),
                Route("/v2/repository/models/{model}/unload", ("POST",), self._unload, Access.MANAGEMENT),
                *EndpointsApi(service).routes(),
                *(self._async_api.routes() if self._async_api is not None else ()),
                *RolloutsApi(service).routes(),
                Route("/v2/systemsharedmemory/status", READ, self._shm_status),
                Route("/v2/systemsharedmemory/region/{region}/status", READ, self._shm_status),
                Route(
                    "/v2/systemsharedmemory/region/{region}/register", ("POST",), self._shm_register, Access.MANAGEMENT
                ),
                Route("/v2/systemsharedmemory/unregister", ("POST",), self._shm_unregister, Access.MANAGEMENT),
                Route(
                    "/v2/systemsharedmemory/region/{region}/unregister",
                    ("POST",),
                    self._shm_unregister,
                    Access.MANAGEMENT,
                ),
                *self._cuda_shared_memory.routes(),
            ),
        )

    async def _infer(self, request: HttpRequest, params: Params) -> HttpResponse:
        if self._call is None:
            raise UnsupportedError("this door was built without an inference call")
        return await self._call.http(self._codec, request, Target(params["model"], params.get("version", "")))

    async def replay(self, job: Job, body: bytes) -> Answer:
        """An async job's stored v2 body, inferred as `POST /v2/models/{m}/infer` would be (by this
        door's call: the background one, for a door built to run jobs). A binary answer's object
        says its JSON header's size in its content type, as SageMaker's Triton containers do."""
        if self._call is None:
            raise UnsupportedError("this door was built without an inference call")
        headers = {b"content-type": job.request.content_type.encode("latin-1")}
        if job.request.header_length is not None:
            headers[_HEADER_LENGTH] = str(job.request.header_length).encode()
        request = HttpRequest("POST", f"/v2/models/{job.request.model}/infer", b"", headers, body)
        response = await self._call.http(self._codec, request, Target(job.request.model, job.request.version))
        answered = dict(response.headers)
        header_length = answered.get(_HEADER_LENGTH)
        if header_length is not None:
            return Answer(response.body, f"{sagemaker.TRITON_BINARY};json-header-size={header_length.decode()}")
        return Answer(response.body, (answered.get(b"content-type") or json_v2.JSON_CONTENT_TYPE).decode())

    async def _live(self, request: HttpRequest, params: Params) -> HttpResponse:
        if not self._service.live():
            raise UnavailableError("the server is not live")
        return HttpResponse(200, _LIVE_BODY, list(_JSON_HEADERS))

    async def _ready(self, request: HttpRequest, params: Params) -> HttpResponse:
        if not self._service.ready():
            # A 503 that says why in the error body, as every other 503 of inferd's does.
            raise UnavailableError(
                "the server is not ready: its models are still loading, it is shutting down, or (with "
                "--strict-readiness) a model is not ready"
            )
        return HttpResponse(200, _READY_BODY, list(_JSON_HEADERS))

    async def _openapi(self, request: HttpRequest, params: Params) -> HttpResponse:
        if self.openapi_document is None:
            raise NotFoundError("this port serves no OpenAPI document")
        return HttpResponse(200, self.openapi_document, list(_JSON_HEADERS))

    async def _model_ready(self, request: HttpRequest, params: Params) -> HttpResponse:
        # Not ready: a 503 whose body carries MODEL_NOT_READY and the reason (the load's failure).
        self._service.check_model_ready(params["model"], params.get("version", ""))
        return HttpResponse(200)

    def _metadata(self, params: Params) -> dict[str, Any]:
        return json_v2.model_metadata_json(self._service.model_metadata(params["model"], params.get("version", "")))

    def _statistics(self, params: Params) -> dict[str, Any]:
        return json_v2.statistics_json(self._service.model_statistics(params["model"], params.get("version", "")))

    def _config(self, params: Params) -> dict[str, Any]:
        return model_config.to_json(self._service.model_config(params["model"], params.get("version", "")))

    async def _repository_index(self, request: HttpRequest, params: Params) -> HttpResponse:
        entries = await self._service.repository_index(ready_only=json_v2.decode_index_request(request.body))
        return json_response(json_v2.repository_index_json(entries))

    async def _load(self, request: HttpRequest, params: Params) -> HttpResponse:
        config, files = json_v2.decode_load_request(request.body)
        await self._service.load_model(params["model"], config_json=config, files=files)
        return HttpResponse(200, b"", list(_JSON_HEADERS))

    async def _unload(self, request: HttpRequest, params: Params) -> HttpResponse:
        dependents = json_v2.decode_unload_request(request.body)
        await self._service.unload_model(params["model"], unload_dependents=dependents)
        return HttpResponse(200, b"", list(_JSON_HEADERS))

    def _shared_memory(self) -> SharedMemoryRegions:
        if self._regions is None:
            raise UnsupportedError("system shared memory is not served on this port")
        return self._regions

    async def _shm_status(self, request: HttpRequest, params: Params) -> HttpResponse:
        return json_response(shared_memory.status_json(self._shared_memory().status(params.get("region"))))

    async def _shm_register(self, request: HttpRequest, params: Params) -> HttpResponse:
        check_local_client(self._access, request.local_peer, request.headers.get(_AUTHORIZATION))
        key, offset, byte_size = shared_memory.register_body(json_v2.load_json(request.body))
        self._shared_memory().register(params["region"], key, offset, byte_size)
        return HttpResponse(200, b"", list(_JSON_HEADERS))

    async def _shm_unregister(self, request: HttpRequest, params: Params) -> HttpResponse:
        check_local_client(self._access, request.local_peer, request.headers.get(_AUTHORIZATION))
        self._shared_memory().unregister(params.get("region"))
        return HttpResponse(200, b"", list(_JSON_HEADERS))

    @staticmethod
    def _get(document: Callable[[Params], Any]) -> Callable[[HttpRequest, Params], Any]:
        async def handler(request: HttpRequest, params: Params) -> HttpResponse:
            return json_response(document(params))

        return handler

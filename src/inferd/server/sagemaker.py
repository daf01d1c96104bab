"""The SageMaker hosting contract: `GET /ping`, `POST /invocations`; with `--sagemaker`, also the
multi-model endpoint routes (`/models`, `/models/{m}`, `/models/{m}/invoke`) and
`POST /endpoints/{name}/invocations` (where boto3's `invoke_endpoint` sends: the inferd endpoint of
that name, when there is one; else a local-testing alias of /invocations).

The model of an invocation: the `X-Amzn-SageMaker-Target-Model` header, else the server's default
model (`SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`, as Triton's SageMaker mode reads it), else the one
model loaded. `/ping` answers TorchServe's `{"status": "Healthy"}`, which SageMaker reads only the
status of, so TorchServe's users find their health check too.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from inferd.core.async_inference import Answer
from inferd.core.async_jobs import Job
from inferd.core.service import InferenceService
from inferd.errors import (
    AlreadyExistsError,
    InferdError,
    InvalidRequestError,
    LoadRequestError,
    ModelNotFoundError,
    NotAcceptableError,
)
from inferd.limits import RequestLimits
from inferd.protocol import json_v2, sagemaker
from inferd.protocol.codecs import sagemaker as sagemaker_codecs
from inferd.protocol.codecs.base import Target
from inferd.protocol.status import HTTP_STATUS
from inferd.server.async_api import AsyncApi
from inferd.server.auth import Access
from inferd.server.http import json_response
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.inference_call import InferenceCall
from inferd.server.routes import READ, Params, Route, RouteGroup
from inferd.server.shared_memory import SharedMemoryRegions
from inferd.types import Door

TARGET_MODEL_HEADER = b"x-amzn-sagemaker-target-model"
_CONTENT_TYPE = b"content-type"
_ACCEPT = b"accept"


class SageMakerDoor:
    def __init__(
        self,
        service: InferenceService,
        call: InferenceCall,
        regions: SharedMemoryRegions | None = None,
        *,
        limits: RequestLimits,
        multi_model: bool,
        model_root: Path,
        default_model: str = "",
        async_api: AsyncApi | None = None,
    ) -> None:
        """`regions`: shared memory, which v2 bodies may name; `limits`: the server's, what one request
        may hold; `multi_model`: serve the multi-model
        endpoint routes (--sagemaker); `model_root`: the folder every loaded model's `url` must lie
        under; `default_model`: /invocations' model; `async_api`: for the async invocations route."""
        self._service = service
        self._call = call
        self._json, self._binary = sagemaker_codecs.json_codecs(limits, regions)
        self._arrays = {kind: sagemaker_codecs.SageMakerArrayCodec(kind) for kind in (sagemaker.NPY, sagemaker.CSV)}
        self._multi_model = multi_model
        self._model_root = model_root
        self._default_model = default_model
        self._async_api = async_api

    def routes(self) -> RouteGroup:
        # As a SageMaker container (--sagemaker), the platform calls these routes without tokens
        # once IAM has let its caller in; elsewhere /invocations is one more inference route.
        invocations = Access.PLATFORM if self._multi_model else Access.DATA
        routes = [
            Route("/ping", READ, self._ping, Access.PUBLIC),
            Route("/invocations", ("POST",), self._invocations, invocations),
        ]
        roots: tuple[str, ...] = ("ping", "invocations")
        if self._multi_model:
            routes += [
                Route("/endpoints/{endpoint}/invocations", ("POST",), self._invocations, Access.PLATFORM),
                Route("/models", ("GET", "HEAD", "POST"), self._models, Access.PLATFORM),
                Route("/models/{model}", ("GET", "HEAD", "DELETE"), self._model, Access.PLATFORM),
                Route("/models/{model}/invoke", ("POST",), self._invoke, Access.PLATFORM),
            ]
            if self._async_api is not None:
                routes.append(self._async_api.sagemaker_route(self._endpoint_target))
            roots += ("endpoints", "models")
        return RouteGroup(protocol=Door.SAGEMAKER, roots=roots, routes=tuple(routes), encode_error=sagemaker_error)

    async def _ping(self, request: HttpRequest, params: Params) -> HttpResponse:
        if self._service.ready():
            return json_response({"status": "Healthy"})
        return json_response({"status": "Unhealthy"}, status=503)

    async def _invocations(self, request: HttpRequest, params: Params) -> HttpResponse:
        endpoint = params.get("endpoint")
        return await self._infer(
            request, self._endpoint_target(request, endpoint) if endpoint else self._target_model(request)
        )

    def _endpoint_target(self, request: HttpRequest, endpoint: str) -> str:
        """What an invocation of `/endpoints/{endpoint}/...` serves: boto3 names the endpoint in the
        path, and an inferd endpoint of that name serves it (its variants, by weight or
        TargetVariant), unless a model is named; else the model /invocations would serve."""
        if TARGET_MODEL_HEADER not in request.headers and self._service.endpoints.is_endpoint(endpoint):
            return endpoint
        return self._target_model(request)

    async def replay(self, job: Job, body: bytes) -> Answer:
        """An async invocation's input, served as an invocation with its content type and accept
        (by this door's call: the background one, for a door built to run jobs)."""
        headers = {_CONTENT_TYPE: job.request.content_type.encode("latin-1")}
        if job.request.accept:
            headers[_ACCEPT] = job.request.accept.encode("latin-1")
        request = HttpRequest("POST", "/invocations", b"", headers, body)
        response = await self._infer(request, job.request.model)
        content_type = dict(response.headers).get(_CONTENT_TYPE) or json_v2.JSON_CONTENT_TYPE
        return Answer(response.body, content_type.decode("latin-1"))

    async def _invoke(self, request: HttpRequest, params: Params) -> HttpResponse:
        model = params["model"]
        if model not in dict(self._service.model_folders()):
            raise ModelNotFoundError(f"model '{model}' is not loaded (POST /models loads it)")
        return await self._infer(request, model)

    async def _models(self, request: HttpRequest, params: Params) -> HttpResponse:
        if request.method != "POST":
            return json_response(sagemaker.models_json(self._service.model_folders()))
        name, url = sagemaker.decode_load_body(request.body)
        if name in dict(self._service.model_folders()):
            raise AlreadyExistsError(f"model '{name}' is loaded already (DELETE /models/{name} first)")
        await self._service.load_model_folder(name, self._model_folder(url))
        return HttpResponse(200)

    async def _model(self, request: HttpRequest, params: Params) -> HttpResponse:
        name = params["model"]
        folder = dict(self._service.model_folders()).get(name)
        if folder is None:
            raise ModelNotFoundError(f"model '{name}' is not loaded (POST /models loads it)")
        if request.method == "DELETE":
            await self._service.unload_model_folder(name)
            return HttpResponse(200)
        return json_response(sagemaker.model_json(name, folder))

    def _model_folder(self, url: str) -> Path:
        """The model folder `url` names: it, or the one model folder inside it (a repository of
        one model, as SageMaker's Triton containers pack them). Never outside the model root."""
        try:
            return self._find_model_folder(url)
        except (ValueError, OSError) as exc:  # a NUL in the url, a name too long, a folder not readable
            raise LoadRequestError(f"'url' {url!r} cannot be read as a folder: {exc}") from None

    def _find_model_folder(self, url: str) -> Path:
        root = self._model_root.resolve()
        folder = Path(url).resolve()
        if not folder.is_relative_to(root):
            raise LoadRequestError(
                f"'url' {url!r} is not under the model root (--sagemaker-model-root)",
                server_message=f"'url' {url!r} is not under the model root {root} (--sagemaker-model-root)",
            )
        if not folder.is_dir():
            raise LoadRequestError(f"'url' {url!r} is not a folder")
        if _is_model_folder(folder):
            return folder
        inside = [child for child in folder.iterdir() if child.is_dir() and _is_model_folder(child)]
        if len(inside) != 1:
            raise LoadRequestError(
                f"'url' {url!r} holds no model: expected config.pbtxt or version folders, in it or in one folder of it"
            )
        if not inside[0].resolve().is_relative_to(root):
            raise LoadRequestError(
                f"'url' {url!r} links outside the model root",
                server_message=f"'url' {url!r} links outside the model root {root}",
            )
        return inside[0]

    def _target_model(self, request: HttpRequest) -> str:
        header = request.headers.get(TARGET_MODEL_HEADER)
        if header:
            return header.decode("latin-1").removesuffix(".tar.gz")
        if self._default_model:
            return self._default_model
        loaded = sorted({model for model, _, state in self._service.model_states() if state.value == "READY"})
        if len(loaded) != 1:
            raise InvalidRequestError(
                f"{len(loaded)} models are loaded: name one with the X-Amzn-SageMaker-Target-Model header "
                "(or start the server with SAGEMAKER_TRITON_DEFAULT_MODEL_NAME)"
            )
        return loaded[0]

    async def _infer(self, request: HttpRequest, model: str) -> HttpResponse:
        """An invocation, read by the codec of its content type."""
        kind, _ = sagemaker.media_type(request.headers.get(_CONTENT_TYPE))
        sagemaker.check_readable(kind)
        target = Target(model)
        if kind not in (sagemaker.JSON, sagemaker.TRITON_BINARY):
            return await self._call.http(self._arrays[kind], request, target)
        if sagemaker.answer_type(request.headers.get(_ACCEPT), sagemaker.JSON) != sagemaker.JSON:
            raise NotAcceptableError("a JSON body is answered in JSON; send .npy or CSV for another answer")
        if kind == sagemaker.JSON:
            return await self._call.http(self._json, request, target)
        return await self._call.http(self._binary, request, target)


def _is_model_folder(folder: Path) -> bool:
    return (folder / "config.pbtxt").is_file() or any(p.is_dir() and p.name.isdigit() for p in folder.iterdir())


def sagemaker_error(error: InferdError, request_id: str) -> tuple[int, bytes, bytes]:
    """KServe-shaped JSON (SageMaker passes a container's error body to its caller as it is), with
    the message also under `message`: where botocore reads it, so boto3 called straight at inferd
    says what went wrong rather than nothing."""
    document = {"error": error.message, "message": error.message, **error.details(), "request_id": request_id}
    return HTTP_STATUS[error.code], orjson.dumps(document), json_v2.JSON_CONTENT_TYPE

"""The SageMaker hosting contract: `GET /ping`, `POST /invocations`; with `--sagemaker`, also the
multi-model endpoint routes (`/models`, `/models/{m}`, `/models/{m}/invoke`) and
`POST /endpoints/{name}/invocations` (where boto3's `invoke_endpoint` sends: a local-testing alias).

The model of an invocation: the `X-Amzn-SageMaker-Target-Model` header, else the server's default
model (`SAGEMAKER_TRITON_DEFAULT_MODEL_NAME`, as Triton's SageMaker mode reads it), else the one
model loaded. `/ping` answers TorchServe's `{"status": "Healthy"}`, which SageMaker reads only the
status of, so TorchServe's users find their health check too.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from inferd.core.service import InferenceService
from inferd.errors import (
    AlreadyExistsError,
    InvalidRequestError,
    LoadRequestError,
    ModelNotFoundError,
    NotAcceptableError,
    TensorDataError,
)
from inferd.protocol import json_v2, sagemaker, tfserving_json
from inferd.server.auth import Access
from inferd.server.http import door_request, json_response, kserve_error, response_headers
from inferd.server.http11 import HttpRequest, HttpResponse
from inferd.server.kserve import KServeDoor
from inferd.server.routes import READ, Params, Route, RouteGroup
from inferd.server.tfserving import TfServingDoor
from inferd.types import DataType, InferResponse, Tensor

TARGET_MODEL_HEADER = b"x-amzn-sagemaker-target-model"
_CONTENT_TYPE = b"content-type"
_ACCEPT = b"accept"


class SageMakerDoor:
    def __init__(
        self,
        service: InferenceService,
        kserve: KServeDoor,
        tfserving: TfServingDoor,
        *,
        multi_model: bool,
        model_root: Path,
        default_model: str = "",
    ) -> None:
        """`multi_model`: serve the multi-model endpoint routes (--sagemaker); `model_root`: the
        folder every loaded model's `url` must lie under; `default_model`: /invocations' model."""
        self._service = service
        self._kserve = kserve
        self._tfserving = tfserving
        self._multi_model = multi_model
        self._model_root = model_root
        self._default_model = default_model

    def routes(self) -> RouteGroup:
        # As a SageMaker container (--sagemaker), the platform calls these routes without tokens
        # once IAM has let its caller in; elsewhere /invocations is one more inference route.
        invocations = Access.PLATFORM if self._multi_model else Access.DATA
        routes = [
            Route("/ping", READ, self._ping, Access.PUBLIC),
            Route("/invocations", ("POST",), self._invocations, invocations, inference=True),
        ]
        roots: tuple[str, ...] = ("ping", "invocations")
        if self._multi_model:
            routes += [
                Route(
                    "/endpoints/{endpoint}/invocations", ("POST",), self._invocations, Access.PLATFORM, inference=True
                ),
                Route("/models", ("GET", "HEAD", "POST"), self._models, Access.PLATFORM),
                Route("/models/{model}", ("GET", "HEAD", "DELETE"), self._model, Access.PLATFORM),
                Route("/models/{model}/invoke", ("POST",), self._invoke, Access.PLATFORM, inference=True),
            ]
            roots += ("endpoints", "models")
        # Errors are KServe-shaped JSON: SageMaker passes a container's error body to the caller as it is.
        return RouteGroup(protocol="sagemaker", roots=roots, routes=tuple(routes), encode_error=kserve_error)

    async def _ping(self, request: HttpRequest, params: Params) -> HttpResponse:
        if self._service.ready():
            return json_response({"status": "Healthy"})
        return json_response({"status": "Unhealthy"}, status=503)

    async def _invocations(self, request: HttpRequest, params: Params) -> HttpResponse:
        return await self._infer(request, self._target_model(request))

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
        self._service.shed(model, "", "sagemaker")
        kind, parameters = sagemaker.media_type(request.headers.get(_CONTENT_TYPE))
        sagemaker.check_readable(kind)
        if kind in (sagemaker.JSON, sagemaker.TRITON_BINARY):
            if sagemaker.answer_type(request.headers.get(_ACCEPT), sagemaker.JSON) != sagemaker.JSON:
                raise NotAcceptableError("a JSON body is answered in JSON; send .npy or CSV for another answer")
            if kind == sagemaker.TRITON_BINARY:
                return await self._kserve.infer(request, model, "", "sagemaker", _header_size(parameters, request))
            document = json_v2.load_json(request.body)
            if sagemaker.is_v2_body(document):  # the v2 codec reads the raw body (binary parts, large data)
                return await self._kserve.infer(request, model, "", "sagemaker")
            return await self._tfserving.predict(request, model, "", "sagemaker", document)
        return await self._infer_array(request, model, kind)

    async def _infer_array(self, http_request: HttpRequest, model: str, kind: str) -> HttpResponse:
        """A .npy or CSV body: the model's single input; the answer its single output, or JSON."""
        answer = sagemaker.answer_type(http_request.headers.get(_ACCEPT), sagemaker.JSON)
        started = time.perf_counter()
        metadata = await self._service.serving_metadata(model)
        if len(metadata.inputs) != 1:
            raise InvalidRequestError(
                f"model '{model}' has {len(metadata.inputs)} inputs; a {kind} body holds one array: "
                "send JSON naming each input"
            )
        spec = metadata.inputs[0]
        datatype = DataType.from_wire(spec.datatype)
        array = (
            sagemaker.decode_npy(http_request.body)
            if kind == sagemaker.NPY
            else sagemaker.decode_csv(http_request.body, datatype)
        )
        array = _as_datatype(array, datatype)
        try:
            sent = DataType.from_numpy(array.dtype)
        except ValueError:
            raise TensorDataError(
                f"the array's dtype {array.dtype} is not one inferd serves", tensor=spec.name
            ) from None
        inputs = (Tensor(spec.name, sent, array.shape, array),)
        request = door_request(http_request, model, "", inputs, "sagemaker", started)
        response = await self._service.infer(request)
        payload = _encode(response, answer)
        headers = [(_CONTENT_TYPE, answer.encode()), *response_headers(http_request, request)]
        return HttpResponse(200, payload, headers)


def _encode(response: InferResponse, answer: str) -> bytes:
    if answer == sagemaker.JSON:
        return tfserving_json.encode_predict(response.outputs, row_format=True)
    if len(response.outputs) != 1:
        raise NotAcceptableError(
            f"model '{response.model_name}' has {len(response.outputs)} outputs; {answer} holds one array: "
            "accept application/json"
        )
    data = response.outputs[0].data
    return sagemaker.encode_npy(data) if answer == sagemaker.NPY else sagemaker.encode_csv(data)


def _as_datatype(array: np.ndarray[Any, Any], datatype: DataType) -> np.ndarray[Any, Any]:
    """NumPy's default types (float64, int64, fixed-width strings) as the model's, where nothing is lost
    in kind; anything else is left for the model's checks to name."""
    if datatype is DataType.BYTES and array.dtype.kind in "SU":
        converted = np.empty(array.shape, dtype=object)
        flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in array.reshape(-1).tolist()]
        converted.reshape(-1)[:] = flat
        return converted
    target = datatype.numpy_dtype
    if datatype is not DataType.BYTES and array.dtype != target and np.can_cast(array.dtype, target, "same_kind"):
        return array.astype(target)
    return array


def _header_size(parameters: dict[str, str], request: HttpRequest) -> int:
    raw = parameters.get(sagemaker.HEADER_SIZE_PARAMETER, "")
    if not (raw.isascii() and raw.isdigit()) or int(raw) > len(request.body):
        raise InvalidRequestError(
            f"{sagemaker.TRITON_BINARY} needs {sagemaker.HEADER_SIZE_PARAMETER}=N, "
            f"N at most the body's {len(request.body)} bytes; got {raw!r}"
        )
    return int(raw)


def _is_model_folder(folder: Path) -> bool:
    return (folder / "config.pbtxt").is_file() or any(p.is_dir() and p.name.isdigit() for p in folder.iterdir())

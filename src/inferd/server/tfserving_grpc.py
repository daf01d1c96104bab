"""TF Serving's gRPC API (`tensorflow.serving.PredictionService`: Predict, GetModelMetadata;
`tensorflow.serving.ModelService`: GetModelStatus, HandleReloadConfigRequest) on a port of its own
(--tfserving-grpc-port), by `protocol.tfserving_grpc`. Errors carry the gRPC code TF Serving would
give (the same numbers). HandleReloadConfigRequest changes what the server serves: a management
call (tokens apply, as to the repository API)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from inferd.config.served_models import ServedModel
from inferd.core.service import InferenceService
from inferd.errors import MalformedRequestError, ModelConfigError
from inferd.limits import RequestLimits
from inferd.protocol import tfserving_grpc
from inferd.protocol.codecs.tfserving import TfServingGrpcCodec
from inferd.protocol.tf_types import tf_state
from inferd.protocol.tfserving_model_config import served_models
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2 as serving_pb
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2_grpc as serving_grpc
from inferd.server.auth import AccessPolicy, check_local_client, grpc_authorization, grpc_peer_is_local
from inferd.server.grpc_calls import call_async
from inferd.server.inference_call import InferenceCall


class PredictionServicer(serving_grpc.PredictionServiceServicer):
    def __init__(self, service: InferenceService, call: InferenceCall, limits: RequestLimits) -> None:
        self._service = service
        self._call = call
        self._codec = TfServingGrpcCodec(limits)

    async def Predict(self, message: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._call.unary(self._codec, message, context, "tensorflow.serving.PredictionService", "Predict")

    async def GetModelMetadata(self, message: Any, context: grpc.aio.ServicerContext) -> Any:
        async def metadata() -> Any:
            version, label = tfserving_grpc.model_spec_version(message.model_spec)
            if label:
                version = await self._call.label_version(message.model_spec.name, label)
            described = self._service.model_metadata(message.model_spec.name, version)
            return tfserving_grpc.encode_metadata(described, version or described.versions[-1], message.metadata_field)

        return await call_async(context, "tensorflow.serving.PredictionService/GetModelMetadata", metadata)


ReloadConfig = Callable[[list[ServedModel]], Awaitable[None]]


class ModelServicer(serving_grpc.ModelServiceServicer):
    def __init__(self, service: InferenceService, reload_config: ReloadConfig, access: AccessPolicy | None) -> None:
        self._service = service
        self._reload_config = reload_config
        self._access = access

    async def HandleReloadConfigRequest(self, message: Any, context: grpc.aio.ServicerContext) -> Any:
        """Serve exactly the models of the request's model_config_list from now on (as TF Serving:
        models added load, models left out unload, changed policies and labels apply); answered once
        the server serves them. A --model-config-file polled later replaces it again."""

        async def reload() -> Any:
            # It loads and unloads whatever the control mode: a client of this host's, or a
            # management token's holder (the interceptor checked the token when there are tokens).
            authorization = grpc_authorization(context.invocation_metadata())
            check_local_client(
                self._access, grpc_peer_is_local(context.peer()), authorization, "TF Serving's model config is reloaded"
            )
            try:
                await self._reload_config(served_models(message.config, "HandleReloadConfigRequest"))
            except ModelConfigError as exc:  # the request's mistake: INVALID_ARGUMENT, as TF Serving answers
                raise MalformedRequestError(exc.message) from None
            return serving_pb.ReloadConfigResponse(status=serving_pb.StatusProto(error_code=0))

        return await call_async(context, "tensorflow.serving.ModelService/HandleReloadConfigRequest", reload)

    async def GetModelStatus(self, message: Any, context: grpc.aio.ServicerContext) -> Any:
        async def status() -> Any:
            version, _ = tfserving_grpc.model_spec_version(message.model_spec)  # a label is ignored, as TF does
            versions = self._service.model_versions(message.model_spec.name, version)
            return tfserving_grpc.encode_status([(v, tf_state(s.value), reason) for v, s, reason in reversed(versions)])

        return await call_async(context, "tensorflow.serving.ModelService/GetModelStatus", status)


def add_tfserving_servicers(
    service: InferenceService,
    call: InferenceCall,
    limits: RequestLimits,
    server: grpc.aio.Server,
    reload_config: ReloadConfig,
    access: AccessPolicy | None,
) -> None:
    """`limits`: the server's, what one request may hold; `reload_config`: serves a new model list;
    `access`: the server's tokens (None: none), for who may reload."""
    serving_grpc.add_PredictionServiceServicer_to_server(PredictionServicer(service, call, limits), server)  # type: ignore[no-untyped-call]
    serving_grpc.add_ModelServiceServicer_to_server(ModelServicer(service, reload_config, access), server)  # type: ignore[no-untyped-call]

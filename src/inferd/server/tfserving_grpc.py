"""TF Serving's gRPC API (`tensorflow.serving.PredictionService`: Predict, GetModelMetadata;
`tensorflow.serving.ModelService`: GetModelStatus) on a port of its own (--tfserving-grpc-port),
by `protocol.tfserving_grpc`. Errors carry the gRPC code TF Serving would give (the same numbers)."""

from __future__ import annotations

from typing import Any

import grpc

from inferd.core.service import InferenceService
from inferd.limits import RequestLimits
from inferd.protocol import tfserving_grpc
from inferd.protocol.codecs.tfserving import TfServingGrpcCodec
from inferd.protocol.tf_types import tf_state
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2_grpc as serving_grpc
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


class ModelServicer(serving_grpc.ModelServiceServicer):
    def __init__(self, service: InferenceService) -> None:
        self._service = service

    async def GetModelStatus(self, message: Any, context: grpc.aio.ServicerContext) -> Any:
        async def status() -> Any:
            version, _ = tfserving_grpc.model_spec_version(message.model_spec)  # a label is ignored, as TF does
            versions = self._service.model_versions(message.model_spec.name, version)
            return tfserving_grpc.encode_status([(v, tf_state(s.value), reason) for v, s, reason in reversed(versions)])

        return await call_async(context, "tensorflow.serving.ModelService/GetModelStatus", status)


def add_tfserving_servicers(
    service: InferenceService, call: InferenceCall, limits: RequestLimits, server: grpc.aio.Server
) -> None:
    """`limits`: the server's, what one request may hold."""
    serving_grpc.add_PredictionServiceServicer_to_server(PredictionServicer(service, call, limits), server)  # type: ignore[no-untyped-call]
    serving_grpc.add_ModelServiceServicer_to_server(ModelServicer(service), server)  # type: ignore[no-untyped-call]

"""TF Serving's gRPC API (`tensorflow.serving.PredictionService`: Predict, GetModelMetadata;
`tensorflow.serving.ModelService`: GetModelStatus) on a port of its own (--tfserving-grpc-port),
by `protocol.tfserving_grpc`. Errors carry the gRPC code TF Serving would give (the same numbers)."""

from __future__ import annotations

import time
from typing import Any

import grpc

from inferd.core.service import InferenceService
from inferd.protocol import tfserving_grpc
from inferd.protocol.request_id import REQUEST_ID_HEADER, header_value
from inferd.protocol.tf_types import tf_state
from inferd.protocol.tfserving_pb import tensorflow_serving_pb2_grpc as serving_grpc
from inferd.server.grpc import call_async
from inferd.server.logging import current_request_id
from inferd.server.tfserving import label_version
from inferd.types import InferRequest, new_request_id


class PredictionServicer(serving_grpc.PredictionServiceServicer):
    def __init__(self, service: InferenceService) -> None:
        self._service = service

    async def _version(self, spec: Any) -> str:
        version, label = tfserving_grpc.model_spec_version(spec)
        return await label_version(self._service, spec.name, label) if label else version

    async def Predict(self, message: Any, context: grpc.aio.ServicerContext) -> Any:
        async def predict() -> Any:
            metadata = dict(context.invocation_metadata() or ())
            request_id = str(metadata.get(REQUEST_ID_HEADER, "")) or new_request_id()
            token = current_request_id.set(request_id)
            try:
                started = time.perf_counter()
                model, version = message.model_spec.name, await self._version(message.model_spec)
                self._service.shed(model, version, "tfserving_grpc")
                inputs, outputs = tfserving_grpc.decode_predict(message)
                remaining_s = context.time_remaining()
                request = InferRequest(
                    model_name=model,
                    model_version=version,
                    request_id=request_id,
                    inputs=inputs,
                    outputs=outputs,
                    deadline_s=time.monotonic() + remaining_s if remaining_s is not None else None,
                    protocol="tfserving_grpc",
                )
                request.timing.decode_s = time.perf_counter() - started
                response = await self._service.infer(request)
                encode_started = time.perf_counter()
                answer = tfserving_grpc.encode_predict(response.outputs, model, response.model_version)
                request.timing.encode_s = time.perf_counter() - encode_started
                self._service.response_encoded(response, request.timing.encode_s)
                context.set_trailing_metadata(((REQUEST_ID_HEADER, header_value(request_id)),))
                return answer
            finally:
                current_request_id.reset(token)

        return await call_async(context, "tensorflow.serving.PredictionService/Predict", predict)

    async def GetModelMetadata(self, message: Any, context: grpc.aio.ServicerContext) -> Any:
        async def metadata() -> Any:
            version = await self._version(message.model_spec)
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


def add_tfserving_servicers(service: InferenceService, server: grpc.aio.Server) -> None:
    serving_grpc.add_PredictionServiceServicer_to_server(PredictionServicer(service), server)  # type: ignore[no-untyped-call]
    serving_grpc.add_ModelServiceServicer_to_server(ModelServicer(service), server)  # type: ignore[no-untyped-call]

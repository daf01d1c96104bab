"""The gRPC floor: a bare grpc.aio server with the KServe v2 service (tritonclient's compiled
protos) that answers ModelInfer by running ONNX Runtime inline on `raw_input_contents` and
returning raw outputs; no batching, validation, metrics or logging. Enough of the metadata and
config calls for perf_analyzer.

    python benchmarks/baselines/grpc_floor_server.py MODEL.onnx MODEL_NAME MAX_BATCH_SIZE PORT
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
from tritonclient.grpc import model_config_pb2 as config_pb
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

DATATYPES = {"tensor(float)": ("FP32", np.float32), "tensor(int64)": ("INT64", np.int64)}


class FloorServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, model_path: str, name: str, max_batch_size: int) -> None:
        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
        self.name, self.max_batch_size = name, max_batch_size
        self.inputs = [(i.name, *DATATYPES[i.type], i.shape) for i in self.session.get_inputs()]
        self.outputs = [(o.name, *DATATYPES[o.type], o.shape) for o in self.session.get_outputs()]

    async def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="floor", version="0")

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        response = pb.ModelMetadataResponse(name=self.name, versions=["1"], platform="onnxruntime_onnx")
        for target, tensors in ((response.inputs, self.inputs), (response.outputs, self.outputs)):
            for name, datatype, _, shape in tensors:
                target.add(name=name, datatype=datatype, shape=[-1, *[int(d) for d in shape[1:]]])
        return response

    async def ModelConfig(self, request: Any, context: Any) -> Any:
        config = config_pb.ModelConfig(name=self.name, platform="onnxruntime_onnx", max_batch_size=self.max_batch_size)
        for target, tensors in ((config.input, self.inputs), (config.output, self.outputs)):
            for name, datatype, _, shape in tensors:
                target.add(
                    name=name, data_type=config_pb.DataType.Value(f"TYPE_{datatype}"), dims=[int(d) for d in shape[1:]]
                )
        return pb.ModelConfigResponse(config=config)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        feeds = {
            tensor.name: np.frombuffer(raw, dtype=dict((n, d) for n, _, d, _ in self.inputs)[tensor.name]).reshape(
                tuple(tensor.shape)
            )
            for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True)
        }
        results = self.session.run([o[0] for o in self.outputs], feeds)
        response = pb.ModelInferResponse(model_name=self.name, model_version="1", id=request.id)
        for (name, datatype, _, _), result in zip(self.outputs, results, strict=True):
            response.outputs.add(name=name, datatype=datatype, shape=result.shape)
            response.raw_output_contents.append(result.tobytes())
        return response


async def main() -> None:
    model_path, name, max_batch_size, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FloorServicer(model_path, name, max_batch_size), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main())

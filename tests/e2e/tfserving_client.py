"""Calls inferd's TF Serving gRPC door with TF Serving's official Python client (tensorflow-serving-api
and tensorflow's own tensor conversions). Runs in .venv-tfserving (scripts/install_tfserving_client.sh),
never in inferd's venv: reads a JSON list of calls on stdin, prints a JSON list of results.

    {"call": "predict", "model": m, "version": 3 | "label": "stable" | none, "signature": s,
     "inputs": {name: {"dtype": "float32", "value": nested list | "b64": [base64 strings]}},
     "output_filter": [...]}
    {"call": "metadata", "model": m, "version": v?}
    {"call": "status", "model": m, "version": v?}
    {"call": "reload", "config": model_config_list in text format, "token": bearer token?}
"""

from __future__ import annotations

import base64
import json
import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import grpc
import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.apis import (
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)


def spec(target: Any, call: dict[str, Any]) -> None:
    target.name = call["model"]
    if "version" in call:
        target.version.value = call["version"]
    if "label" in call:
        target.version_label = call["label"]
    if "signature" in call:
        target.signature_name = call["signature"]


def encode(array: np.ndarray) -> dict[str, Any]:
    if array.dtype == object:
        return {
            "dtype": "string",
            "shape": list(array.shape),
            "b64": [base64.b64encode(v).decode() for v in array.ravel()],
        }
    return {"dtype": array.dtype.name, "shape": list(array.shape), "value": array.tolist()}


def run(call: dict[str, Any], channel: grpc.Channel) -> dict[str, Any]:
    prediction = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    if call["call"] == "predict":
        request = predict_pb2.PredictRequest()
        spec(request.model_spec, call)
        for name, tensor in call["inputs"].items():
            if "b64" in tensor:
                value = np.array([base64.b64decode(v) for v in tensor["b64"]], dtype=object).reshape(tensor["shape"])
            else:
                value = np.array(tensor["value"], dtype=tf.dtypes.as_dtype(tensor["dtype"]).as_numpy_dtype)
            request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
        request.output_filter.extend(call.get("output_filter", []))
        response = prediction.Predict(request, timeout=30)
        return {
            "outputs": {name: encode(tf.make_ndarray(proto)) for name, proto in response.outputs.items()},
            "model_spec": {
                "name": response.model_spec.name,
                "version": response.model_spec.version.value,
                "signature_name": response.model_spec.signature_name,
            },
        }
    if call["call"] == "metadata":
        request = get_model_metadata_pb2.GetModelMetadataRequest()
        spec(request.model_spec, call)
        request.metadata_field.append("signature_def")
        response = prediction.GetModelMetadata(request, timeout=30)
        any_message = response.metadata["signature_def"]
        signatures = get_model_metadata_pb2.SignatureDefMap()
        assert any_message.Unpack(signatures), any_message.type_url
        signature = signatures.signature_def["serving_default"]

        def info(tensors: Any) -> dict[str, Any]:
            return {
                name: {"dtype": tf.dtypes.as_dtype(t.dtype).name, "shape": [d.size for d in t.tensor_shape.dim]}
                for name, t in tensors.items()
            }

        return {
            "type_url": any_message.type_url,
            "version": response.model_spec.version.value,
            "method_name": signature.method_name,
            "inputs": info(signature.inputs),
            "outputs": info(signature.outputs),
        }
    if call["call"] == "status":
        request = get_model_status_pb2.GetModelStatusRequest()
        spec(request.model_spec, call)
        response = model_service_pb2_grpc.ModelServiceStub(channel).GetModelStatus(request, timeout=30)
        return {
            "versions": [
                {
                    "version": v.version,
                    "state": get_model_status_pb2.ModelVersionStatus.State.Name(v.state),
                    "error_code": int(v.status.error_code),
                    "error_message": v.status.error_message,
                }
                for v in response.model_version_status
            ]
        }
    if call["call"] == "reload":
        request = model_management_pb2.ReloadConfigRequest()
        text_format.Parse(call["config"], request.config)
        metadata = [("authorization", f"Bearer {call['token']}")] if "token" in call else None
        stub = model_service_pb2_grpc.ModelServiceStub(channel)
        response = stub.HandleReloadConfigRequest(request, timeout=60, metadata=metadata)
        return {"error_code": int(response.status.error_code), "error_message": response.status.error_message}
    raise ValueError(f"unknown call {call['call']}")


def main() -> None:
    target, calls = sys.argv[1], json.load(sys.stdin)
    results = []
    with grpc.insecure_channel(target) as channel:
        for call in calls:
            try:
                results.append(run(call, channel))
            except grpc.RpcError as error:
                results.append({"error": error.code().name, "details": error.details()})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()

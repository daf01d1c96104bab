"""Hypothesis strategies for every codec inferd reads, in one place for the unit tests (each
decoder must raise InferdError and nothing else), the e2e fuzz tests and `benchmarks/fuzz.py`:

    values        the target models, JSON values, tensor elements, shapes, mutations
    kserve        v2 JSON, v2 with binary tensors, gRPC ModelInferRequest
    doors         TF Serving REST and gRPC PredictRequest, SageMaker, TorchServe, OpenAI, repository and
                  shared memory bodies
    model_config  config.pbtxt text
    calls         whole HTTP and gRPC requests to a server with every door on

Needs hypothesis (the `test` extra); nothing in the server imports it.
"""

from inferd.testing.strategies.calls import GrpcCall, HttpCall, grpc_calls, http_calls
from inferd.testing.strategies.doors import (
    index_documents,
    load_documents,
    npy_bodies,
    openai_documents,
    register_documents,
    sagemaker_bodies,
    sagemaker_load_documents,
    tfserving_documents,
    tfserving_predict_requests,
    torchserve_bodies,
    unload_documents,
)
from inferd.testing.strategies.kserve import model_infer_requests, v2_binary_bodies, v2_documents
from inferd.testing.strategies.model_config import config_texts
from inferd.testing.strategies.values import TARGETS, Target, encode_json, json_values

__all__ = [
    "TARGETS",
    "GrpcCall",
    "HttpCall",
    "Target",
    "config_texts",
    "encode_json",
    "grpc_calls",
    "http_calls",
    "index_documents",
    "json_values",
    "load_documents",
    "model_infer_requests",
    "npy_bodies",
    "openai_documents",
    "register_documents",
    "sagemaker_bodies",
    "sagemaker_load_documents",
    "tfserving_documents",
    "tfserving_predict_requests",
    "torchserve_bodies",
    "unload_documents",
    "v2_binary_bodies",
    "v2_documents",
]

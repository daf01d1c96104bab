"""Whole requests to a real server with every door on (`inferd.testing.doors`): HTTP calls for each
REST door with generated bodies and headers, and gRPC ModelInfer messages. The e2e fuzz test and
`benchmarks/fuzz.py` send these; `door` names what each one exercises, for the counts."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from inferd.testing.strategies.doors import (
    index_documents,
    load_documents,
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
from inferd.testing.strategies.values import encode_json, header_text, model_names, one_in, targets, usually

# The model the repository calls may load and unload: nothing else depends on it.
SCRATCH_MODEL = "scratch"


@dataclass(frozen=True, slots=True)
class HttpCall:
    door: str
    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GrpcCall:
    door: str
    message: Any


def _segment(name: str) -> str:
    return urllib.parse.quote(name, safe="")


@st.composite
def _common_headers(draw: st.DrawFn) -> dict[str, str]:
    """Headers every route reads: a request id, a deadline, Server-Timing (each now and then)."""
    headers = {}
    if one_in(draw, 5):
        headers["X-Request-ID"] = draw(header_text)
    if one_in(draw, 10):
        timeouts = st.sampled_from(["0", "-1", "nan", "1e-300", "inf"]) | header_text
        headers["Inferd-Timeout-Ms"] = draw(usually(st.sampled_from(["1000", "30000"]), timeouts, 3))
    if one_in(draw, 10):
        headers["Inferd-Server-Timing"] = draw(st.sampled_from(["true", "1", "no"]))
    return headers


@st.composite
def _version(draw: st.DrawFn) -> str:
    """The newest ("") or version 1 mostly; another version, or any path segment, now and then."""
    version: str = draw(usually(st.sampled_from(["", "", "1"]), st.sampled_from(["2", "0"]) | st.text(max_size=3)))
    return version


@st.composite
def kserve_calls(draw: st.DrawFn) -> HttpCall:
    target = draw(targets)
    version = draw(_version())
    path = f"/v2/models/{_segment(target.model)}" + (f"/versions/{_segment(version)}" if version else "") + "/infer"
    headers = draw(_common_headers())
    if draw(st.booleans()):
        return HttpCall("kserve_json", "POST", path, encode_json(draw(v2_documents(target))), headers)
    body, length = draw(v2_binary_bodies(target))
    if length is not None:
        headers["Inference-Header-Content-Length"] = str(length)
    if one_in(draw, 12):
        headers["Content-Encoding"] = draw(st.sampled_from(["gzip", "deflate", "br", "identity"]))
    if one_in(draw, 10):
        headers["Accept-Encoding"] = draw(st.sampled_from(["gzip", "deflate;q=0.5, gzip;q=0.4", "*"]) | header_text)
    return HttpCall("kserve_binary", "POST", path, body, headers)


@st.composite
def tfserving_calls(draw: st.DrawFn) -> HttpCall:
    target = draw(targets)
    labels = "/labels/stable" if target.model == "add_sub" else "/versions/1"
    wrong = st.sampled_from(["/labels/nope", "/versions/x"])
    where = draw(usually(st.sampled_from(["", "/versions/1", labels]), wrong))
    path = f"/v1/models/{_segment(target.model)}{where}:predict"
    return HttpCall("tfserving", "POST", path, encode_json(draw(tfserving_documents(target))), draw(_common_headers()))


@st.composite
def sagemaker_calls(draw: st.DrawFn) -> HttpCall:
    headers, body = draw(sagemaker_bodies())
    path = draw(st.sampled_from(["/invocations", "/endpoints/local/invocations"]))
    return HttpCall("sagemaker", "POST", path, body, {**draw(_common_headers()), **headers})


@st.composite
def torchserve_calls(draw: st.DrawFn) -> HttpCall:
    target = draw(targets)
    version = draw(usually(st.sampled_from(["", "/1"]), st.just("/9")))
    content_type, body = draw(torchserve_bodies(target))
    headers = {**draw(_common_headers()), "Content-Type": content_type}
    method = draw(st.sampled_from(["POST", "PUT"]))
    return HttpCall("torchserve", method, f"/predictions/{_segment(target.model)}{version}", body, headers)


@st.composite
def openai_calls(draw: st.DrawFn) -> HttpCall:
    body = encode_json(draw(openai_documents()))
    return HttpCall("openai", "POST", "/openai/v1/embeddings", body, draw(_common_headers()))


@st.composite
def read_calls(draw: st.DrawFn) -> HttpCall:
    """The GET routes of every door, on the targets' models and on any name."""
    model = _segment(draw(model_names))
    path = draw(
        st.sampled_from(
            [
                f"/v2/models/{model}",
                f"/v2/models/{model}/versions/1/ready",
                f"/v2/models/{model}/config",
                f"/v2/models/{model}/stats",
                f"/v1/models/{model}/metadata",
                f"/v1/models/{model}/labels/stable",
                f"/openai/v1/models/{model}",
                f"/models/{model}",
                "/v2/models/stats",
                "/v2/systemsharedmemory/status",
                "/openai/v1/models",
                "/models",
                "/ping",
            ]
        )
    )
    return HttpCall("reads", draw(st.sampled_from(["GET", "HEAD"])), path, b"", draw(_common_headers()))


@st.composite
def management_calls(draw: st.DrawFn) -> HttpCall:
    """The repository and shared memory routes: bodies that load or unload only the scratch model,
    register regions of any name and key, and SageMaker loads of any url."""
    kind = draw(st.integers(0, 4))
    headers = draw(_common_headers())
    if kind == 0:
        return HttpCall("management", "POST", "/v2/repository/index", encode_json(draw(index_documents)), headers)
    if kind == 1:
        path = f"/v2/repository/models/{SCRATCH_MODEL}/load"
        return HttpCall("management", "POST", path, encode_json(draw(load_documents)), headers)
    if kind == 2:
        path = f"/v2/repository/models/{SCRATCH_MODEL}/unload"
        return HttpCall("management", "POST", path, encode_json(draw(unload_documents)), headers)
    if kind == 3:
        region = _segment(draw(st.text(min_size=1, max_size=6)))
        body = encode_json(draw(register_documents))
        return HttpCall("management", "POST", f"/v2/systemsharedmemory/region/{region}/register", body, headers)
    return HttpCall("management", "POST", "/models", encode_json(draw(sagemaker_load_documents)), headers)


def http_calls() -> st.SearchStrategy[HttpCall]:
    """A call to any REST door, inference mostly."""
    return st.one_of(
        kserve_calls(),
        kserve_calls(),
        tfserving_calls(),
        sagemaker_calls(),
        torchserve_calls(),
        openai_calls(),
        read_calls(),
        management_calls(),
    )


def grpc_calls() -> st.SearchStrategy[GrpcCall]:
    """KServe's ModelInfer or TF Serving's Predict."""
    return st.one_of(
        model_infer_requests().map(lambda message: GrpcCall("kserve_grpc", message)),
        tfserving_predict_requests().map(lambda message: GrpcCall("tfserving_grpc", message)),
    )

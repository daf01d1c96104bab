"""`InferenceCall` in process, over a real registry and service (no server, no socket): what every
door gets from the one call (the e2e tests prove the doors are wired to it; this proves the call)."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from inferd.core.registry import ModelRegistry
from inferd.core.repository import LocalRepository
from inferd.core.service import InferenceService
from inferd.core.statistics import ServingStatistics
from inferd.errors import InvalidRequestError, MalformedRequestError, OverloadedError
from inferd.protocol.codecs.base import Target
from inferd.protocol.codecs.kserve import KServeHttpCodec
from inferd.protocol.codecs.openai import OpenAiEmbeddingsCodec
from inferd.protocol.codecs.tfserving import TfServingRestCodec
from inferd.server.decoded_bytes import DecodedBytesBudget
from inferd.server.http11 import HttpRequest
from inferd.server.inference_call import InferenceCall
from inferd.testing.models import mlp_model, sleepy_model, write_config
from inferd.types import Door

V2_BODY = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]})


# The statistics of the service under test (the registry counts; the service reads the same).
STATISTICS: list[ServingStatistics] = []


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[InferenceService]:
    STATISTICS[:] = [ServingStatistics()]
    mlp_model(tmp_path / "models" / "mlp" / "1" / "model.onnx")
    mlp_model(tmp_path / "models" / "mlp" / "2" / "model.onnx")
    write_config(
        tmp_path / "models" / "mlp",
        "max_batch_size: 8\nversion_policy: { all { } }\n"
        'parameters { key: "version_labels" value { string_value: "stable:1" } }',
    )
    # Holds one request (executing or queued): the second is refused while the first is held.
    sleepy_model(
        tmp_path / "models" / "held",
        sleep_ms=0,
        max_batch_size=1,
        hold_file=tmp_path / "hold",
        config="dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    )
    registry = ModelRegistry(LocalRepository(tmp_path / "models"), STATISTICS[0])
    await registry.load_all()
    yield InferenceService(registry)
    (tmp_path / "hold").unlink(missing_ok=True)
    await registry.close()


def call(service: InferenceService, budget_bytes: int = 2**20) -> InferenceCall:
    return InferenceCall(service, max_request_bytes=2**20, decoded=DecodedBytesBudget(budget_bytes, 100))


def post(body: bytes, **headers: str) -> HttpRequest:
    fields = {name.replace("_", "-").encode(): value.encode() for name, value in headers.items()}
    return HttpRequest("POST", "/", b"", {b"content-type": b"application/json", **fields}, body)


async def test_an_answer_carries_the_request_id_and_when_asked_the_time_split(service: InferenceService) -> None:
    answer = await call(service).http(
        KServeHttpCodec(service.limits), post(V2_BODY, inferd_server_timing="1"), Target("mlp", "")
    )
    headers = dict(answer.headers)
    assert answer.status == 200 and headers[b"x-request-id"]
    timing = headers[b"server-timing"].decode()
    assert "decode;dur=" in timing and "encode;dur=" in timing
    assert float(timing.split("encode;dur=")[1]) > 0
    (statistics,) = service.model_statistics("mlp", "2")
    assert statistics.inference_count == 1


async def test_a_full_queue_is_refused_before_the_body_is_read(service: InferenceService, tmp_path: Path) -> None:
    (tmp_path / "hold").touch()
    the_call = call(service)
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1]}]})
    first = asyncio.ensure_future(the_call.http(KServeHttpCodec(service.limits), post(body), Target("held", "")))
    # The first request reaches the model, which holds it: waited for by the server's own gauge,
    # as long as a slow machine needs (bounded).
    deadline = asyncio.get_running_loop().time() + 30
    while not any(model == "held" and in_flight for model, _, in_flight, _ in service.load()):
        assert asyncio.get_running_loop().time() < deadline, "the held model never took the first request"
        await asyncio.sleep(0.005)
    with pytest.raises(OverloadedError):
        await the_call.http(KServeHttpCodec(service.limits), post(b"not json at all"), Target("held", ""))
    (tmp_path / "hold").unlink()
    assert (await first).status == 200


async def test_a_version_label_is_resolved_through_the_models_config(service: InferenceService) -> None:
    body = orjson.dumps({"instances": [[0.5] * 16]})
    target = Target("mlp", label="stable")
    await call(service).http(TfServingRestCodec(), post(body), target)
    assert target.version == "1"
    with pytest.raises(InvalidRequestError, match="Unrecognized servable version label: canary"):
        await call(service).http(TfServingRestCodec(), post(body), Target("mlp", label="canary"))


async def test_a_compressed_body_is_inflated_under_the_budget_and_the_budget_given_back(
    service: InferenceService,
) -> None:
    the_call = call(service)
    answer = await the_call.http(
        KServeHttpCodec(service.limits), post(gzip.compress(V2_BODY), content_encoding="gzip"), Target("mlp")
    )
    assert answer.status == 200
    assert the_call._decoded.held_bytes == 0
    # A budget smaller than what the body may inflate to refuses it, retry later, before inflating.
    with pytest.raises(OverloadedError, match="max-decoded-bytes-in-flight"):
        await call(service, budget_bytes=10).http(
            KServeHttpCodec(service.limits), post(gzip.compress(V2_BODY), content_encoding="gzip"), Target("mlp")
        )


async def test_a_body_that_names_its_model_is_read_for_it_first(service: InferenceService) -> None:
    # The model is found in the body; a model without embedding parameters is refused by name.
    with pytest.raises(InvalidRequestError, match="'mlp' does not serve embeddings"):
        await call(service).http(
            OpenAiEmbeddingsCodec(service.limits),
            post(b'{"model": "mlp", "input": "hi"}'),
            OpenAiEmbeddingsCodec.target,
        )
    with pytest.raises(MalformedRequestError, match="'model'"):
        await call(service).http(
            OpenAiEmbeddingsCodec(service.limits), post(b'{"input": "hi"}'), OpenAiEmbeddingsCodec.target
        )


async def test_the_door_is_the_protocol_label_of_the_count_with_its_encode_time(service: InferenceService) -> None:
    await call(service).http(KServeHttpCodec(service.limits, Door.SAGEMAKER), post(V2_BODY), Target("mlp", "2"))
    counted = STATISTICS[0].snapshot()[("mlp", "2")]
    assert counted.outcomes == {("sagemaker", "success"): 1}
    encoded = counted.phases["sagemaker"].encode
    assert set(counted.phases) == {"sagemaker"} and encoded.count == 1 and encoded.total > 0


async def test_every_door_reads_a_compressed_body(service: InferenceService) -> None:
    body = gzip.compress(orjson.dumps({"instances": [[0.5] * 16]}))
    answer = await call(service).http(TfServingRestCodec(), post(body, content_encoding="gzip"), Target("mlp", "2"))
    assert answer.status == 200 and "predictions" in orjson.loads(answer.body)

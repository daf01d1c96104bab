"""OpenAI-compatible embeddings, called with the official `openai` client unchanged (base_url only),
against the example's sentence_embedding ensemble, checked against the same computation done with
tokenizers and onnxruntime directly."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import openai
import pytest
import requests

from inferd.testing.server import ServerProcess
from tests.e2e.conftest import http_request
from tests.e2e.test_observability import grew, scrape
from tests.e2e.test_pipeline import reference_embeddings

pytestmark = pytest.mark.e2e

TEXTS = ["A man is playing a guitar.", "Héllo wörld, 東京は晴れ", " ", "inferd serves models fast " * 40]


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{server.http_url}/openai/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_embeddings_match_the_model_computed_by_hand(
    pipeline_server: ServerProcess, pipeline_repository: Path, encoding_format: str | None
) -> None:
    extra = {"encoding_format": encoding_format} if encoding_format else {}  # None: the client asks base64
    with client(pipeline_server) as openai_client:
        result = openai_client.embeddings.create(model="sentence_embedding", input=TEXTS, **extra)
    want, tokens = reference_embeddings(pipeline_repository, TEXTS)
    assert [item.index for item in result.data] == [0, 1, 2, 3]
    if encoding_format == "base64":  # asked for explicitly, the client hands over the text as sent
        got = np.stack([np.frombuffer(base64.b64decode(item.embedding), "<f4") for item in result.data])
    else:
        got = np.array([item.embedding for item in result.data], dtype=np.float32)
    assert got.shape == (4, 384)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert result.model == "sentence_embedding"
    assert result.usage.prompt_tokens == result.usage.total_tokens == sum(tokens)


def test_a_single_string_and_the_models_list(pipeline_server: ServerProcess, pipeline_repository: Path) -> None:
    with client(pipeline_server) as openai_client:
        result = openai_client.embeddings.create(model="sentence_embedding", input="only one", encoding_format="float")
        models = [model.id for model in openai_client.models.list()]
        one = openai_client.models.retrieve("sentence_embedding")
    want, _ = reference_embeddings(pipeline_repository, ["only one"])
    np.testing.assert_allclose(result.data[0].embedding, want[0], atol=1e-5)
    assert models == ["sentence_embedding"]  # the one model that declares embedding_input
    assert one.id == "sentence_embedding" and one.owned_by == "inferd"


def test_more_texts_than_a_batch_are_sent_in_chunks(pipeline_server: ServerProcess, pipeline_repository: Path) -> None:
    texts = [f"sentence number {i} about {'cats' if i % 2 else 'dogs'}" for i in range(70)]  # > max_batch_size 32
    with client(pipeline_server) as openai_client:
        result = openai_client.embeddings.create(model="sentence_embedding", input=texts, encoding_format="float")
    want, _ = reference_embeddings(pipeline_repository, texts)
    np.testing.assert_allclose(np.array([item.embedding for item in result.data]), want, atol=1e-5)


def test_errors_are_openai_errors(pipeline_server: ServerProcess) -> None:
    with client(pipeline_server) as openai_client:
        with pytest.raises(openai.NotFoundError) as missing:
            openai_client.embeddings.create(model="ghost", input="x")
        assert missing.value.code == "MODEL_NOT_FOUND" and "ghost" in missing.value.message
        with pytest.raises(openai.BadRequestError) as not_embedding:
            openai_client.embeddings.create(model="cosine", input="x")
        assert "does not serve embeddings" in not_embedding.value.message
        with pytest.raises(openai.BadRequestError) as dimensions:
            openai_client.embeddings.create(model="sentence_embedding", input="x", dimensions=64)
        assert dimensions.value.param == "dimensions" and "384" in dimensions.value.message
        with pytest.raises(openai.BadRequestError) as tokens:
            openai_client.embeddings.create(model="sentence_embedding", input=[[101, 2023]])
        assert "token ids" in tokens.value.message
    url = f"http://{pipeline_server.http_url}/openai/v1/embeddings"
    bad = requests.post(
        url, data=b'{"model": "sentence_embedding", "input": "x", "encoding_format": "hex"}', timeout=10
    )
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert bad.json()["error"]["code"] == "MALFORMED_REQUEST"
    not_utf8 = http_request(
        pipeline_server, "POST", "/openai/v1/embeddings", b'{"model": "sentence_embedding", "input": "\\ud800"}'
    )
    assert not_utf8.status == 400


@pytest.mark.parametrize("texts", ["", [""], ["a", ""]], ids=["alone", "list", "among others"])
def test_an_empty_text_is_refused_as_openai_refuses_it(pipeline_server: ServerProcess, texts: str | list[str]) -> None:
    with client(pipeline_server) as openai_client, pytest.raises(openai.BadRequestError) as empty:
        openai_client.embeddings.create(model="sentence_embedding", input=texts)
    assert empty.value.status_code == 400
    assert empty.value.type == "invalid_request_error"
    assert empty.value.param == "input" and "empty" in empty.value.message


def test_requests_count_under_their_door(pipeline_server: ServerProcess) -> None:
    before = scrape(pipeline_server)
    with client(pipeline_server) as openai_client:
        openai_client.embeddings.create(model="sentence_embedding", input=["a", "b"])
    after = scrape(pipeline_server)
    labels = {"model": "sentence_embedding", "protocol": "openai", "outcome": "success"}
    assert grew(before, after, "inferd_requests_total", **labels) == 1
    steps = {"model": "minilm", "protocol": "ensemble", "outcome": "success"}
    assert grew(before, after, "inferd_requests_total", **steps) > 0


def test_an_endpoint_serves_embeddings_to_the_openai_client(pipeline_server: ServerProcess) -> None:
    variants = [{"name": "a", "model": "sentence_embedding", "weight": 50},
                {"name": "b", "model": "sentence_embedding", "weight": 50}]  # fmt: skip
    body = json.dumps({"variants": variants}).encode()
    assert http_request(pipeline_server, "PUT", "/v2/endpoints/embedder", body).status == 201
    try:
        with client(pipeline_server) as openai_client:
            routed = openai_client.embeddings.create(model="embedder", input=TEXTS[:2], encoding_format="float")
            direct = openai_client.embeddings.create(
                model="sentence_embedding", input=TEXTS[:2], encoding_format="float"
            )
        assert routed.model == "embedder"
        np.testing.assert_allclose(
            [e.embedding for e in routed.data], [e.embedding for e in direct.data], rtol=1e-5, atol=1e-6
        )
    finally:
        assert http_request(pipeline_server, "DELETE", "/v2/endpoints/embedder").status == 200

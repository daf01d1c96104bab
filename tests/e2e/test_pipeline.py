"""The example's sentence-similarity ensemble (tokenizer → all-MiniLM-L6-v2 → mean pooling →
cosine) served by `inferd serve`, scored against the same computation done with tokenizers and
onnxruntime directly (no inferd code): over binary HTTP and gRPC, concurrently, and with text that
is not UTF-8, which is a 400 naming the step."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
import tritonclient.http.aio as httpaio
from tokenizers import Tokenizer

from inferd.testing.models import reference_session
from inferd.testing.server import ServerProcess
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e

PAIRS = [
    ("A man is playing a guitar.", "Someone plays the guitar on stage."),
    ("inferd serves models fast", "The cat sleeps in the afternoon sun."),
    ("Héllo wörld, ça va? 東京は晴れ", "Hello world, how are you? Tokyo is sunny"),
    ("short", "a much longer sentence with many more tokens than the other one has, " * 12),  # > 128 tokens
    ("", "an empty sentence on the left"),
    ("The quick brown fox jumps over the lazy dog.", "The quick brown fox jumps over the lazy dog."),
]


def reference_embeddings(repository: Path, texts: list[str]) -> tuple[np.ndarray, list[int]]:
    """The embedding by hand: the tokenizer file's own settings, the encoder, masked mean,
    normalized; and each text's token count."""
    tokenizer = Tokenizer.from_file(str(repository / "tokenizer" / "1" / "tokenizer.json"))
    session = reference_session(repository / "minilm" / "1" / "model.onnx")
    encodings = tokenizer.encode_batch(texts)
    feeds = {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }
    (hidden,) = session.run(["last_hidden_state"], feeds)
    mask = feeds["attention_mask"][:, :, None].astype(np.float32)
    mean = (hidden * mask).sum(axis=1) / np.maximum(mask.sum(axis=1), 1e-9)
    return mean / np.linalg.norm(mean, axis=1, keepdims=True), [sum(e.attention_mask) for e in encodings]


def reference_similarity(repository: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """The pipeline by hand: the embeddings of each side, then their cosine."""
    a, _ = reference_embeddings(repository, [p[0] for p in pairs])
    b, _ = reference_embeddings(repository, [p[1] for p in pairs])
    return (a * b).sum(axis=1)


def sentences(pairs: list[tuple[str, str]], side: int) -> np.ndarray:
    return np.array([[pair[side].encode()] for pair in pairs], dtype=object)


async def http_similarity(client: httpaio.InferenceServerClient, pairs: list[tuple[str, str]]) -> np.ndarray:
    inputs = []
    for side, name in enumerate(("SENTENCE_A", "SENTENCE_B")):
        tensor = httpaio.InferInput(name, [len(pairs), 1], "BYTES")
        tensor.set_data_from_numpy(sentences(pairs, side), binary_data=True)
        inputs.append(tensor)
    outputs = [httpaio.InferRequestedOutput("SIMILARITY", binary_data=True)]
    result = await client.infer("sentence_similarity", inputs, outputs=outputs)
    return result.as_numpy("SIMILARITY")[:, 0]


async def grpc_similarity(client: grpcaio.InferenceServerClient, pairs: list[tuple[str, str]]) -> np.ndarray:
    inputs = []
    for side, name in enumerate(("SENTENCE_A", "SENTENCE_B")):
        tensor = grpcaio.InferInput(name, [len(pairs), 1], "BYTES")
        tensor.set_data_from_numpy(sentences(pairs, side))
        inputs.append(tensor)
    result = await client.infer("sentence_similarity", inputs, outputs=[grpcaio.InferRequestedOutput("SIMILARITY")])
    return result.as_numpy("SIMILARITY")[:, 0]


async def test_scores_match_tokenizers_and_onnxruntime_called_directly(
    pipeline_server: ServerProcess, pipeline_repository: Path
) -> None:
    want = reference_similarity(pipeline_repository, PAIRS)
    async with (
        httpaio.InferenceServerClient(pipeline_server.http_url) as http_client,
        grpcaio.InferenceServerClient(pipeline_server.grpc_url) as grpc_client,
    ):
        whole_http = await http_similarity(http_client, PAIRS)
        whole_grpc = await grpc_similarity(grpc_client, PAIRS)
        # One pair per request, all at once: the steps batch across requests and across sides.
        singles = await asyncio.gather(
            *(
                (http_similarity(http_client, [pair]) if i % 2 else grpc_similarity(grpc_client, [pair]))
                for i, pair in enumerate(PAIRS * 3)
            )
        )
    np.testing.assert_allclose(whole_http, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(whole_grpc, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(singles), np.tile(want, 3), rtol=0, atol=1e-5)
    assert want[-1] == pytest.approx(1.0, abs=1e-5)  # a sentence is its own best match
    assert want[0] > want[1]  # guitars are closer to guitars than to cats


async def test_text_that_is_not_utf8_is_a_400_naming_the_tokenizer_step(pipeline_server: ServerProcess) -> None:
    bad = [("fine", "also fine"), ("fine", "\udcff")]  # a lone surrogate: encodes to bytes that are not UTF-8
    async with httpaio.InferenceServerClient(pipeline_server.http_url) as client:
        inputs = []
        for side, name in enumerate(("SENTENCE_A", "SENTENCE_B")):
            tensor = httpaio.InferInput(name, [2, 1], "BYTES")
            rows = np.array([[pair[side].encode("utf-8", "surrogateescape")] for pair in bad], dtype=object)
            tensor.set_data_from_numpy(rows, binary_data=True)
            inputs.append(tensor)
        good = http_similarity(client, PAIRS[:2])
        outcomes = await asyncio.gather(client.infer("sentence_similarity", inputs), good, return_exceptions=True)
    error, answered = outcomes
    assert "[400]" in str(error)
    assert "ensemble 'sentence_similarity' step 3 (model 'tokenizer')" in str(error)
    assert "input 'TEXT' row 1 is not valid UTF-8 text" in str(error)
    assert isinstance(answered, np.ndarray) and answered.shape == (2,)  # the request beside it is served


def test_the_ensemble_is_described_like_any_model(pipeline_server: ServerProcess) -> None:
    reply = http_request(pipeline_server, "GET", "/v2/models/sentence_similarity")
    metadata = json.loads(reply.body)
    assert metadata["platform"] == "ensemble"
    assert [i["name"] for i in metadata["inputs"]] == ["SENTENCE_A", "SENTENCE_B"]
    assert metadata["outputs"][0] == {"name": "SIMILARITY", "datatype": "FP32", "shape": [-1, 1]}

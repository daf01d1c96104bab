"""Every decoder, fed the generated bodies of `inferd.testing.strategies`: whatever arrives, it
answers with a value or raises one of inferd's errors (which the doors turn into a 4xx), never
anything else (which would be a 500)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferd.config.loader import parse_model_config
from inferd.errors import InferdError
from inferd.limits import RequestLimits
from inferd.protocol import (
    grpc_v2,
    http_compression,
    json_v2,
    openai_embeddings,
    sagemaker,
    shared_memory,
    tfserving_grpc,
    tfserving_json,
)
from inferd.testing import strategies as gen
from inferd.types import DataType

FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

# What the server holds every request to by default: a fuzzer's body meets the decoders as a client's
# does (with no limits, a declared shape of 2**31 that one value fills is 16 GiB, by design).
SERVER_LIMITS = RequestLimits()


def refuses_only_with_inferd_errors(decode: Callable[[], Any]) -> None:
    """Any other exception propagates and fails the test with hypothesis's smallest example."""
    with contextlib.suppress(InferdError):
        decode()


@FUZZ
@given(document=gen.v2_documents())
def test_v2_json(document: Any) -> None:
    body = gen.encode_json(document)
    refuses_only_with_inferd_errors(
        lambda: json_v2.decode_request(body, limits=SERVER_LIMITS, model_name="m", model_version="")
    )


@FUZZ
@given(body_and_length=gen.v2_binary_bodies())
def test_v2_binary_extension(body_and_length: tuple[bytes, int | None]) -> None:
    body, length = body_and_length
    refuses_only_with_inferd_errors(
        lambda: json_v2.decode_request(
            body, limits=SERVER_LIMITS, model_name="m", model_version="", header_length=length
        )
    )


@FUZZ
@given(message=gen.model_infer_requests())
def test_grpc_model_infer_request(message: Any) -> None:
    refuses_only_with_inferd_errors(lambda: grpc_v2.decode_request(message, limits=SERVER_LIMITS))


@FUZZ
@given(text=gen.config_texts())
def test_config_pbtxt(text: str) -> None:
    refuses_only_with_inferd_errors(lambda: parse_model_config(text, model_name="m"))


@FUZZ
@given(target=st.sampled_from(gen.TARGETS), data=st.data())
def test_tfserving_predict(target: gen.Target, data: st.DataObject) -> None:
    document = data.draw(gen.tfserving_documents(target))
    refuses_only_with_inferd_errors(lambda: tfserving_json.decode_predict(document, target.metadata()))


@FUZZ
@given(target=st.sampled_from(gen.TARGETS), data=st.data())
def test_torchserve_json_bodies(target: gen.Target, data: st.DataObject) -> None:
    _, body = data.draw(gen.torchserve_bodies(target))

    def decode() -> Any:
        document = json_v2.load_json(body)
        if sagemaker.is_v2_body(document):
            return json_v2.decode_request(body, limits=SERVER_LIMITS, model_name=target.model, model_version="")
        return tfserving_json.decode_columns(document, target.metadata())

    refuses_only_with_inferd_errors(decode)


@FUZZ
@given(headers_and_body=gen.sagemaker_bodies(), datatype=st.sampled_from(list(DataType)))
def test_sagemaker_bodies(headers_and_body: tuple[dict[str, str], bytes], datatype: DataType) -> None:
    headers, body = headers_and_body

    def decode() -> Any:
        kind, parameters = sagemaker.media_type(headers["Content-Type"].encode("utf-8"))
        sagemaker.answer_type(headers.get("Accept", "").encode("utf-8"), sagemaker.JSON)
        sagemaker.check_readable(kind)
        if kind == sagemaker.NPY:
            return sagemaker.decode_npy(body)
        if kind == sagemaker.CSV:
            return sagemaker.decode_csv(body, datatype)
        return sagemaker.is_v2_body(json_v2.load_json(body)) if kind == sagemaker.JSON else parameters

    refuses_only_with_inferd_errors(decode)


@FUZZ
@given(body=gen.npy_bodies())
def test_npy(body: bytes) -> None:
    refuses_only_with_inferd_errors(lambda: sagemaker.decode_npy(body))


@FUZZ
@given(document=gen.openai_documents())
def test_openai_embeddings(document: Any) -> None:
    body = gen.encode_json(document)
    refuses_only_with_inferd_errors(lambda: openai_embeddings.decode_request(body, SERVER_LIMITS))


@pytest.mark.parametrize(
    ("documents", "decode"),
    [
        (gen.index_documents, json_v2.decode_index_request),
        (gen.load_documents, json_v2.decode_load_request),
        (gen.unload_documents, json_v2.decode_unload_request),
        (gen.sagemaker_load_documents, sagemaker.decode_load_body),
        (gen.register_documents, lambda body: shared_memory.register_body(json_v2.load_json(body))),
    ],
    ids=["index", "load", "unload", "sagemaker_load", "shm_register"],
)
def test_repository_and_shared_memory_bodies(documents: Any, decode: Callable[[bytes], Any]) -> None:
    @FUZZ
    @given(document=documents)
    def each(document: Any) -> None:
        body = gen.encode_json(document)
        refuses_only_with_inferd_errors(lambda: decode(body))

    each()


@FUZZ
@given(body=st.binary(max_size=64), encoding=st.sampled_from([b"gzip", b"deflate", b"identity", b"br", b""]))
def test_compressed_bodies(body: bytes, encoding: bytes) -> None:
    refuses_only_with_inferd_errors(lambda: http_compression.decode_body(body, encoding, 1024))


@FUZZ
@given(body=st.binary(max_size=64) | gen.json_values.map(gen.encode_json))
def test_any_json_body(body: bytes) -> None:
    refuses_only_with_inferd_errors(lambda: json_v2.load_json(body))


@FUZZ
@given(message=gen.tfserving_predict_requests())
def test_tfserving_grpc_predict_request(message: Any) -> None:
    refuses_only_with_inferd_errors(lambda: tfserving_grpc.decode_predict(message, SERVER_LIMITS))

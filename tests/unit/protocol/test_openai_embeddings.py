"""openai_embeddings' texts held to the text limit they are given, all of a body's together."""

from __future__ import annotations

import re

import pytest

from inferd.errors import RequestTooLargeError
from inferd.limits import RequestLimits
from inferd.protocol import openai_embeddings

BODY = b'{"model": "m", "input": ["hello", "world!"]}'  # 11 bytes, and 4 counted for each text


def test_a_body_s_texts_are_held_to_the_text_limit_given() -> None:
    message = (
        "input 'input': the request's BYTES elements hold 19 bytes (4 counted for each element), more than the "
        "server's limit of 18 per request (--max-request-text-bytes)"
    )
    with pytest.raises(RequestTooLargeError, match=re.escape(message)):
        openai_embeddings.decode_request(BODY, RequestLimits(max_text_bytes=18))
    assert openai_embeddings.decode_request(BODY, RequestLimits(max_text_bytes=19)).texts == (b"hello", b"world!")

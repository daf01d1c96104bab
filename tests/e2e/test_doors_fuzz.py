"""Generated bodies thrown at every door's inference routes of a real server: whatever JSON (or
bytes) arrives, the answer is a 2xx or a 4xx, never a 5xx, and the server keeps serving."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferd.testing.server import ServerProcess
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e

ROUTES = [
    ("/v1/models/mlp:predict", "application/json"),
    ("/v1/models/add_sub/versions/1:predict", "application/json"),
    ("/v1/models/identity_bytes:predict", "application/json"),
    ("/openai/v1/embeddings", "application/json"),
    ("/invocations", "application/json"),
    ("/invocations", "text/csv"),
    ("/invocations", "application/x-npy"),
    ("/predictions/mlp", "application/json"),
    ("/predictions/identity_bytes", "application/octet-stream"),
]

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False),
    st.text(max_size=8), st.fixed_dictionaries({"b64": st.one_of(st.text(max_size=8), st.integers())}),
)  # fmt: skip
values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=20,
)
keys = st.sampled_from(
    ["instances", "inputs", "signature_name", "model", "input", "encoding_format", "dimensions", "x", "INPUT0"]
)
documents = st.dictionaries(keys, values, max_size=4)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(ROUTES), document=documents, raw=st.binary(max_size=64), as_json=st.booleans())
def test_no_door_answers_a_5xx(
    server: ServerProcess, route: tuple[str, str], document: dict, raw: bytes, as_json: bool
) -> None:
    path, content_type = route
    body = json.dumps(document).encode() if as_json else raw  # the stdlib writes integers of any size
    reply = http_request(server, "POST", path, body, {"Content-Type": content_type})
    assert reply.status < 500, (path, body, reply.status, reply.body)


def test_the_server_still_serves_after_the_fuzzing(server: ServerProcess) -> None:
    assert http_request(server, "GET", "/v2/health/ready").status == 200

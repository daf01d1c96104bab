"""A model repository on S3: moto's S3 server on 127.0.0.1 (started here, a real S3 API), read by
`inferd serve --model-repository s3://...` through s3fs with the standard AWS settings."""

from __future__ import annotations

import io
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from inferd.testing.models import mlp_model
from inferd.testing.server import free_port, run_server
from tests.e2e.conftest import Clients
from tests.e2e.test_repository import MLP_CONFIG, expected_mlp, index, mlp_output, wait_for

pytestmark = pytest.mark.e2e

BUCKET = "models"


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A boto3 S3 client on a fresh moto server; the server under test reads the same environment."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    for key, value in {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    # moto's state lives in this process: start each test from an empty S3.
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset", method="POST"))
    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    try:
        yield client
    finally:
        moto.stop()


def upload_mlp(s3: Any, tmp_path: Path, key_prefix: str, seed: int) -> None:
    path = tmp_path / f"mlp-{seed}.onnx"
    mlp_model(path, seed=seed)
    s3.upload_file(str(path), BUCKET, f"{key_prefix}/model.onnx")


def test_poll_mode_serves_and_follows_an_s3_repository(clients: Clients, s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=BUCKET, Key="repo/mlp/config.pbtxt", Body=MLP_CONFIG.encode())
    upload_mlp(s3, tmp_path, "repo/mlp/1", seed=1)
    flags = ("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with run_server(f"s3://{BUCKET}/repo", tmp_path / "server.log", *flags) as server:
        client = clients.http(server.http_url)
        np.testing.assert_allclose(mlp_output(client), expected_mlp(1), rtol=1e-6)
        [entry] = index(client)["mlp"]
        assert entry["load_ms"]["fetch"] > 0  # the files came over the network
        # A new version and a new model, uploaded while serving.
        upload_mlp(s3, tmp_path, "repo/mlp/2", seed=2)
        upload_mlp(s3, tmp_path, "repo/other/1", seed=5)
        wait_for(lambda: [e.get("version") for e in index(client).get("mlp", [])] == ["2"])
        np.testing.assert_allclose(mlp_output(client), expected_mlp(2), rtol=1e-6)
        wait_for(lambda: client.is_model_ready("other"))
        np.testing.assert_allclose(mlp_output(client, "other"), expected_mlp(5), rtol=1e-6)
        # A removed model.
        s3.delete_object(Bucket=BUCKET, Key="repo/other/1/model.onnx")
        wait_for(lambda: "other" not in index(client))
        with pytest.raises(InferenceServerException) as raised:
            mlp_output(client, "other")
        assert raised.value.status() == "404"


def test_explicit_loads_from_s3_beside_a_local_repository(clients: Clients, s3: Any, tmp_path: Path) -> None:
    upload_mlp(s3, tmp_path, "repo/remote/1", seed=3)
    s3.put_object(Bucket=BUCKET, Key="repo/remote/config.pbtxt", Body=io.BytesIO(MLP_CONFIG.encode()))
    upload_mlp(s3, tmp_path, "repo/twice/1", seed=3)
    local = tmp_path / "local"
    mlp_model(local / "nearby" / "1" / "model.onnx", seed=4)
    mlp_model(local / "twice" / "1" / "model.onnx", seed=4)
    flags = ("--model-repository", str(local), "--model-control-mode", "explicit")
    with run_server(f"s3://{BUCKET}/repo", tmp_path / "server.log", *flags) as server:
        client = clients.http(server.http_url)
        assert sorted(index(client)) == ["nearby", "remote", "twice"]
        client.load_model("remote")
        client.load_model("nearby")
        np.testing.assert_allclose(mlp_output(client, "remote"), expected_mlp(3), rtol=1e-6)
        np.testing.assert_allclose(mlp_output(client, "nearby"), expected_mlp(4), rtol=1e-6)
        with pytest.raises(InferenceServerException) as raised:
            client.load_model("twice")
        assert raised.value.status() == "400" and "several model repositories" in raised.value.message()
        client.unload_model("remote")
        assert not client.is_model_ready("remote")
        client.load_model("remote")  # fetched again after its cache was dropped
        np.testing.assert_allclose(mlp_output(client, "remote"), expected_mlp(3), rtol=1e-6)

"""TF Serving's own configuration, unchanged: `--model-config-file` (a model_config_list) naming
two models on S3 (moto's server: a real S3 API on 127.0.0.1) with a version policy and labels,
followed while serving as `--model-config-file-poll-wait-seconds` says; TF Serving's single-model
`--model-name`/`--model-base-path`; ModelService.HandleReloadConfigRequest from TF Serving's own
client, a management call; a config that is not one refused in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from inferd.testing.models import mlp_model
from inferd.testing.server import ServerProcess, free_port, run_server
from tests.e2e.conftest import Clients, http_request
from tests.e2e.test_remote_repository import BUCKET, s3, upload_mlp  # noqa: F401  (s3: a fixture)
from tests.e2e.test_repository import expected_mlp, index, mlp_output, wait_for
from tests.e2e.test_tfserving_grpc import official, tf_python  # noqa: F401  (tf_python: a fixture)

pytestmark = pytest.mark.e2e

X = [float(i) for i in range(16)]  # expected_mlp's input

FIRST_TWO = f"""
model_config_list {{
  config {{
    name: "first"
    base_path: "s3://{BUCKET}/tf/alpha"
    model_platform: "tensorflow"
    model_version_policy {{ specific {{ versions: 1 versions: 3 }} }}
    version_labels {{ key: "stable" value: 1 }}
    version_labels {{ key: "canary" value: 3 }}
  }}
  config {{
    name: "second"
    base_path: "s3://{BUCKET}/tf/beta"
    model_platform: "tensorflow"
  }}
}}
"""
# The file changed while serving: "second" gone, "first" on its latest version only.
FIRST_ONLY = f"""
model_config_list {{
  config {{
    name: "first"
    base_path: "s3://{BUCKET}/tf/alpha"
    model_platform: "tensorflow"
    model_version_policy {{ latest {{ num_versions: 1 }} }}
  }}
}}
"""


def predict(server: ServerProcess, path: str) -> Any:
    reply = http_request(server, "POST", f"/v1/models/{path}:predict", orjson.dumps({"instances": [X]}))
    assert reply.status == 200, reply.body
    return orjson.loads(reply.body)["predictions"]


def versions(client: Any) -> dict[str, list[str]]:
    return {name: sorted(e["version"] for e in entries if "version" in e) for name, entries in index(client).items()}


def test_a_model_config_serves_exactly_its_models_from_s3_and_follows_its_changes(
    clients: Clients,
    s3: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    for version in (1, 2, 3):  # alpha: seeds 11, 12, 13
        upload_mlp(s3, tmp_path, f"tf/alpha/{version}", seed=10 + version)
    for version in (1, 2):  # beta: seeds 21, 22
        upload_mlp(s3, tmp_path, f"tf/beta/{version}", seed=20 + version)
    upload_mlp(s3, tmp_path, "tf/gamma/1", seed=31)  # in the bucket, not in the config: not served
    config = tmp_path / "models.config"
    config.write_text(FIRST_TWO)
    flags = ("--model-config-file", str(config), "--model-config-file-poll-wait-seconds", "0.3")
    with run_server(None, tmp_path / "server.log", *flags) as server:
        client = clients.http(server.http_url)
        assert versions(client) == {"first": ["1", "3"], "second": ["2"]}  # specific 1 and 3; latest 1 of beta
        np.testing.assert_allclose(predict(server, "first/labels/canary"), expected_mlp(13), rtol=1e-5)
        np.testing.assert_allclose(predict(server, "first/labels/stable"), expected_mlp(11), rtol=1e-5)
        np.testing.assert_allclose(mlp_output(client, "second"), expected_mlp(22), rtol=1e-5)
        assert http_request(server, "POST", "/v2/repository/models/gamma/load").status != 200

        config.write_text(FIRST_ONLY)
        wait_for(lambda: versions(client) == {"first": ["3"]})
        np.testing.assert_allclose(mlp_output(client, "first"), expected_mlp(13), rtol=1e-5)
        gone = http_request(server, "POST", "/v1/models/first/labels/canary:predict", orjson.dumps({"instances": [X]}))
        assert gone.status == 400  # its labels went with the old entry

        config.write_text("model_config_list { config { name: 'broken' } }")  # no base_path: kept as it was
        wait_for(lambda: "not followed" in server.log())
        assert versions(client) == {"first": ["3"]}


def test_following_the_config_leaves_the_repository_s_models_to_their_control_mode(
    clients: Clients, tmp_path: Path
) -> None:
    """Explicit mode: a repository model nobody loaded stays unloaded however often the config is
    followed (each follow looks at the config's models alone)."""
    mlp_model(tmp_path / "repository" / "other" / "1" / "model.onnx", seed=61)
    mlp_model(tmp_path / "bases" / "first" / "1" / "model.onnx", seed=62)
    mlp_model(tmp_path / "bases" / "second" / "1" / "model.onnx", seed=63)
    config = tmp_path / "models.config"
    entry = 'config {{ name: "{0}" base_path: "{1}" model_platform: "tensorflow" }}'
    config.write_text(f"model_config_list {{ {entry.format('first', tmp_path / 'bases' / 'first')} }}")
    flags = ("--model-control-mode", "explicit", "--model-config-file", str(config),
             "--model-config-file-poll-wait-seconds", "0.2")  # fmt: skip
    with run_server(tmp_path / "repository", tmp_path / "server.log", *flags) as server:
        client = clients.http(server.http_url)
        assert versions(client) == {"first": ["1"], "other": []}
        config.write_text(
            f"model_config_list {{ {entry.format('first', tmp_path / 'bases' / 'first')} "
            f"{entry.format('second', tmp_path / 'bases' / 'second')} }}"
        )
        wait_for(lambda: versions(client).get("second") == ["1"])  # a follow happened ...
        assert versions(client)["other"] == []  # ... and left the repository's model as it was
        np.testing.assert_allclose(mlp_output(client, "second"), expected_mlp(63), rtol=1e-5)


def test_model_name_and_base_path_serve_one_model_as_tf_serving_does(clients: Clients, tmp_path: Path) -> None:
    base = tmp_path / "models" / "resnet"
    for version in (1, 2):
        mlp_model(base / str(version) / "model.onnx", seed=40 + version)
    with run_server(None, tmp_path / "server.log", "--model-name", "resnet", "--model-base-path", str(base)) as server:
        client = clients.http(server.http_url)
        assert versions(client) == {"resnet": ["2"]}  # TF Serving's default: the latest version
        np.testing.assert_allclose(predict(server, "resnet"), expected_mlp(42), rtol=1e-5)


def test_tf_serving_s_client_reloads_the_config_with_a_management_token(
    clients: Clients,
    tmp_path: Path,
    tf_python: str,  # noqa: F811
) -> None:
    models = tmp_path / "models"
    mlp_model(models / "resnet" / "1" / "model.onnx", seed=51)
    mlp_model(models / "resnet" / "2" / "model.onnx", seed=53)
    mlp_model(models / "bert" / "7" / "model.onnx", seed=52)
    (tmp_path / "tokens").write_text("manager-token\n")
    resnet = f'config {{ name: "resnet" base_path: "{models / "resnet"}" model_platform: "tensorflow"'
    both_versions = f"model_config_list {{ {resnet} model_version_policy {{ all {{}} }} }} }}"
    with_bert = f"""model_config_list {{
      {resnet} }}
      config {{ name: "bert" base_path: "{models / "bert"}" model_platform: "tensorflow"
               version_labels {{ key: "stable" value: 7 }} }}
    }}"""
    for upload in (False, True):
        port = free_port()
        flags = ["--model-name", "resnet", "--model-base-path", str(models / "resnet"), "--tfserving-grpc-port",
                 str(port), "--management-tokens-file", str(tmp_path / "tokens")]  # fmt: skip
        with run_server(None, tmp_path / "server.log", *flags, *(["--allow-model-upload"] if upload else [])) as server:
            client = clients.http(server.http_url)
            assert versions(client) == {"resnet": ["2"]}
            token = "manager-token"
            refused, policy, added = official(tf_python, port, [
                {"call": "reload", "config": both_versions},
                {"call": "reload", "config": both_versions, "token": token},
                {"call": "reload", "config": with_bert, "token": token},
            ])  # fmt: skip
            assert refused["error"] == "UNAUTHENTICATED"
            assert policy == {"error_code": 0, "error_message": ""}  # its own models' versions: nothing more asked
            if not upload:  # a base path the server was not given holds what it would run: an upload's opt-in
                assert added["error"] == "PERMISSION_DENIED" and "--allow-model-upload" in added["details"]
                assert versions(client) == {"resnet": ["1", "2"]}
                continue
            assert added == {"error_code": 0, "error_message": ""}
            assert versions(client) == {"resnet": ["2"], "bert": ["7"]}  # served once the call answered
            np.testing.assert_allclose(predict(server, "bert/labels/stable"), expected_mlp(52), rtol=1e-5)
            nameless = "model_config_list { config { name: 'x' } }"
            (bad,) = official(tf_python, port, [{"call": "reload", "config": nameless, "token": token}])
            assert bad["error"] == "INVALID_ARGUMENT" and "'base_path' is missing" in bad["details"]


def test_a_file_that_is_not_a_model_config_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "models.config"
    config.write_text('model_config_list { config { name: "m" base_path: "/x" model_platform: "pytorch" } }')
    completed = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--model-config-file", str(config), "--http-port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode != 0
    assert "model_platform 'pytorch' is not one TF Serving serves" in completed.stderr + completed.stdout
    for flags, said in (
        (["--model-config-file-poll-wait-seconds", "5", "--model-repository", str(tmp_path)], "give that too"),
        (["--model-name", "m", "--model-repository", str(tmp_path)], "--model-name names the model of"),
        (["--model-base-path", str(tmp_path), "--model-config-file", str(config)], "give one (as TF Serving)"),
    ):
        usage = subprocess.run([sys.executable, "-m", "inferd", "serve", *flags], capture_output=True, text=True,
                               timeout=60)  # fmt: skip
        assert usage.returncode == 2 and said in usage.stderr, usage.stderr

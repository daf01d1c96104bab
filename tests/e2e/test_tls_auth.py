"""TLS, mutual TLS and tokens against a real `inferd serve`, with Triton's own clients over HTTPS and
gRPC with SSL credentials: every port speaks TLS, client certificates are asked for when a client CA
is given, and every state-changing route and method asks for a management token (401 without one,
403 with an inference token) while health stays open."""

from __future__ import annotations

import http.client
import json
import os
import queue
import ssl
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
import trustme
from tritonclient.utils import InferenceServerException

from inferd.client import NO_RETRIES, Client, ClientTls
from inferd.errors import PermissionDeniedError, UnauthenticatedError
from inferd.testing.models import mlp_model
from inferd.testing.models import write_config as write_model_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import http_request

pytestmark = pytest.mark.e2e
X = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16)
MANAGEMENT_TOKEN = "mgmt-" + uuid.uuid4().hex
INFERENCE_TOKEN = "infer-" + uuid.uuid4().hex


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    # A client certificate from a CA the server does not trust.
    stranger_cert: Path
    stranger_key: Path

    def client_context(self, with_certificate: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if with_certificate:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca, stranger_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@example.com")
    stranger = stranger_ca.issue_cert("stranger@example.com")
    paths = {
        "ca": folder / "ca.pem",
        "server_cert": folder / "server.pem",
        "server_key": folder / "server.key",
        "client_cert": folder / "client.pem",
        "client_key": folder / "client.key",
        "stranger_cert": folder / "stranger.pem",
        "stranger_key": folder / "stranger.key",
    }
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.private_key_pem.write_to_path(str(paths["server_key"]))
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    stranger.private_key_pem.write_to_path(str(paths["stranger_key"]))
    for name, issued in (("server_cert", server), ("client_cert", client), ("stranger_cert", stranger)):
        for blob in issued.cert_chain_pems:
            blob.write_to_path(str(paths[name]), append=True)
    return Pki(**paths)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    for name in ("mlp", "spare"):
        mlp_model(root / name / "1" / "model.onnx", seed=2)
        write_model_config(root / name, "max_batch_size: 8")
    return root


def _tls_args(pki: Pki, mutual: bool) -> tuple[str, ...]:
    args = ("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key))
    return (*args, "--tls-client-ca", str(pki.ca)) if mutual else args


@pytest.fixture(scope="module")
def tls_server(repository: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "tls.log"
    with run_server(repository, log, *_tls_args(pki, False), tls=pki.client_context()) as server:
        yield server


@pytest.fixture(scope="module")
def mtls_server(repository: Path, pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "mtls.log"
    with run_server(repository, log, *_tls_args(pki, True), tls=pki.client_context(with_certificate=True)) as server:
        yield server


def _http_infer(client: httpclient.InferenceServerClient, **kwargs: object) -> np.ndarray:
    infer_input = httpclient.InferInput("x", list(X.shape), "FP32")
    infer_input.set_data_from_numpy(X, binary_data=True)
    result = client.infer("mlp", [infer_input], **kwargs)  # type: ignore[arg-type]
    return result.as_numpy("y")


def _grpc_infer(client: grpcclient.InferenceServerClient, **kwargs: object) -> np.ndarray:
    infer_input = grpcclient.InferInput("x", list(X.shape), "FP32")
    infer_input.set_data_from_numpy(X)
    return client.infer("mlp", [infer_input], **kwargs).as_numpy("y")  # type: ignore[arg-type]


def test_tls_serves_tritonclient_over_https_and_grpc_and_metrics_too(tls_server: ServerProcess, pki: Pki) -> None:
    https = httpclient.InferenceServerClient(tls_server.http_url, ssl=True, ssl_options={"ca_certs": str(pki.ca)})
    try:
        assert https.is_server_ready()
        over_https = _http_infer(https)
    finally:
        https.close()
    with grpcclient.InferenceServerClient(tls_server.grpc_url, ssl=True, root_certificates=str(pki.ca)) as secure_grpc:
        over_grpc = _grpc_infer(secure_grpc)
    assert over_https.shape == (2, 4)
    np.testing.assert_array_equal(over_https, over_grpc)
    url = f"https://127.0.0.1:{tls_server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10, context=pki.client_context()) as response:
        assert response.status == 200
        assert b"inferd_" in response.read()
    # Plain HTTP on the TLS port gets no HTTP answer; a client that trusts another CA is refused.
    plain = http.client.HTTPConnection("127.0.0.1", tls_server.http_port, timeout=10)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain.request("GET", "/v2/health/ready")
        plain.getresponse()
    plain.close()
    untrusting = ssl.create_default_context()
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(
            f"https://127.0.0.1:{tls_server.http_port}/v2/health/ready", timeout=10, context=untrusting
        )


def test_mutual_tls_serves_clients_with_certificates_and_refuses_the_rest(mtls_server: ServerProcess, pki: Pki) -> None:
    options = {"ca_certs": str(pki.ca), "certfile": str(pki.client_cert), "keyfile": str(pki.client_key)}
    https = httpclient.InferenceServerClient(mtls_server.http_url, ssl=True, ssl_options=options)
    try:
        assert _http_infer(https).shape == (2, 4)
    finally:
        https.close()
    with grpcclient.InferenceServerClient(
        mtls_server.grpc_url,
        ssl=True,
        root_certificates=str(pki.ca),
        private_key=str(pki.client_key),
        certificate_chain=str(pki.client_cert),
    ) as secure_grpc:
        assert _grpc_infer(secure_grpc).shape == (2, 4)
    metrics = f"https://127.0.0.1:{mtls_server.metrics_port}/metrics"
    with urllib.request.urlopen(metrics, timeout=10, context=pki.client_context(with_certificate=True)) as response:
        assert response.status == 200

    # Without a certificate, or with one from a CA the server does not trust: refused in the handshake.
    stranger = pki.client_context()
    stranger.load_cert_chain(pki.stranger_cert, pki.stranger_key)
    for context in (pki.client_context(), stranger):
        for port in (mtls_server.http_port, mtls_server.metrics_port):
            with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
                urllib.request.urlopen(f"https://127.0.0.1:{port}/v2/health/ready", timeout=10, context=context)
    with (
        grpcclient.InferenceServerClient(mtls_server.grpc_url, ssl=True, root_certificates=str(pki.ca)) as no_cert,
        pytest.raises(InferenceServerException, match="UNAVAILABLE"),
    ):
        no_cert.is_server_live(client_timeout=5)
    assert mtls_server.process.poll() is None


def test_tls_flags_must_come_together(repository: Path, pki: Pki) -> None:
    command = [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository)]
    result = subprocess.run(
        [*command, "--tls-cert", str(pki.server_cert)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert "--tls-cert and --tls-key go together" in result.stderr
    result = subprocess.run(
        [*command, "--tls-client-ca", str(pki.ca)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert "--tls-client-ca needs --tls-cert" in result.stderr


# -- tokens --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("tokens")
    tokens = folder / "management.tokens"
    tokens.write_text(f"# rotated monthly\n\n{MANAGEMENT_TOKEN}\nmgmt-previous\n", encoding="utf-8")
    with run_server(
        repository,
        folder / "server.log",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "mlp",
        "--management-tokens-file",
        str(tokens),
        env={"INFERD_INFERENCE_TOKENS": f"{INFERENCE_TOKEN}, infer-other"},
    ) as server:
        yield server


def _request(
    server: ServerProcess, method: str, path: str, token: str | None, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """conftest's http_request, with the token as a bearer (none when None)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    reply = http_request(server, method, path, body or None, headers)
    return reply.status, reply.headers, reply.body


_SHM_KEY = f"/inferd_auth_{uuid.uuid4().hex[:8]}"
# Every state-changing REST route, as (method, path, body).
MANAGEMENT_ROUTES = [
    ("POST", "/v2/repository/models/spare/load", b""),
    ("POST", "/v2/repository/models/spare/unload", b""),
    ("POST", "/v2/systemsharedmemory/region/auth/register", f'{{"key": "{_SHM_KEY}", "byte_size": 64}}'.encode()),
    ("POST", "/v2/systemsharedmemory/region/auth/unregister", b""),
    ("POST", "/v2/systemsharedmemory/unregister", b""),
    ("POST", "/v2/cudasharedmemory/region/auth/unregister", b""),
    ("POST", "/v2/cudasharedmemory/unregister", b""),
]


@pytest.mark.parametrize(("method", "path", "body"), MANAGEMENT_ROUTES, ids=[r[1] for r in MANAGEMENT_ROUTES])
def test_every_management_route_needs_a_management_token(
    token_server: ServerProcess, method: str, path: str, body: bytes
) -> None:
    region = shm.create_shared_memory_region("auth", _SHM_KEY, 64)
    try:
        status, headers, answer = _request(token_server, method, path, None, body)
        assert status == 401, answer
        assert headers["www-authenticate"] == 'Bearer realm="inferd"'
        assert b"Authorization: Bearer TOKEN" in answer and b'"code":"UNAUTHENTICATED"' in answer
        status, _, answer = _request(token_server, method, path, "not-a-token", body)
        assert status == 401 and b"not known" in answer
        status, _, answer = _request(token_server, method, path, INFERENCE_TOKEN, body)
        assert status == 403 and b"use a management token" in answer and b'"code":"PERMISSION_DENIED"' in answer
        status, _, answer = _request(token_server, method, path, MANAGEMENT_TOKEN, body)
        assert status == 200, answer
        # The file's other token too (a second register of one region is the 409 it always is).
        assert _request(token_server, method, path, "mgmt-previous", body)[0] in (200, 409)
    finally:
        shm.destroy_shared_memory_region(region)


def test_cuda_shared_memory_registration_needs_a_management_token_before_it_is_refused(
    token_server: ServerProcess,
) -> None:
    path = "/v2/cudasharedmemory/region/gpu/register"
    body = b'{"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 64}'
    assert _request(token_server, "POST", path, None, body)[0] == 401
    assert _request(token_server, "POST", path, INFERENCE_TOKEN, body)[0] == 403
    status, _, answer = _request(token_server, "POST", path, MANAGEMENT_TOKEN, body)
    assert status == 400 and b"GPUs not supported" in answer
    user = {"authorization": f"Bearer {INFERENCE_TOKEN}"}
    admin = {"authorization": f"Bearer {MANAGEMENT_TOKEN}"}
    with grpcclient.InferenceServerClient(token_server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as denied:
            client.register_cuda_shared_memory("gpu", b"", 0, 64, headers=user)
        assert denied.value.status() == "StatusCode.PERMISSION_DENIED"
        with pytest.raises(InferenceServerException) as refused:
            client.register_cuda_shared_memory("gpu", b"", 0, 64, headers=admin)
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT" and "GPUs not supported" in str(refused.value)
        # Reading the (empty) status is not management, as the system regions' is not.
        assert len(client.get_cuda_shared_memory_status(headers=user).regions) == 0


def test_the_data_plane_takes_either_token_and_health_takes_none(token_server: ServerProcess) -> None:
    body = (
        b'{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": ['
        + b",".join([b"0.5"] * 16)
        + b"]}]}"
    )
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/mlp/ready"):
        assert _request(token_server, "GET", path, None)[0] == 200
    for method, path, payload in (("GET", "/v2/models/mlp", b""), ("POST", "/v2/models/mlp/infer", body),
                                  ("POST", "/invocations", body), ("GET", "/openai/v1/models", b"")):  # fmt: skip
        status, headers, _ = _request(token_server, method, path, None, payload)
        assert status == 401 and "www-authenticate" in headers, path
        assert _request(token_server, method, path, "infer-wrong", payload)[0] == 401
        for token in (INFERENCE_TOKEN, "infer-other", MANAGEMENT_TOKEN):
            status, _, answer = _request(token_server, method, path, token, payload)
            assert status == 200, (path, answer)
    # The scheme is case-insensitive (RFC 9110); a token under another scheme is not a bearer token.
    connection = http.client.HTTPConnection("127.0.0.1", token_server.http_port, timeout=30)
    try:
        connection.request("GET", "/v2/models/mlp", headers={"Authorization": f"bearer {INFERENCE_TOKEN}"})
        response = connection.getresponse()
        assert response.status == 200 and response.read()
        connection.request("GET", "/v2/models/mlp", headers={"Authorization": f"Basic {INFERENCE_TOKEN}"})
        assert connection.getresponse().status == 401
    finally:
        connection.close()


def test_grpc_methods_ask_for_the_same_tokens(token_server: ServerProcess) -> None:
    def bearer(token: str) -> dict[str, str]:
        return {"authorization": f"Bearer {token}"}

    with grpcclient.InferenceServerClient(token_server.grpc_url) as client:
        assert client.is_server_ready()  # health: no token
        with pytest.raises(InferenceServerException) as refused:
            _grpc_infer(client)
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        assert _grpc_infer(client, headers=bearer(INFERENCE_TOKEN)).shape == (2, 4)
        assert _grpc_infer(client, headers=bearer(MANAGEMENT_TOKEN)).shape == (2, 4)
        region = shm.create_shared_memory_region("grpc_auth", _SHM_KEY + "g", 64)
        try:
            calls = [
                lambda h: client.load_model("spare", headers=h),
                lambda h: client.unload_model("spare", headers=h),
                lambda h: client.register_system_shared_memory("grpc_auth", _SHM_KEY + "g", 64, headers=h),
                lambda h: client.unregister_system_shared_memory("grpc_auth", headers=h),
                lambda h: client.unregister_cuda_shared_memory(headers=h),
            ]
            for call in calls:
                for headers, status in ((None, "UNAUTHENTICATED"), (bearer("nope"), "UNAUTHENTICATED"),
                                        (bearer(INFERENCE_TOKEN), "PERMISSION_DENIED")):  # fmt: skip
                    with pytest.raises(InferenceServerException) as denied:
                        call(headers)
                    assert denied.value.status() == f"StatusCode.{status}"
                call(bearer(MANAGEMENT_TOKEN))
        finally:
            shm.destroy_shared_memory_region(region)
        # The streaming method is checked too (the interceptor answers every kind of call).
        errors: queue.Queue[InferenceServerException] = queue.Queue()
        client.start_stream(callback=lambda result, error: errors.put(error))
        assert "UNAUTHENTICATED" in str(errors.get(timeout=30))  # refused as the call starts
        client.stop_stream()


def test_tokens_never_reach_the_log(token_server: ServerProcess) -> None:
    _request(token_server, "POST", "/v2/repository/models/spare/load", INFERENCE_TOKEN)
    _request(token_server, "GET", "/v2/models/mlp", "a-wrong-token-xyz")
    log = token_server.log()
    assert "tokens: 2 for the management API, 2 for the data plane" in log
    for secret in (MANAGEMENT_TOKEN, INFERENCE_TOKEN, "a-wrong-token-xyz", "mgmt-previous"):
        assert secret not in log


def test_inferds_own_client_speaks_tls_and_sends_tokens(
    mtls_server: ServerProcess, token_server: ServerProcess, pki: Pki
) -> None:
    tls = ClientTls(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    for url in (f"https://{mtls_server.http_url}", f"grpcs://{mtls_server.grpc_url}"):
        with Client(url, tls=tls, timeout_s=20) as client:
            assert client.infer("mlp", {"x": X}).as_numpy("y").shape == (2, 4), url
    for url in (f"http://{token_server.http_url}", f"grpc://{token_server.grpc_url}"):
        with Client(url, timeout_s=20, retry=NO_RETRIES) as anonymous:
            with pytest.raises(UnauthenticatedError):
                anonymous.infer("mlp", {"x": X})
            assert anonymous.server_ready()
        with Client(url, token=INFERENCE_TOKEN, timeout_s=20) as user:
            assert user.infer("mlp", {"x": X}).as_numpy("y").shape == (2, 4)
            with pytest.raises(PermissionDeniedError):
                user.unload_model("spare")
        with Client(url, token=MANAGEMENT_TOKEN, timeout_s=60) as admin:
            admin.load_model("spare")
            admin.unload_model("spare")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "inferd", *args], capture_output=True, text=True, timeout=120)


def test_the_cli_reaches_servers_behind_tls_and_tokens(
    mtls_server: ServerProcess, token_server: ServerProcess, pki: Pki
) -> None:
    """`inferd health` and `inferd perf` take the CA, the client certificate and a token."""
    certificates = (
        "--ca-cert",
        str(pki.ca),
        "--client-cert",
        str(pki.client_cert),
        "--client-key",
        str(pki.client_key),
    )
    https = f"https://{mtls_server.http_url}"
    assert _cli("health", "--url", https, *certificates).returncode == 0
    refused = _cli("health", "--url", https, "--ca-cert", str(pki.ca))  # no client certificate
    assert refused.returncode == 1 and "not ready" in refused.stderr
    assert _cli("health", "--url", https, "--client-cert", str(pki.client_cert)).returncode == 2  # no key: usage
    short = ("--concurrency", "1", "-p", "300", "-r", "2", "--output", "json")
    for url in (https, f"grpcs://{mtls_server.grpc_url}"):
        measured = _cli("perf", "-m", "mlp", "-u", url, *certificates, *short)
        assert measured.returncode == 0, measured.stderr
        assert json.loads(measured.stdout)["client_requests"] > 0
    url = f"http://{token_server.http_url}"
    anonymous = _cli("perf", "-m", "mlp", "-u", url, *short)
    assert anonymous.returncode == 1 and "needs a token" in anonymous.stderr
    with_token = subprocess.run(
        [sys.executable, "-m", "inferd", "perf", "-m", "mlp", "-u", url, *short],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "INFERD_TOKEN": INFERENCE_TOKEN},
    )
    assert with_token.returncode == 0, with_token.stderr
    assert json.loads(with_token.stdout)["client_errors"] == {}

"""Async inference through the public interface, on real subprocess servers: submits answered 202,
one result per job (as the real-time call answers), failure documents for inputs the model
refuses, locations outside the roots refused, idempotent ids, cancel, the list, signed webhook
notices, and exactly one result per job across two `kill -9`s (local files, and S3 through moto's
server, whose object versions prove each was written once), and boto3's invoke_endpoint_async."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from inferd.testing.models import misbehaving_model, mlp_model, write_config
from inferd.testing.redis_server import run_redis
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.conftest import http_request
from tests.e2e.test_observability import scrape
from tests.e2e.test_remote_repository import BUCKET
from tests.e2e.test_remote_repository import s3 as s3  # the fixture
from tests.e2e.test_sagemaker import runtime

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

SECRET = b"a shared secret"


def body(values: list[float]) -> bytes:
    return json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": values}]}).encode()


class Receiver:
    """A webhook on 127.0.0.1 that keeps every notice: its idempotency key, signature and body."""

    def __init__(self) -> None:
        self.notices: list[tuple[str, str, bytes]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                payload = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    key = self.headers["Inferd-Idempotency-Key"]
                    receiver.notices.append((key, self.headers.get("Inferd-Signature", ""), payload))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notices"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def keys(self) -> set[str]:
        with self.lock:
            return {key for key, _, _ in self.notices}

    def wait_for(self, keys: set[str], timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not keys <= self.keys():
            assert time.monotonic() < deadline, f"{len(keys - self.keys())} notices never came"
            time.sleep(0.05)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("async") / "repository"
    misbehaving_model(root / "picky", fail_negative=1)
    write_config(
        root / "chain",
        """
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [ {
          model_name: "picky" model_version: -1
          input_map { key: "x" value: "x" }
          output_map { key: "y" value: "y" }
        } ] }
        """,
    )
    (root / "mlp" / "1").mkdir(parents=True)
    mlp_model(root / "mlp" / "1" / "model.onnx")
    write_config(root / "mlp", "max_batch_size: 8\ndynamic_batching { }")
    return root


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inputs")


@pytest.fixture(scope="module")
def server(
    repository: Path, inputs: Path, receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("server")
    (folder / "secret").write_bytes(SECRET + b"\n")
    arguments = ("--state-dir", str(folder / "state"), "--async-input-root", str(inputs),
                 "--async-webhook", receiver.url, "--async-webhook-secret-file", str(folder / "secret"))  # fmt: skip
    with run_server(repository, folder / "server.log", *arguments) as server:
        yield server


def submit(server: ServerProcess, model: str, payload: bytes, query: str = "") -> dict[str, Any]:
    reply = http_request(server, "POST", f"/v2/models/{model}/infer_async{query}", payload)
    assert reply.status == 202, reply.body
    document: dict[str, Any] = json.loads(reply.body)
    assert reply.headers["location"] == document["status_url"]
    return document


def wait(server: ServerProcess, job_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while True:
        reply = http_request(server, "GET", f"/v2/async/{job_id}?wait_s=10")
        assert reply.status == 200, reply.body
        document: dict[str, Any] = json.loads(reply.body)
        if document["state"] not in ("queued", "running"):
            return document
        assert time.monotonic() < deadline, document


def local(location: str) -> Path:
    assert location.startswith("file://"), location
    return Path(location.removeprefix("file://"))


def versions_of(s3: Any, prefix: str) -> dict[str, int]:
    """How many versions the (versioned) bucket keeps of each object under `prefix`."""
    versions: dict[str, int] = {}
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=BUCKET, Prefix=prefix):
        for version in page.get("Versions", []):
            versions[version["Key"]] = versions.get(version["Key"], 0) + 1
    return versions


def kill_twice_then_wait(
    start: Callable[[int], Any],
    submit_all: Callable[[ServerProcess], None],
    progressed: Callable[[ServerProcess, int], bool],
    ids: list[str],
    receiver: Receiver,
) -> dict[str, dict[str, Any]]:
    """Three runs of a server (`start(run)`): the first takes the jobs (`submit_all`), the first two
    are killed with `kill -9` once `progressed(server, run)`, the third runs what is left. Each
    job's end, once every one has ended and its notice has come (those owed when a server died
    are sent after its restart; repeats carry the same key)."""
    for run in range(3):
        with start(run) as server:
            if run == 0:
                submit_all(server)
            if run < 2:
                deadline = time.monotonic() + 120
                while not progressed(server, run):
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
                server.process.send_signal(signal.SIGKILL)
                server.process.wait(timeout=30)
                continue
            ended = {job_id: wait(server, job_id) for job_id in ids}
            receiver.wait_for(set(ids))
    return ended


def test_a_job_is_answered_at_once_and_its_result_is_the_real_time_answer(server: ServerProcess) -> None:
    payload = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 16], "data": [0.25] * 32}]}
    ).encode()
    accepted = submit(server, "mlp", payload)
    assert accepted["state"] == "queued" and accepted["created"] is True
    assert accepted["output_location"].endswith(f"/{accepted['inference_id']}.out")
    ended = wait(server, accepted["inference_id"])
    assert ended["state"] == "succeeded" and ended["attempts"] == 1, ended
    result = json.loads(local(ended["output_location"]).read_bytes())
    real_time = json.loads(http_request(server, "POST", "/v2/models/mlp/infer", payload).body)
    assert result["outputs"] == real_time["outputs"]


def test_a_job_of_an_ensemble_runs_through_its_steps(server: ServerProcess) -> None:
    accepted = submit(server, "chain", body([4.0, 3.0, 2.0, 1.0]))
    ended = wait(server, accepted["inference_id"])
    assert ended["state"] == "succeeded", ended
    result = json.loads(local(ended["output_location"]).read_bytes())
    real_time = json.loads(http_request(server, "POST", "/v2/models/chain/infer", body([4.0, 3.0, 2.0, 1.0])).body)
    assert result["outputs"] == real_time["outputs"]


def test_jobs_the_model_refuses_fail_with_a_document_and_the_rest_succeed_each_told_once(
    server: ServerProcess, receiver: Receiver
) -> None:
    ids = {}
    for index in range(24):
        values = [-1.0, 0.0, 0.0, 0.0] if index % 4 == 0 else [float(index), 0.0, 0.0, 0.0]
        ids[submit(server, "picky", body(values))["inference_id"]] = index % 4 == 0
    ended = {job_id: wait(server, job_id) for job_id in ids}
    for job_id, refused in ids.items():
        document = ended[job_id]
        if refused:
            assert document["state"] == "failed" and document["error_code"] == "MODEL_RAISED", document
            failure = json.loads(local(document["failure_location"]).read_bytes())
            assert "refuses negative values" in failure["error"] and failure["inference_id"] == job_id
            assert not local(document["output_location"]).exists()
        else:
            assert document["state"] == "succeeded", document
    receiver.wait_for(set(ids))
    with receiver.lock:
        notices = [(key, sign, payload) for key, sign, payload in receiver.notices if key in ids]
    assert sorted(key for key, _, _ in notices) == sorted(ids)  # one each: nothing failed to deliver
    for key, sign, payload in notices:
        stamp, digest = (part.split("=", 1)[1] for part in sign.split(","))
        expected = hmac.new(SECRET, stamp.encode() + b"." + payload, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(digest, expected)
        notice = json.loads(payload)
        assert notice["inference_id"] == key and notice["state"] == ("failed" if ids[key] else "succeeded")


def test_input_locations_must_lie_under_a_root(server: ServerProcess, inputs: Path, tmp_path: Path) -> None:
    (inputs / "rows.json").write_bytes(body([1.0, 2.0, 3.0, 4.0]))
    accepted = submit(server, "picky", json.dumps({"input_location": (inputs / "rows.json").as_uri()}).encode())
    ended = wait(server, accepted["inference_id"])
    assert json.loads(local(ended["output_location"]).read_bytes())["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
    (tmp_path / "private.json").write_bytes(body([1.0, 2.0, 3.0, 4.0]))
    for location in ((tmp_path / "private.json").as_uri(), "file:///etc/passwd", f"{inputs.as_uri()}/../x",
                     "http://169.254.169.254/latest/meta-data/", "s3://someone-elses/key"):  # fmt: skip
        reply = http_request(server, "POST", "/v2/models/picky/infer_async",
                             json.dumps({"input_location": location}).encode())  # fmt: skip
        assert reply.status == 403 and b"--async-input-root" in reply.body, (location, reply.body)
    for bad in ("../../models/picky/1/model.py", "a%2Fb", ".x"):
        reply = http_request(server, "POST", f"/v2/models/picky/infer_async?inference_id={bad}", body([1.0] * 4))
        assert reply.status == 400, (bad, reply.body)
    assert http_request(server, "POST", "/v2/models/nobody/infer_async", body([1.0] * 4)).status == 404
    unknown_field = http_request(server, "POST", "/v2/models/picky/infer_async",
                                 json.dumps({"input_location": "file:///x", "ttl": 5}).encode())  # fmt: skip
    assert unknown_field.status == 400 and b"ttl" in unknown_field.body


def test_the_same_inference_id_is_one_job_and_jobs_are_listed_and_cancelled(server: ServerProcess) -> None:
    first = submit(server, "picky", body([1.0] * 4), "?inference_id=order-17&priority=3&ttl_s=600")
    again = submit(server, "picky", body([2.0] * 4), "?inference_id=order-17")
    assert first["created"] is True and again["created"] is False
    ended = wait(server, "order-17")
    assert json.loads(local(ended["output_location"]).read_bytes())["outputs"][0]["data"] == [1.0] * 4
    assert ended["priority"] == 3 and ended["ttl_s"] == 600
    listed = json.loads(http_request(server, "GET", "/v2/async?model=picky&state=succeeded&limit=1000").body)
    assert "order-17" in [job["inference_id"] for job in listed["jobs"]]
    assert all(job["state"] == "succeeded" for job in listed["jobs"])
    refused = http_request(server, "DELETE", "/v2/async/order-17")
    assert refused.status == 409 and b"only a queued job" in refused.body
    assert http_request(server, "GET", "/v2/async/nobody").status == 404


def test_a_queued_job_is_cancelled(repository: Path, tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    misbehaving_model(tmp_path / "repository" / "held", hold_file=hold)
    arguments = ("--state-dir", str(tmp_path / "state"), "--async-concurrency", "1")
    with run_server(tmp_path / "repository", tmp_path / "server.log", *arguments) as server:
        hold.touch()  # once loaded (its warm-up would wait too)
        running = submit(server, "held", body([1.0] * 4))
        queued = submit(server, "held", body([2.0] * 4))
        deadline = time.monotonic() + 30
        while (
            json.loads(http_request(server, "GET", f"/v2/async/{running['inference_id']}").body)["state"] != "running"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        cancelled = http_request(server, "DELETE", f"/v2/async/{queued['inference_id']}")
        assert cancelled.status == 200 and json.loads(cancelled.body)["state"] == "cancelled"
        assert http_request(server, "DELETE", f"/v2/async/{running['inference_id']}").status == 409
        deadline = time.monotonic() + 30  # the backlog is counted every second
        while 'inferd_async_backlog{model="held"} 1.0' not in scrape(server):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        hold.unlink()
        assert wait(server, running["inference_id"])["state"] == "succeeded"
        assert wait(server, queued["inference_id"])["state"] == "cancelled"


def test_the_client_and_the_cli_submit_wait_and_list(server: ServerProcess, inputs: Path, tmp_path: Path) -> None:
    import numpy as np

    from inferd.client import Client

    with Client(f"http://{server.http_url}") as client:
        job = client.submit_async("picky", {"x": np.array([[1, 2, 3, 4]], dtype=np.float32)}, inference_id="client-1")
        assert job.state == "queued" and job.created
        ended = client.wait_async("client-1", timeout_s=60)
        assert ended.state == "succeeded" and ended.output_location == job.output_location
        (inputs / "client.json").write_bytes(body([5.0, 6.0, 7.0, 8.0]))
        located = client.submit_async("picky", input_location=(inputs / "client.json").as_uri())
        assert client.wait_async(located.inference_id, timeout_s=60).state == "succeeded"
        refused = client.submit_async("picky", {"x": np.array([[-1, 0, 0, 0]], dtype=np.float32)})
        failed = client.wait_async(refused.inference_id, timeout_s=60)
        assert failed.state == "failed" and failed.error_code == "MODEL_RAISED"
        assert "client-1" in [j.inference_id for j in client.list_async(model="picky", state="succeeded", limit=1000)]

    def inferd(*arguments: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "inferd", "async", *arguments, "--url", f"http://{server.http_url}"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip

    (tmp_path / "request.json").write_bytes(body([9.0, 8.0, 7.0, 6.0]))
    submitted = inferd("submit", "picky", str(tmp_path / "request.json"), "--inference-id", "cli-1", "--wait")
    assert submitted.returncode == 0, submitted.stderr
    assert "cli-1: succeeded" in submitted.stdout and "cli-1.out" in submitted.stdout
    assert "cli-1: succeeded" in inferd("status", "cli-1").stdout
    listed = inferd("list", "--model", "picky", "--state", "succeeded", "--limit", "1000")
    assert listed.returncode == 0 and "cli-1" in listed.stdout
    (tmp_path / "negative.json").write_bytes(body([-9.0, 8.0, 7.0, 6.0]))
    inferd("submit", "picky", str(tmp_path / "negative.json"), "--inference-id", "cli-2")
    waited = inferd("wait", "cli-2", "--timeout", "60")
    assert waited.returncode == 1 and "MODEL_RAISED" in waited.stdout and "refuses negative values" in waited.stdout
    cancelled = inferd("cancel", "cli-1")
    assert cancelled.returncode == 1 and "only a queued job can be cancelled" in cancelled.stderr


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_512_mb_body_goes_to_disk_as_it_arrives(tmp_path: Path) -> None:
    """The server's RSS, sampled while a 512 MB submit streams in, grows by less than 64 MB; the
    body is kept whole, byte for byte, as the job's payload."""
    hold = tmp_path / "hold"
    misbehaving_model(tmp_path / "repository" / "held", hold_file=hold)
    state = tmp_path / "state"
    arguments = ("--state-dir", str(state), "--async-concurrency", "1", "--max-request-bytes", "1048576",
                 "--max-async-request-bytes", "600MiB")  # fmt: skip
    with run_server(tmp_path / "repository", tmp_path / "server.log", *arguments) as server:
        hold.touch()
        busy = submit(server, "held", body([1.0] * 4))  # holds the only worker: the big job waits
        rows = 512 * 1024 * 1024 // 16
        header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4],
                                         "parameters": {"binary_data_size": rows * 16}}]}).encode()  # fmt: skip
        chunk = b"\0" * (1 << 20)
        before = rss_bytes(server.process.pid)
        peak, done = [before], threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], rss_bytes(server.process.pid))
                time.sleep(0.01)

        sampler = threading.Thread(target=sample)
        sampler.start()
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=120)
        try:
            connection.putrequest("POST", "/v2/models/held/infer_async?inference_id=big")
            connection.putheader("Content-Type", "application/octet-stream")
            connection.putheader("Inference-Header-Content-Length", str(len(header)))
            connection.putheader("Content-Length", str(len(header) + rows * 16))
            connection.endheaders()
            connection.send(header)
            for _ in range(rows * 16 // len(chunk)):
                connection.send(chunk)
            response = connection.getresponse()
            answer = json.loads(response.read())
        finally:
            done.set()
            sampler.join()
            connection.close()
        assert response.status == 202, answer
        assert peak[0] - before < 64 * 1024 * 1024, f"RSS grew by {(peak[0] - before) >> 20} MB"
        payload = state / "async" / "payloads" / "big.in"
        assert payload.stat().st_size == len(header) + rows * 16
        assert not list((state / "async" / "spool").iterdir())  # the spooled body became the payload
        cut = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        cut.putrequest("POST", "/v2/models/held/infer_async")
        cut.putheader("Content-Length", str(10 << 20))
        cut.endheaders()
        cut.send(chunk)  # a tenth of it, then the client is gone
        deadline = time.monotonic() + 30
        while not list((state / "async" / "spool").iterdir()):  # being written...
            assert time.monotonic() < deadline
            time.sleep(0.01)
        cut.close()
        while list((state / "async" / "spool").iterdir()):  # ...and removed with the connection
            assert time.monotonic() < deadline, "a body cut off midway was left on disk"
            time.sleep(0.01)
        too_big = http_request(server, "POST", "/v2/models/held/infer", b"x" * 2_000_000)
        assert too_big.status == 413 and b"--max-request-bytes" in too_big.body  # other routes keep theirs
        huge = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
        huge.putrequest("POST", "/v2/models/held/infer_async")
        huge.putheader("Content-Length", str(700 << 20))  # refused by its declared length
        huge.endheaders()
        refused = huge.getresponse()
        assert refused.status == 413 and b"(--max-async-request-bytes)" in refused.read()
        huge.close()
        assert http_request(server, "DELETE", "/v2/async/big").status == 200
        assert not payload.exists()  # a cancelled job's body is not kept
        hold.unlink()
        assert wait(server, busy["inference_id"])["state"] == "succeeded"


def test_a_job_loads_its_model_when_it_is_not_loaded(repository: Path, tmp_path: Path) -> None:
    arguments = ("--model-control-mode", "explicit", "--state-dir", str(tmp_path / "state"))
    with run_server(repository, tmp_path / "server.log", *arguments) as server:
        assert http_request(server, "GET", "/v2/models/picky/ready").status != 200
        accepted = submit(server, "picky", body([1.0, 2.0, 3.0, 4.0]))
        assert wait(server, accepted["inference_id"])["state"] == "succeeded"
        assert http_request(server, "GET", "/v2/models/picky/ready").status == 200
        assert "loading model 'picky' for a job" in server.log()
        assert http_request(server, "POST", "/v2/models/nowhere/infer_async", body([1.0] * 4)).status == 404


def test_async_is_off_without_a_state_directory(repository: Path, tmp_path: Path) -> None:
    with run_server(repository, tmp_path / "server.log") as server:
        reply = http_request(server, "POST", "/v2/models/picky/infer_async", body([1.0] * 4))
        assert reply.status == 503 and b"--state-dir" in reply.body


def test_two_kill_9s_leave_exactly_one_result_per_job(repository: Path, tmp_path: Path, receiver: Receiver) -> None:
    """200 jobs of a model that sleeps 20 ms a batch; the server killed twice while they run."""
    misbehaving_model(tmp_path / "repository" / "slow", sleep_ms=20)
    state = tmp_path / "state"
    arguments = ("--state-dir", str(state), "--async-webhook", receiver.url, "--async-concurrency", "4")
    ids: list[str] = []
    results = state / "async" / "results"

    def submit_all(server: ServerProcess) -> None:
        ids.extend(submit(server, "slow", body([float(i), 0, 0, 0]))["inference_id"] for i in range(200))

    ended = kill_twice_then_wait(
        lambda run: run_server(tmp_path / "repository", tmp_path / f"server{run}.log", *arguments),
        submit_all,
        lambda _, run: len(list(results.glob("*.out"))) >= 40 * (run + 1),
        ids,
        receiver,
    )
    assert {document["state"] for document in ended.values()} == {"succeeded"}
    for index, job_id in enumerate(ids):
        result = json.loads(local(ended[job_id]["output_location"]).read_bytes())
        assert result["outputs"][0]["data"] == [float(index), 0, 0, 0]
    outputs = state / "async" / "results"
    assert sorted(p.name for p in outputs.iterdir()) == sorted(f"{job_id}.out" for job_id in ids)
    assert any(document["attempts"] > 1 for document in ended.values())  # some did run again


def test_1000_s3_jobs_through_two_kill_9s_leave_one_result_each_written_once(
    repository: Path, s3: Any, tmp_path: Path, receiver: Receiver
) -> None:
    """The bucket keeps every version of every object: one version per result proves that no job's
    result was written twice, though some jobs ran twice."""
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    for index in range(1000):
        s3.put_object(Bucket=BUCKET, Key=f"in/{index}.json", Body=body([float(index), 1.0, 2.0, 3.0]))
    arguments = ("--state-dir", str(tmp_path / "state"), "--async-input-root", f"s3://{BUCKET}/in",
                 "--async-output-path", f"s3://{BUCKET}/out", "--async-webhook", receiver.url)  # fmt: skip
    ids = [f"s3-job-{index}" for index in range(1000)]

    def submit_all(server: ServerProcess) -> None:
        for index, job_id in enumerate(ids):
            location = json.dumps({"input_location": f"s3://{BUCKET}/in/{index}.json"}).encode()
            submit(server, "picky", location, f"?inference_id={job_id}")

    def progressed(server: ServerProcess, run: int) -> bool:  # a third (then two thirds) of the jobs ended
        listed = json.loads(http_request(server, "GET", "/v2/async?state=succeeded&limit=1000").body)
        return len(listed["jobs"]) >= 300 * (run + 1)

    ended = kill_twice_then_wait(
        lambda run: run_server(repository, tmp_path / f"server{run}.log", *arguments),
        submit_all, progressed, ids, receiver,
    )  # fmt: skip
    assert {document["state"] for document in ended.values()} == {"succeeded"}
    assert versions_of(s3, "out/") == {f"out/{job_id}.out": 1 for job_id in ids}
    assert any(document["attempts"] > 1 for document in ended.values())  # some did run again
    for index in (0, 499, 999):
        result = json.loads(s3.get_object(Bucket=BUCKET, Key=f"out/s3-job-{index}.out")["Body"].read())
        assert result["outputs"][0]["data"] == [float(index), 1.0, 2.0, 3.0]


def test_two_servers_share_a_redis_queue_and_one_takes_over_the_jobs_of_the_other_killed(
    s3: Any, tmp_path: Path
) -> None:
    """Jobs submitted to the first server, run by both; the first killed mid-run: the second takes
    over its pending jobs once their leases run out (a job's timeout, 2 s, and as long again), and
    the bucket's versions show one result per job."""
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    misbehaving_model(tmp_path / "repository" / "slow", sleep_ms=20)
    with run_redis(tmp_path / "redis") as redis_url:
        arguments = ("--async-queue", redis_url, "--async-payload-path", f"s3://{BUCKET}/payloads",
                     "--async-output-path", f"s3://{BUCKET}/out", "--async-concurrency", "4")  # fmt: skip
        with (
            run_server(
                tmp_path / "repository", tmp_path / "a.log", "--state-dir", str(tmp_path / "a"), *arguments
            ) as a,
            run_server(
                tmp_path / "repository", tmp_path / "b.log", "--state-dir", str(tmp_path / "b"), *arguments
            ) as b,
        ):
            ids = [submit(a, "slow", body([float(i), 0, 0, 0]), "?timeout_s=2")["inference_id"] for i in range(200)]
            deadline = time.monotonic() + 60
            while len(json.loads(http_request(b, "GET", "/v2/async?state=succeeded&limit=1000").body)["jobs"]) < 50:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            a.process.send_signal(signal.SIGKILL)
            a.process.wait(timeout=30)
            ended = {job_id: wait(b, job_id) for job_id in ids}
    assert {document["state"] for document in ended.values()} == {"succeeded"}
    assert versions_of(s3, "out/") == {f"out/{job_id}.out": 1 for job_id in ids}
    assert any(document["attempts"] > 1 for document in ended.values())  # those "a" held, run again by "b"


def test_a_shared_queue_needs_shared_places(repository: Path, tmp_path: Path) -> None:
    with run_redis(tmp_path / "redis") as redis_url:
        run = subprocess.run(
            [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository), "--http-port", "0",
             "--grpc-port", "0", "--metrics-port", "0", "--state-dir", str(tmp_path / "state"),
             "--async-queue", redis_url],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert run.returncode == 2
    assert "--async-payload-path must be a place they all reach" in run.stdout + run.stderr


def test_boto3_invoke_endpoint_async_with_s3_and_sns(repository: Path, s3: Any, tmp_path: Path) -> None:
    import boto3

    sns, sqs = boto3.client("sns"), boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName="notices")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    topic = sns.create_topic(Name="async-done")["TopicArn"]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn, Attributes={"RawMessageDelivery": "true"})
    s3.put_object(Bucket=BUCKET, Key="in/rows.json", Body=body([3.0, 1.0, 4.0, 1.0]))
    arguments = ("--sagemaker", "--state-dir", str(tmp_path / "state"), "--async-input-root", f"s3://{BUCKET}/in",
                 "--async-output-path", f"s3://{BUCKET}/out", "--async-success-topic", topic,
                 "--async-error-topic", topic)  # fmt: skip
    env = {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "picky"}
    with run_server(repository, tmp_path / "server.log", *arguments, env=env) as server:
        client = runtime(server)
        answer = client.invoke_endpoint_async(
            EndpointName="picky", InputLocation=f"s3://{BUCKET}/in/rows.json", ContentType="application/json",
            InferenceId="boto-1",
        )  # fmt: skip
        assert answer["InferenceId"] == "boto-1"
        assert answer["OutputLocation"] == f"s3://{BUCKET}/out/boto-1.out"
        assert answer["FailureLocation"] == f"s3://{BUCKET}/out/boto-1-error.out"
        assert wait(server, "boto-1")["state"] == "succeeded"
        result = json.loads(s3.get_object(Bucket=BUCKET, Key="out/boto-1.out")["Body"].read())
        assert result["outputs"][0]["data"] == [3.0, 1.0, 4.0, 1.0]
        with pytest.raises(client.exceptions.ClientError) as refused:
            client.invoke_endpoint_async(EndpointName="picky", InputLocation=f"s3://{BUCKET}/elsewhere.json")
        assert "403" in str(refused.value) or "PERMISSION_DENIED" in str(refused.value)
        # An inline Body (boto3's newer form), into a folder the caller names under the output path.
        inline = client.invoke_endpoint_async(
            EndpointName="picky", Body=body([2.0, 7.0, 1.0, 8.0]), ContentType="application/json",
            InferenceId="boto-2", S3OutputPathExtension="team-a/2026",
        )  # fmt: skip
        assert inline["OutputLocation"] == f"s3://{BUCKET}/out/team-a/2026/boto-2.out"
        assert wait(server, "boto-2")["state"] == "succeeded"
        result = json.loads(s3.get_object(Bucket=BUCKET, Key="out/team-a/2026/boto-2.out")["Body"].read())
        assert result["outputs"][0]["data"] == [2.0, 7.0, 1.0, 8.0]
        for wrong in (
            {"Body": body([1.0, 2.0, 3.0, 4.0]), "InputLocation": f"s3://{BUCKET}/in/rows.json"},  # both
            {"Body": body([1.0, 2.0, 3.0, 4.0]), "Filename": "mine.out"},  # a name that could be another's
            {"Body": body([1.0, 2.0, 3.0, 4.0]), "S3OutputPathExtension": "../models"},  # out of the path
        ):
            with pytest.raises(client.exceptions.ClientError) as refused:
                client.invoke_endpoint_async(EndpointName="picky", ContentType="application/json", **wrong)
            assert refused.value.response["Error"]["Code"] == "INVALID_ARGUMENT"
            assert refused.value.response["Error"]["Message"]  # boto3 says why (it reads `message`)
        deadline = time.monotonic() + 30
        while not (messages := sqs.receive_message(QueueUrl=queue_url, WaitTimeSeconds=1).get("Messages")):
            assert time.monotonic() < deadline, "SNS was never told"
    notice = json.loads(messages[0]["Body"])
    assert notice["inferenceId"] == "boto-1" and notice["invocationStatus"] == "Completed"
    assert notice["responseParameters"]["outputLocation"] == f"s3://{BUCKET}/out/boto-1.out"


def test_a_server_of_async_concurrency_0_takes_submits_and_the_workers_run_them(
    repository: Path, s3: Any, tmp_path: Path
) -> None:
    """The front of a deployment that scales its workers to zero (`inferd deploy k8s
    --scale-to-zero --async-queue`): it queues jobs and answers their status, runs none; a worker
    sharing the queue, started later, runs them. Without a shared queue, 0 is refused."""
    misbehaving_model(tmp_path / "repository" / "slow")
    with run_redis(tmp_path / "redis") as redis_url:
        shared = ("--async-queue", redis_url, "--async-payload-path", f"s3://{BUCKET}/payloads",
                  "--async-output-path", f"s3://{BUCKET}/out")  # fmt: skip
        front_flags = ("--state-dir", str(tmp_path / "front"), *shared, "--async-concurrency", "0")
        with run_server(tmp_path / "repository", tmp_path / "front.log", *front_flags) as front:
            ids = [submit(front, "slow", body([float(i), 0, 0, 0]))["inference_id"] for i in range(5)]
            time.sleep(2)  # two of the queue's polls: the front runs nothing
            for job_id in ids:
                assert json.loads(http_request(front, "GET", f"/v2/async/{job_id}").body)["state"] == "queued"
            worker_flags = ("--state-dir", str(tmp_path / "worker"), *shared)
            with run_server(tmp_path / "repository", tmp_path / "worker.log", *worker_flags):
                assert {wait(front, job_id)["state"] for job_id in ids} == {"succeeded"}
    refused = subprocess.run(
        [sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository), "--http-port", "0",
         "--grpc-port", "0", "--metrics-port", "0", "--state-dir", str(tmp_path / "alone"), "--async-concurrency", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2 and "needs a shared --async-queue" in refused.stdout + refused.stderr

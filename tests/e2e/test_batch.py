"""`inferd batch` as users run it: the command in a subprocess over files on disk (and on moto's S3
server), each format's outputs checked against onnxruntime run directly in the test; records that
fail on their own; resuming after `kill -9`; the error budget; exit statuses."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
import pytest

from inferd.testing.models import add_sub_model, misbehaving_model, mlp_model, sleepy_model, write_config
from inferd.testing.server import ServerProcess, run_server
from tests.e2e.test_ensembles import build_repository as build_ensembles
from tests.e2e.test_remote_repository import BUCKET, s3  # noqa: F401 (the fixture)

pytestmark = pytest.mark.e2e

MLP_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
ADD_SUB_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batch-repository")
    (root / "mlp" / "1").mkdir(parents=True)
    mlp_model(root / "mlp" / "1" / "model.onnx")
    write_config(root / "mlp", MLP_CONFIG)
    (root / "add_sub" / "1").mkdir(parents=True)
    add_sub_model(root / "add_sub" / "1" / "model.onnx")
    write_config(root / "add_sub", ADD_SUB_CONFIG)
    misbehaving_model(root / "picky", fail_negative=1)  # refuses a batch holding a negative value
    misbehaving_model(root / "steady", sleep_ms=4)  # y = x, slow enough to kill half way
    # y = x after 50 ms an execution: 100 records one at a time take 5 s at least, on any machine.
    misbehaving_model(root / "slow", sleep_ms=50)
    sleepy_model(root / "stuck", sleep_ms=1500, max_batch_size=4)
    build_ensembles(root, tmp_path_factory.mktemp("markers"))
    return root


def batch(
    repository: Path | None, model: str, *args: str | Path, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """`inferd batch MODEL` with `args`, on the local engine over `repository` (None: no
    --model-repository, as the server engine takes none)."""
    where = ["--model-repository", str(repository)] if repository is not None else []
    return subprocess.run(
        [sys.executable, "-m", "inferd", "batch", model, *where, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "COLUMNS": "200"},
    )


def reference(repository: Path, model: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(repository / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


def json_lines(path: Path) -> list[Any]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def features(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, 16)).astype(np.float32)


# -- formats ------------------------------------------------------------------------------------


def test_json_lines_of_plain_rows_named_rows_and_v2_requests_match_onnxruntime(
    repository: Path, tmp_path: Path
) -> None:
    x = features(150)
    data = tmp_path / "in"
    data.mkdir()
    (data / "plain.jsonl").write_bytes(b"".join(orjson.dumps(row.tolist()) + b"\n" for row in x[:50]))
    (data / "named.jsonl").write_bytes(b"".join(orjson.dumps({"x": row.tolist()}) + b"\n" for row in x[50:100]))
    v2 = [{"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": row.tolist()}]} for row in x[100:]]
    (data / "sub" / "v2.jsonl").parent.mkdir()
    (data / "sub" / "v2.jsonl").write_bytes(b"".join(orjson.dumps(request) + b"\n" for request in v2))

    done = batch(repository, "mlp", "--input", data, "--output", tmp_path / "out")
    assert done.returncode == 0, done.stderr + done.stdout

    (want,) = reference(repository, "mlp", {"x": x})
    out = tmp_path / "out"
    got = [
        *json_lines(out / "named.jsonl.out"),
        *json_lines(out / "plain.jsonl.out"),
        *json_lines(out / "sub" / "v2.jsonl.out"),
    ]
    order = np.concatenate([np.arange(50, 100), np.arange(0, 50), np.arange(100, 150)])
    np.testing.assert_allclose(np.array(got, dtype=np.float32), want[order], rtol=1e-5, atol=1e-6)
    assert (out / "_errors.jsonl").read_bytes() == b""
    summary = orjson.loads((out / "_summary.json").read_bytes())
    assert summary["status"] == "complete" and summary["records"] == summary["outputs"] == 150
    manifest = orjson.loads((out / "_manifest.json").read_bytes())
    assert [f["name"] for f in manifest["files"]] == ["named.jsonl", "plain.jsonl", "sub/v2.jsonl"]
    assert all(f["assembled"] for f in manifest["files"])
    assert not (out / "_parts").exists()  # a finished job keeps only its outputs


def test_csv_with_an_input_filter_a_join_and_an_output_filter(repository: Path, tmp_path: Path) -> None:
    x = features(40, seed=1)
    lines = [f"id-{i}," + ",".join(repr(float(v)) for v in row) for i, row in enumerate(x)]
    (tmp_path / "rows.csv").write_text("\n".join(lines) + "\n")

    done = batch(
        repository, "mlp", "--input", tmp_path / "rows.csv", "--output", tmp_path / "out",
        "--content-type", "text/csv", "--input-filter", "$[1:]", "--join-source", "Input",
        "--output-filter", "$[0,-4:]",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout

    (want,) = reference(repository, "mlp", {"x": x})
    rows = list(csv.reader(io.StringIO((tmp_path / "out" / "rows.csv.out").read_text())))
    assert [row[0] for row in rows] == [f"id-{i}" for i in range(40)]  # the id kept, in order
    np.testing.assert_allclose(np.array([row[1:] for row in rows], dtype=np.float32), want, rtol=1e-5, atol=1e-6)


def test_json_join_puts_the_output_under_sagemaker_output(repository: Path, tmp_path: Path) -> None:
    x = features(10, seed=2)
    (tmp_path / "in.jsonl").write_bytes(
        b"".join(orjson.dumps({"id": i, "features": row.tolist()}) + b"\n" for i, row in enumerate(x))
    )
    done = batch(
        repository, "mlp", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "out",
        "--input-filter", "$.features", "--join-source", "Input", "--output-filter", "$['id','SageMakerOutput']",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    got = json_lines(tmp_path / "out" / "in.jsonl.out")
    (want,) = reference(repository, "mlp", {"x": x})
    assert [row["id"] for row in got] == list(range(10))
    assert all(set(row) == {"id", "SageMakerOutput"} for row in got)
    np.testing.assert_allclose(np.array([row["SageMakerOutput"] for row in got]), want, rtol=1e-5, atol=1e-6)


def test_npy_npz_and_parquet_rows(repository: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = features(70, seed=3)
    np.save(tmp_path / "x.npy", x.astype(np.float64))  # cast to the input's FP32, as a same-kind cast
    done = batch(
        repository,
        "mlp",
        "--input",
        tmp_path / "x.npy",
        "--output",
        tmp_path / "npy",
        "--content-type",
        "application/x-npy",
    )
    assert done.returncode == 0, done.stderr + done.stdout
    (want,) = reference(repository, "mlp", {"x": x})
    np.testing.assert_allclose(np.array(json_lines(tmp_path / "npy" / "x.npy.out")), want, rtol=1e-5, atol=1e-6)

    a, b = features(30, seed=4), features(30, seed=5)
    np.savez(tmp_path / "pairs.npz", INPUT0=a, INPUT1=b)
    done = batch(
        repository,
        "add_sub",
        "--input",
        tmp_path / "pairs.npz",
        "--output",
        tmp_path / "npz",
        "--content-type",
        "application/x-npz",
    )
    assert done.returncode == 0, done.stderr + done.stdout
    total, difference = reference(repository, "add_sub", {"INPUT0": a, "INPUT1": b})
    got = json_lines(tmp_path / "npz" / "pairs.npz.out")
    np.testing.assert_allclose(np.array([row["OUTPUT0"] for row in got]), total, rtol=1e-6)
    np.testing.assert_allclose(np.array([row["OUTPUT1"] for row in got]), difference, rtol=1e-6)
    only = batch(
        repository, "add_sub", "--input", tmp_path / "pairs.npz", "--output", tmp_path / "npz1",
        "--content-type", "application/x-npz", "--outputs", "OUTPUT1",
    )  # fmt: skip
    assert only.returncode == 0, only.stderr + only.stdout
    np.testing.assert_allclose(np.array(json_lines(tmp_path / "npz1" / "pairs.npz.out")), difference, rtol=1e-6)

    table = pa.table({"key": list(range(70)), "feats": [row.tolist() for row in x]})
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=16)
    done = batch(
        repository, "mlp", "--input", tmp_path / "rows.parquet", "--output", tmp_path / "parquet",
        "--content-type", "application/vnd.apache.parquet", "--columns", "feats=x",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    np.testing.assert_allclose(
        np.array(json_lines(tmp_path / "parquet" / "rows.parquet.out")), want, rtol=1e-5, atol=1e-6
    )


def test_texts_through_an_ensemble_one_per_line_and_one_per_file(repository: Path, tmp_path: Path) -> None:
    texts = [f"text number {i}" for i in range(25)] + ["this one says BOOM"] + ["après"]
    (tmp_path / "lines.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    done = batch(
        repository, "text_dag", "--input", tmp_path / "lines.txt", "--output", tmp_path / "lines",
        "--content-type", "text/plain", "--split-type", "Line", "--max-error-rate", "0.1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    got = json_lines(tmp_path / "lines" / "lines.txt.out")
    kept = [t for t in texts if "BOOM" not in t]
    assert got == [
        {"DESCRIPTION": [f"{t.encode().upper().decode()}|{len(t.encode())}"], "LENGTH": [len(t.encode())]} for t in kept
    ]  # fmt: skip
    (error,) = json_lines(tmp_path / "lines" / "_errors.jsonl")
    assert error["line"] == 26 and error["record"] == 25 and "boom" in error["error"]

    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(3):
        (folder / f"doc{i}.bin").write_bytes(f"document {i}".encode())
    done = batch(
        repository,
        "text_dag",
        "--input",
        folder,
        "--output",
        tmp_path / "files",
        "--content-type",
        "application/octet-stream",
    )
    assert done.returncode == 0, done.stderr + done.stdout
    for i in range(3):
        assert json_lines(tmp_path / "files" / f"doc{i}.bin.out") == [
            {"DESCRIPTION": [f"DOCUMENT {i}|10"], "LENGTH": [10]}
        ]


PARQUET = "application/vnd.apache.parquet"


def test_a_parquet_dataset_holds_a_row_per_answered_record_and_its_record_number(
    repository: Path, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    data.mkdir()
    x = features(50, seed=21)
    lines = [orjson.dumps({"INPUT0": row.tolist(), "INPUT1": (row * 2).tolist()}) for row in x]
    lines[7] = b'{"INPUT0": [oops]}'
    (data / "a.jsonl").write_bytes(b"\n".join(lines[:40]) + b"\n")
    (data / "b.jsonl").write_bytes(b"\n".join(lines[40:]) + b"\n")
    (data / "c.jsonl").write_bytes(b"[oops]\n")  # no record answered: no file in the dataset
    args = ["--input", data, "--accept", PARQUET, "--shard-records", "16", "--max-error-rate", "0.1"]
    done = batch(repository, "add_sub", *args, "--output", tmp_path / "one")
    assert done.returncode == 0, done.stderr + done.stdout
    out = tmp_path / "one"
    assert sorted(path.name for path in out.glob("*.parquet")) == ["a.jsonl.parquet", "b.jsonl.parquet"]
    answered = [i for i in range(40) if i != 7]
    total, difference = reference(repository, "add_sub", {"INPUT0": x, "INPUT1": x * 2})
    a = pq.read_table(out / "a.jsonl.parquet")
    assert a.column_names == ["file", "record", "OUTPUT0", "OUTPUT1"]
    assert a["record"].to_pylist() == answered and set(a["file"].to_pylist()) == {"a.jsonl"}
    np.testing.assert_allclose(np.array(a["OUTPUT0"].to_pylist(), dtype=np.float32), total[answered], rtol=1e-6)
    np.testing.assert_allclose(np.array(a["OUTPUT1"].to_pylist(), dtype=np.float32), difference[answered], rtol=1e-6)
    assert pq.ParquetFile(out / "a.jsonl.parquet").metadata.num_row_groups == 3  # a row group per shard of 16
    (out / ".a.jsonl.parquet.0123abcd.tmp").write_bytes(b"what a crash mid-assembly leaves")
    dataset = pq.read_table(out)  # the folder reads as one dataset: the job's _ and . files are skipped
    assert dataset.num_rows == 49 and dataset.schema == a.schema
    rows = {(row["file"], row["record"]) for row in dataset.select(["file", "record"]).to_pylist()}
    assert rows == {("a.jsonl", i) for i in answered} | {("b.jsonl", i) for i in range(10)}
    manifest = orjson.loads((out / "_manifest.json").read_bytes())
    assert [entry["output"] for entry in manifest["files"]] == ["a.jsonl.parquet", "b.jsonl.parquet", None]
    assert [(e["file"], e["record"]) for e in json_lines(out / "_errors.jsonl")] == [("a.jsonl", 7), ("c.jsonl", 0)]

    again = batch(repository, "add_sub", *args, "--output", tmp_path / "two")
    assert again.returncode == 0, again.stderr + again.stdout
    for name in ("a.jsonl.parquet", "b.jsonl.parquet"):
        assert (tmp_path / "two" / name).read_bytes() == (out / name).read_bytes()

    # BYTES outputs (the text ensemble's) are binary columns, as many elements as the output has.
    (tmp_path / "lines.txt").write_text("one\ntwo words\n", encoding="utf-8")
    texts = batch(
        repository, "text_dag", "--input", tmp_path / "lines.txt", "--output", tmp_path / "texts",
        "--content-type", "text/plain", "--split-type", "Line", "--accept", PARQUET,
    )  # fmt: skip
    assert texts.returncode == 0, texts.stderr + texts.stdout
    table = pq.read_table(tmp_path / "texts" / "lines.txt.parquet")
    assert table.to_pylist() == [
        {"file": "lines.txt", "record": 0, "DESCRIPTION": [b"ONE|3"], "LENGTH": [3]},
        {"file": "lines.txt", "record": 1, "DESCRIPTION": [b"TWO WORDS|9"], "LENGTH": [9]},
    ]


def test_parquet_output_refuses_the_knobs_that_shape_output_records(repository: Path, tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_bytes(orjson.dumps(features(1)[0].tolist()) + b"\n")
    common = ["--input", tmp_path / "in.jsonl", "--output", tmp_path / "out"]
    unknown = batch(repository, "mlp", *common, "--accept", "text/html")
    assert unknown.returncode == 2 and "--accept 'text/html'" in unknown.stderr
    joined = batch(repository, "mlp", *common, "--accept", PARQUET, "--join-source", "Input")
    assert joined.returncode == 2 and "a column per output" in joined.stderr


# -- failures ----------------------------------------------------------------------------------


def write_with_malformed(path: Path, count: int, every: int) -> list[int]:
    """`count` JSON Lines records {"id", "x"}, every `every`-th one malformed; the good ids."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((count, 16)).astype(np.float32)
    good = []
    with path.open("wb") as out:
        for i in range(count):
            if i % every == every - 1:
                out.write(b'{"id": %d, "x": [oops]}\n' % i)
            else:
                out.write(orjson.dumps({"id": i, "x": x[i].tolist()}) + b"\n")
                good.append(i)
    return good


def test_malformed_records_are_errors_the_rest_in_order_and_two_runs_agree(repository: Path, tmp_path: Path) -> None:
    good = write_with_malformed(tmp_path / "data.jsonl", 100_000, every=1000)
    args = ["--input", tmp_path / "data.jsonl", "--input-filter", "$.x", "--join-source", "Input",
            "--output-filter", "$['id','SageMakerOutput']"]  # fmt: skip
    first = batch(repository, "mlp", *args, "--output", tmp_path / "one")
    assert first.returncode == 0, first.stderr + first.stdout
    out = (tmp_path / "one" / "data.jsonl.out").read_bytes().splitlines()
    assert len(out) == 99_900 and len(good) == 99_900
    assert [orjson.loads(line)["id"] for line in out] == good  # in order, each joined to its input's id
    errors = json_lines(tmp_path / "one" / "_errors.jsonl")
    assert len(errors) == 100
    assert [e["line"] for e in errors] == [i + 1 for i in range(999, 100_000, 1000)]
    assert {e["code"] for e in errors} == {"MALFORMED_RECORD"}

    second = batch(repository, "mlp", *args, "--output", tmp_path / "two")
    assert second.returncode == 0, second.stderr + second.stdout
    for name in ("data.jsonl.out", "_errors.jsonl"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_a_mini_batch_the_model_refuses_costs_only_its_bad_records(repository: Path, tmp_path: Path) -> None:
    x = np.abs(features(64, seed=8)[:, :4])
    bad = {3, 17, 18, 40}
    for index in bad:
        x[index, 2] = -1.0
    (tmp_path / "in.jsonl").write_bytes(b"".join(orjson.dumps(row.tolist()) + b"\n" for row in x))
    done = batch(
        repository, "picky", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "out", "--max-error-rate", "0.1"
    )
    assert done.returncode == 0, done.stderr + done.stdout
    errors = json_lines(tmp_path / "out" / "_errors.jsonl")
    assert [e["record"] for e in errors] == sorted(bad)
    assert all(e["code"] == "MODEL_RAISED" and "negative" in e["error"] for e in errors)
    kept = [i for i in range(64) if i not in bad]
    np.testing.assert_array_equal(np.array(json_lines(tmp_path / "out" / "in.jsonl.out"), dtype=np.float32), x[kept])


def test_the_error_budget_stops_the_job_and_a_rerun_with_a_larger_one_finishes_it(
    repository: Path, tmp_path: Path
) -> None:
    x = features(3000, seed=9)[:, :4]  # about 15 in 16 rows hold a negative value: the model refuses them
    (tmp_path / "in.jsonl").write_bytes(b"".join(orjson.dumps(row.tolist()) + b"\n" for row in x))
    args = ["--input", tmp_path / "in.jsonl", "--output", tmp_path / "out", "--shard-records", "500"]
    stopped = batch(repository, "picky", *args, "--max-error-rate", "0.05")
    assert stopped.returncode == 1, stopped.stderr + stopped.stdout
    summary = orjson.loads((tmp_path / "out" / "_summary.json").read_bytes())
    assert summary["status"] == "stopped" and "more than --max-error-rate 0.05" in summary["reason"]
    assert summary["records"] < 3000
    assert not (tmp_path / "out" / "in.jsonl.out").exists()  # a file's output is whole or absent

    finished = batch(repository, "picky", *args, "--max-error-rate", "1")
    assert finished.returncode == 0, finished.stderr + finished.stdout
    summary = orjson.loads((tmp_path / "out" / "_summary.json").read_bytes())
    assert summary["records"] == 3000 and summary["outputs"] + summary["errors"] == 3000
    assert summary["shards_found_done"] >= 1  # what the first run finished was kept
    kept = [row for row in x if (row >= 0).all()]
    np.testing.assert_array_equal(np.array(json_lines(tmp_path / "out" / "in.jsonl.out"), dtype=np.float32), kept)


def test_a_rerun_refuses_when_the_model_serves_other_versions_than_the_job_began_with(tmp_path: Path) -> None:
    import shutil

    repository = tmp_path / "repository"
    misbehaving_model(repository / "picky", fail_negative=1)
    x = features(3000, seed=13)[:, :4]
    (tmp_path / "in.jsonl").write_bytes(b"".join(orjson.dumps(row.tolist()) + b"\n" for row in x))
    args = ["--input", tmp_path / "in.jsonl", "--output", tmp_path / "out", "--shard-records", "500"]
    stopped = batch(repository, "picky", *args, "--max-error-rate", "0.05")
    assert stopped.returncode == 1, stopped.stderr + stopped.stdout
    shutil.copytree(repository / "picky" / "1", repository / "picky" / "2")  # a new version lands
    again = batch(repository, "picky", *args, "--max-error-rate", "1")
    assert again.returncode == 2 and "versions ['1']" in again.stderr and "['2']" in again.stderr, again.stderr
    pinned = batch(repository, "picky", *args, "--max-error-rate", "1", "--model-version", "1")
    assert pinned.returncode == 2  # the job's identity names the version asked: "" is not "1"


def test_a_mini_batch_that_times_out_is_retried_then_its_records_are_errors(repository: Path, tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_bytes(b"[1.0]\n[2.0]\n")
    done = batch(
        repository, "stuck", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "out",
        "--invocations-timeout-seconds", "0.2", "--invocations-max-retries", "1", "--max-concurrent-transforms", "1",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr + done.stdout  # every record failed: over the budget
    errors = json_lines(tmp_path / "out" / "_errors.jsonl")
    assert [e["record"] for e in errors] == [0, 1]
    assert all("(2 tries)" in e["error"] for e in errors), errors


def test_payload_bound_assemble_none_and_single_records(repository: Path, tmp_path: Path) -> None:
    x = features(20, seed=12)
    lines = [orjson.dumps(row.tolist()) for row in x]
    lines[5] = orjson.dumps({"x": x[5].tolist(), "padding": "p" * 2000})  # larger than the bound below
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    done = batch(
        repository, "mlp", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "out",
        "--max-payload-mb", "0.001", "--assemble-with", "None", "--max-error-rate", "0.1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    (error,) = json_lines(tmp_path / "out" / "_errors.jsonl")
    assert error["record"] == 5 and error["code"] == "TOO_LARGE" and "--max-payload-mb 0.001" in error["error"]
    written = (tmp_path / "out" / "in.jsonl.out").read_bytes()
    assert b"\n" not in written and written.startswith(b"[") and written.count(b"][") == 18  # glued together
    (want,) = reference(repository, "mlp", {"x": x})
    got = orjson.loads(b"[" + written.replace(b"][", b"],[") + b"]")
    np.testing.assert_allclose(np.array(got), np.delete(want, 5, axis=0), rtol=1e-5, atol=1e-6)

    single = batch(
        repository, "mlp", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "single",
        "--batch-strategy", "SingleRecord", "--max-error-rate", "0.1",
    )  # fmt: skip
    assert single.returncode == 0, single.stderr + single.stdout
    np.testing.assert_allclose(
        np.array(json_lines(tmp_path / "single" / "in.jsonl.out")), np.delete(want, 5, axis=0), rtol=1e-5, atol=1e-6
    )


# -- resuming ----------------------------------------------------------------------------------


def parts(output: Path) -> set[str]:
    folder = output / "_parts"
    return {str(p.relative_to(folder)) for p in folder.rglob("*.part")} if folder.exists() else set()


def test_kill_9_half_way_then_the_same_command_redoes_only_unfinished_shards(repository: Path, tmp_path: Path) -> None:
    x = np.arange(4000 * 4, dtype=np.float32).reshape(4000, 4)
    (tmp_path / "in.jsonl").write_bytes(b"".join(orjson.dumps(row.tolist()) + b"\n" for row in x))
    args = ["--input", tmp_path / "in.jsonl", "--shard-records", "200", "--max-concurrent-transforms", "2"]
    command = [sys.executable, "-m", "inferd", "batch", "steady", "--model-repository", str(repository)]
    process = subprocess.Popen(
        [*command, *map(str, args), "--output", str(tmp_path / "cut")], stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while len(parts(tmp_path / "cut")) < 10 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)
    kept = parts(tmp_path / "cut")
    assert 10 <= len(kept) < 20, f"killed at {len(kept)} of 20 shards"

    again = batch(repository, "steady", *args, "--output", tmp_path / "cut")
    assert again.returncode == 0, again.stderr + again.stdout
    whole = batch(repository, "steady", *args, "--output", tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr + whole.stdout
    assert (tmp_path / "cut" / "in.jsonl.out").read_bytes() == (tmp_path / "whole" / "in.jsonl.out").read_bytes()
    np.testing.assert_array_equal(np.array(json_lines(tmp_path / "whole" / "in.jsonl.out"), dtype=np.float32), x)
    runs = orjson.loads((tmp_path / "cut" / "_manifest.json").read_bytes())["runs"]
    assert runs[-1]["shards_found_done"] == len(kept)  # every shard finished before the kill was kept
    assert runs[-1]["shards_run"] == 20 - len(kept)  # and only the others ran again


def test_ctrl_c_stops_the_job_saying_how_to_resume(repository: Path, tmp_path: Path) -> None:
    x = np.arange(100 * 4, dtype=np.float32).reshape(100, 4)
    (tmp_path / "in.jsonl").write_bytes(b"".join(orjson.dumps(row.tolist()) + b"\n" for row in x))
    args = ["--input", tmp_path / "in.jsonl", "--output", tmp_path / "out", "--shard-records", "10",
            "--batch-strategy", "SingleRecord", "--max-concurrent-transforms", "1"]  # fmt: skip
    command = [sys.executable, "-m", "inferd", "batch", "slow", "--model-repository", str(repository)]
    # Ctrl-C as a terminal delivers it: a process started in the background by a shell without job
    # control (a CI runner's) inherits SIGINT ignored, and Python then never raises KeyboardInterrupt.
    process = subprocess.Popen(
        [*command, *map(str, args)],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60  # a shard is done after 0.5 s at least; the job needs 5 s at least
    while not parts(tmp_path / "out") and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert b"run the same command again to resume" in stderr
    kept = parts(tmp_path / "out")
    assert 1 <= len(kept) < 10
    again = batch(repository, "slow", *args)
    assert again.returncode == 0, again.stderr + again.stdout
    np.testing.assert_array_equal(np.array(json_lines(tmp_path / "out" / "in.jsonl.out"), dtype=np.float32), x)
    run = orjson.loads((tmp_path / "out" / "_manifest.json").read_bytes())["runs"][-1]
    assert run["shards_found_done"] == len(kept) and run["shards_run"] == 10 - len(kept)


# -- endpoints -----------------------------------------------------------------------------------

ENDPOINTS = """
endpoints:
  shop:
    variants:
      - {name: blue, model: blue, weight: 90}
      - {name: green, model: green, weight: 10}
"""


def endpoint_repository(root: Path) -> Path:
    """Two variants of one signature whose answers say which ran: y = x, and y = x + 1000."""
    misbehaving_model(root / "blue")
    misbehaving_model(root / "green", offset=1000)
    (root.parent / "endpoints.yaml").write_text(ENDPOINTS)
    return root


def test_an_endpoint_sends_each_record_to_a_variant_by_weight_the_same_on_every_run(tmp_path: Path) -> None:
    repository = endpoint_repository(tmp_path / "repository")
    x = np.abs(features(5000, seed=14)[:, :4])
    (tmp_path / "in.jsonl").write_bytes(b"".join(orjson.dumps(row.tolist()) + b"\n" for row in x))
    args = ["--input", tmp_path / "in.jsonl", "--endpoints", tmp_path / "endpoints.yaml"]
    first = batch(repository, "shop", *args, "--output", tmp_path / "one")
    assert first.returncode == 0, first.stderr + first.stdout
    y = np.array(json_lines(tmp_path / "one" / "in.jsonl.out"), dtype=np.float32)
    green = (y - x).mean(axis=1) > 500  # the records that went to green
    np.testing.assert_allclose(y - np.where(green[:, None], 1000, 0), x, atol=1e-3)  # each answered by its variant
    assert abs(green.mean() - 0.10) <= 0.02, green.mean()  # 90/10 over 5,000 records, within 2 points
    summary = orjson.loads((tmp_path / "one" / "_summary.json").read_bytes())
    assert summary["variants"] == {"blue": int((~green).sum()), "green": int(green.sum())}
    # The same records go to the same variants in another run, with other mini-batches.
    again = batch(repository, "shop", *args, "--output", tmp_path / "two", "--batch-strategy", "SingleRecord")
    assert again.returncode == 0, again.stderr + again.stdout
    assert (tmp_path / "two" / "in.jsonl.out").read_bytes() == (tmp_path / "one" / "in.jsonl.out").read_bytes()


# -- the server engine ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with run_server(repository, tmp_path_factory.mktemp("batch-server") / "server.log") as process:
        yield process


def test_the_server_engine_writes_what_the_local_engine_writes(
    repository: Path, server: ServerProcess, tmp_path: Path
) -> None:
    good = write_with_malformed(tmp_path / "data.jsonl", 3000, every=500)
    args = ["--input", tmp_path / "data.jsonl", "--input-filter", "$.x", "--join-source", "Input",
            "--output-filter", "$['id','SageMakerOutput']"]  # fmt: skip
    local = batch(repository, "mlp", *args, "--output", tmp_path / "local")
    assert local.returncode == 0, local.stderr + local.stdout
    for scheme, port in (("http", server.http_port), ("grpc", server.grpc_port)):
        remote = batch(
            None,
            "mlp",
            *args,
            "--output",
            tmp_path / scheme,
            "--engine",
            "server",
            "--url",
            f"{scheme}://127.0.0.1:{port}",
        )
        assert remote.returncode == 0, remote.stderr + remote.stdout
        for name in ("data.jsonl.out", "_errors.jsonl"):
            assert (tmp_path / scheme / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), (scheme, name)
    assert [
        orjson.loads(line)["id"] for line in (tmp_path / "http" / "data.jsonl.out").read_bytes().splitlines()
    ] == good


def test_the_server_engine_through_an_ensemble_of_batching_steps(server: ServerProcess, tmp_path: Path) -> None:
    texts = [f"text {i}" for i in range(60)]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    done = batch(
        None, "text_dag", "--engine", "server", "--url", f"http://127.0.0.1:{server.http_port}",
        "--input", tmp_path / "texts.txt", "--output", tmp_path / "out", "--content-type", "text/plain",
        "--split-type", "Line", "--batch-strategy", "SingleRecord", "--max-concurrent-transforms", "8",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    assert json_lines(tmp_path / "out" / "texts.txt.out") == [
        {"DESCRIPTION": [f"{t.upper()}|{len(t)}"], "LENGTH": [len(t)]} for t in texts
    ]


# -- usage -------------------------------------------------------------------------------------


def test_usage_errors_exit_2_saying_why(repository: Path, tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_bytes(orjson.dumps(features(1)[0].tolist()) + b"\n")
    ran = batch(repository, "mlp", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "out")
    assert ran.returncode == 0, ran.stderr
    other = batch(
        repository, "mlp", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "out", "--input-filter", "$[0:]"
    )
    assert other.returncode == 2 and "holds another job" in other.stderr
    (tmp_path / "in.jsonl").write_bytes(b"[]\n[]\n")
    changed = batch(repository, "mlp", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "out")
    assert changed.returncode == 2 and "input changed" in changed.stderr
    inside = batch(repository, "mlp", "--input", tmp_path, "--output", tmp_path / "sub")
    assert inside.returncode == 2 and "inside it" in inside.stderr
    two_inputs = batch(
        repository,
        "add_sub",
        "--input",
        tmp_path / "in.jsonl",
        "--output",
        tmp_path / "o2",
        "--content-type",
        "text/csv",
    )
    assert two_inputs.returncode == 2 and "one input" in two_inputs.stderr
    unknown = batch(repository, "nope", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "o3")
    assert unknown.returncode == 2 and "nope" in unknown.stderr
    no_url = batch(None, "mlp", "--engine", "server", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "o4")
    assert no_url.returncode == 2 and "--url" in no_url.stderr
    no_repository = batch(None, "mlp", "--input", tmp_path / "in.jsonl", "--output", tmp_path / "o5")
    assert no_repository.returncode == 2 and "--model-repository" in no_repository.stderr


# -- S3 ----------------------------------------------------------------------------------------


def test_s3_input_and_output(repository: Path, tmp_path: Path, s3: Any) -> None:  # noqa: F811
    x = features(30, seed=11)
    for name, rows in (("a.jsonl", x[:20]), ("b.jsonl", x[20:])):
        s3.put_object(Bucket=BUCKET, Key=f"data/{name}", Body=b"".join(orjson.dumps(r.tolist()) + b"\n" for r in rows))
    done = batch(repository, "mlp", "--input", f"s3://{BUCKET}/data/", "--output", f"s3://{BUCKET}/results")
    assert done.returncode == 0, done.stderr + done.stdout
    (want,) = reference(repository, "mlp", {"x": x})
    got = []
    for name in ("a.jsonl.out", "b.jsonl.out"):
        body = s3.get_object(Bucket=BUCKET, Key=f"results/{name}")["Body"].read()
        got += [orjson.loads(line) for line in body.splitlines()]
    np.testing.assert_allclose(np.array(got), want, rtol=1e-5, atol=1e-6)
    keys = {entry["Key"] for entry in s3.list_objects_v2(Bucket=BUCKET, Prefix="results/")["Contents"]}
    assert keys == {
        f"results/{n}" for n in ("a.jsonl.out", "b.jsonl.out", "_manifest.json", "_errors.jsonl", "_summary.json")
    }

    import pyarrow.parquet as pq

    done = batch(
        repository, "mlp", "--input", f"s3://{BUCKET}/data/", "--output", f"s3://{BUCKET}/tables", "--accept", PARQUET
    )
    assert done.returncode == 0, done.stderr + done.stdout
    rows = []
    for name in ("a.jsonl.parquet", "b.jsonl.parquet"):
        body = s3.get_object(Bucket=BUCKET, Key=f"tables/{name}")["Body"].read()
        rows += pq.read_table(io.BytesIO(body))["y"].to_pylist()
    np.testing.assert_allclose(np.array(rows), want, rtol=1e-5, atol=1e-6)

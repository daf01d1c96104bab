"""`inferd batch --engine ray` on a real Ray cluster of two nodes on this machine
(inferd.testing.ray_cluster), joined with --ray-address: the outputs are byte for byte the local
engine's, and both nodes ran shards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from inferd.testing.ray_cluster import RayCluster, ray_cluster
from tests.e2e.test_batch import MLP_CONFIG, PARQUET, batch, endpoint_repository, write_with_malformed

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    with ray_cluster(tmp_path_factory.mktemp("ray-logs")) as running:
        yield running


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inferd.testing.models import mlp_model, write_config

    root = tmp_path_factory.mktemp("ray-repository")
    (root / "mlp" / "1").mkdir(parents=True)
    mlp_model(root / "mlp" / "1" / "model.onnx")
    write_config(root / "mlp", MLP_CONFIG)
    return root


def test_a_ray_cluster_of_two_nodes_writes_what_the_local_engine_writes(
    cluster: RayCluster, repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    data = tmp_path / "data"
    data.mkdir()
    write_with_malformed(data / "a.jsonl", 20_000, every=1000)
    write_with_malformed(data / "b.jsonl", 3_000, every=700)
    args = ["--input", data, "--shard-records", "2000", "--input-filter", "$.x", "--join-source", "Input",
            "--output-filter", "$['id','SageMakerOutput']"]  # fmt: skip
    local = batch(repository, "mlp", *args, "--output", tmp_path / "local")
    assert local.returncode == 0, local.stderr + local.stdout
    on_ray = batch(
        repository, "mlp", *args, "--output", tmp_path / "ray", "--engine", "ray", "--ray-address", cluster.address,
        "--max-concurrent-transforms", "3", timeout_s=300,
    )  # fmt: skip
    assert on_ray.returncode == 0, on_ray.stderr + on_ray.stdout
    for name in ("a.jsonl.out", "b.jsonl.out", "_errors.jsonl"):
        assert (tmp_path / "ray" / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name
    run = orjson.loads((tmp_path / "ray" / "_manifest.json").read_bytes())["runs"][-1]
    assert run["engine"] == "ray" and run["shards_run"] == 12
    assert run["ray_nodes"] == 2  # three actors of one CPU each on 2 + 1 CPUs: both nodes ran shards

    # A Parquet dataset (a column per output, a row group per shard) is byte for byte the same too.
    tables = ["--input", data, "--shard-records", "2000", "--input-filter", "$.x", "--accept", PARQUET]
    local = batch(repository, "mlp", *tables, "--output", tmp_path / "local-parquet")
    assert local.returncode == 0, local.stderr + local.stdout
    on_ray = batch(
        repository, "mlp", *tables, "--output", tmp_path / "ray-parquet", "--engine", "ray",
        "--ray-address", cluster.address, "--max-concurrent-transforms", "3", timeout_s=300,
    )  # fmt: skip
    assert on_ray.returncode == 0, on_ray.stderr + on_ray.stdout
    for name in ("a.jsonl.parquet", "b.jsonl.parquet", "_errors.jsonl"):
        assert (tmp_path / "ray-parquet" / name).read_bytes() == (tmp_path / "local-parquet" / name).read_bytes()


def test_an_endpoint_on_ray_sends_each_record_where_the_local_engine_does(
    cluster: RayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in cluster.env.items():
        monkeypatch.setenv(key, value)
    repository = endpoint_repository(tmp_path / "repository")
    x = np.abs(np.random.default_rng(15).standard_normal((3000, 4)).astype(np.float32))
    (tmp_path / "in.jsonl").write_bytes(b"".join(orjson.dumps(row.tolist()) + b"\n" for row in x))
    args = ["--input", tmp_path / "in.jsonl", "--endpoints", tmp_path / "endpoints.yaml", "--shard-records", "500"]
    local = batch(repository, "shop", *args, "--output", tmp_path / "local")
    assert local.returncode == 0, local.stderr + local.stdout
    on_ray = batch(
        repository, "shop", *args, "--output", tmp_path / "ray", "--engine", "ray", "--ray-address", cluster.address,
        timeout_s=300,
    )  # fmt: skip
    assert on_ray.returncode == 0, on_ray.stderr + on_ray.stdout
    assert (tmp_path / "ray" / "in.jsonl.out").read_bytes() == (tmp_path / "local" / "in.jsonl.out").read_bytes()
    summaries = [orjson.loads((tmp_path / side / "_summary.json").read_bytes()) for side in ("local", "ray")]
    assert summaries[0]["variants"] == summaries[1]["variants"]

"""`inferd optimize` through its CLI: all-MiniLM-L6-v2 (the example's export) to every candidate,
FP16 and INT8 passing their documented tolerances and the winner served by a real inferd; a
torch.export program and a TensorFlow SavedModel to ONNX and to bfloat16 in their own framework
(bf16-torch, bf16-tf); MiniLM's Hugging Face folder to a bf16-torch candidate that serves; a
candidate outside its tolerance reported and never written; bad arguments as one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from inferd.client import Client
from inferd.runtimes.base import cpu_computes_bfloat16
from inferd.testing.isolated import in_child
from inferd.testing.models import (
    bert_shaped_savedmodel,
    exported_model,
    minilm_files,
    mlp_model,
    tensorflow_savedmodel,
)
from inferd.testing.server import run_server

pytestmark = pytest.mark.e2e
REPO_ROOT = Path(__file__).resolve().parents[2]
PAIRS = 40


def optimize(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferd", "optimize", *args], capture_output=True, text=True, timeout=600
    )


def record(output: Path) -> dict[str, dict[str, object]]:
    document = json.loads((output / "optimize.json").read_text())
    return {c["name"]: c for c in document["candidates"]} | {"": document}


@pytest.mark.timeout(600)
def test_minilm_candidates_pass_their_tolerances_and_the_winner_serves(
    pipeline_repository: Path, tmp_path: Path
) -> None:
    pairs = tmp_path / "pairs.tsv"
    lines = (REPO_ROOT / "examples" / "sentence_pairs.tsv").read_text(encoding="utf-8").splitlines()
    pairs.write_text("\n".join(lines[: PAIRS + 1]) + "\n", encoding="utf-8")
    output = tmp_path / "out"
    tokenizer = minilm_files() / "tokenizer.json"
    result = optimize(str(pipeline_repository / "minilm"), "-o", str(output), "--inputs", str(pairs),
                      "--tokenizer", str(tokenizer), "--calibration", str(pairs))  # fmt: skip
    assert result.returncode == 0, result.stderr
    candidates = record(output)
    summary = candidates.pop("")
    assert set(candidates) == {"fp32", "ort", "transformer", "fp16", "int8-dynamic", "int8-static"}
    for name in ("fp32", "ort", "transformer", "fp16", "int8-dynamic"):
        assert candidates[name]["status"] == "passed", (name, candidates[name]["reason"])
    # Static INT8 builds and runs; whether it keeps the answers is the gate's call, reported either way.
    assert candidates["int8-static"]["status"] in ("passed", "rejected")
    # The FP16 port keeps the original's answers as the published BF16 port did: no flip, tiny diffs.
    fp16 = candidates["fp16"]["validation"]
    assert isinstance(fp16, dict)
    similarity, embedding = fp16["outputs"]
    assert similarity["flips"] == 0 and similarity["abs_diff_max"] < 1e-2 and embedding["cosine_min"] > 0.999
    int8 = candidates["int8-dynamic"]["validation"]
    assert isinstance(int8, dict) and int8["outputs"][1]["cosine_min"] > 0.95
    for name, candidate in candidates.items():
        written = output / f"minilm-{name}"
        assert (written / "1" / "model.onnx").is_file() == (candidate["status"] == "passed")
    winner = summary["winner"]
    assert winner in candidates and candidates[str(winner)]["status"] == "passed"
    assert (output / "minilm" / "1" / "model.onnx").read_bytes() == (
        output / f"minilm-{winner}" / "1" / "model.onnx"
    ).read_bytes()
    config = (output / "minilm" / "config.pbtxt").read_text()
    assert 'name: "minilm"' in config and "max_batch_size: 32" in config and "dynamic_batching" in config
    assert f"candidate '{winner}'" in config
    assert "winner:" in result.stdout and str(winner) in result.stdout

    # The winner is ready for a repository: a real inferd serves it, and batches it.
    from tokenizers import Tokenizer

    encoding = Tokenizer.from_file(str(tokenizer)).encode(lines[1].split("\t")[0])
    inputs = {
        "input_ids": np.array([encoding.ids], dtype=np.int64),
        "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
        "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
    }
    with run_server(output, tmp_path / "server.log", "--model-control-mode", "explicit", "--load-model", "minilm",
                    "--load-model", "minilm-fp32") as server:  # fmt: skip
        client = Client(f"http://{server.http_url}")
        try:
            served = client.infer("minilm", inputs, outputs=["sentence_embedding"]).as_numpy("sentence_embedding")
            original = client.infer("minilm-fp32", inputs).as_numpy("sentence_embedding")
        finally:
            client.close()
    cosine = float(np.dot(served[0], original[0]) / (np.linalg.norm(served[0]) * np.linalg.norm(original[0])))
    assert served.shape == (1, 384) and cosine > 0.95


def test_a_savedmodel_s_signature_becomes_onnx_through_tf2onnx_and_is_validated_against_tensorflow(
    tmp_path: Path,
) -> None:
    source = tmp_path / "tf_mlp"
    in_child(tensorflow_savedmodel, source / "1" / "model.savedmodel", seed=3)  # TensorFlow never runs here
    (source / "config.pbtxt").write_text(
        'platform: "tensorflow_savedmodel"\nmax_batch_size: 8\ndynamic_batching { }\n'
        'parameters { key: "TF_SIGNATURE_DEF" value { string_value: "scaled" } }\n'
    )
    output = tmp_path / "out"
    # y = 10 x @ w is in the tens: bfloat16's 8 bits of mantissa are judged relative to that.
    result = optimize(str(source), "-o", str(output), "--candidates", "fp32,fp16,bf16-tf,bf16-torch",
                      "--tolerance", "bf16:atol=0.5")  # fmt: skip
    assert result.returncode == 0, result.stderr
    said = " ".join((result.stdout + result.stderr).split())  # as rich wrapped it
    assert "converting the SavedModel to ONNX with tf2onnx" in said and "(signature scaled)" in said
    candidates = record(output)
    for kind in ("fp32", "fp16"):
        assert candidates[kind]["status"] == "passed", candidates[kind]["reason"]
    assert candidates["bf16-torch"]["status"] == "skipped"
    assert "for PyTorch sources" in str(candidates["bf16-torch"]["reason"])
    # The SavedModel itself, its graph rewritten to bfloat16 by grappler (where the CPU computes bfloat16).
    bf16 = candidates["bf16-tf"]
    if not cpu_computes_bfloat16():
        assert bf16["status"] == "skipped" and "no bfloat16 arithmetic" in str(bf16["reason"])
    else:
        assert bf16["status"] == "passed", bf16["reason"]
        validation = bf16["validation"]
        assert isinstance(validation, dict) and 0 < validation["outputs"][0]["abs_diff_max"] < 0.5
        written = output / "tf_mlp-bf16-tf"
        assert (written / "1" / "model.savedmodel" / "saved_model.pb").is_file()
        config = (written / "config.pbtxt").read_text()
        assert 'platform: "tensorflow_savedmodel"' in config and "TF_SIGNATURE_DEF" in config
        assert 'key: "MIXED_PRECISION"' in config and 'string_value: "bfloat16"' in config
    # Validated against the original: the SavedModel, run by inferd's TensorFlow runtime.
    assert candidates[""]["reference"] == str(source)
    config = (output / "tf_mlp" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config and "max_batch_size: 8" in config
    assert "TF_SIGNATURE_DEF" not in config  # the SavedModel's parameter, nothing of the ONNX port's


def test_a_savedmodel_with_ops_tf2onnx_leaves_unconverted_is_a_one_line_error(tmp_path: Path) -> None:
    """tf2onnx succeeds yet keeps TensorFlow's Erfc (tf.nn.gelu, exact): optimize says so, and writes nothing."""
    in_child(bert_shaped_savedmodel, tmp_path / "bert" / "1", activation="gelu")
    result = optimize(str(tmp_path / "bert"), "-o", str(tmp_path / "out"), "--candidates", "fp32")
    assert result.returncode != 0
    assert "left TensorFlow ops ONNX has not: Erfc" in " ".join(result.stderr.split())
    assert not (tmp_path / "out" / "bert").exists()


def test_a_torch_export_program_becomes_onnx_candidates_and_a_bf16_torch_one(tmp_path: Path) -> None:
    source = tmp_path / "torch_mlp"
    exported_model(source / "1" / "model.pt2", seed=2)
    (source / "config.pbtxt").write_text('platform: "pytorch_libtorch"\nmax_batch_size: 8\ndynamic_batching { }\n')
    output = tmp_path / "out"
    result = optimize(str(source), "-o", str(output))  # all: the ONNX candidates and bf16-torch
    assert result.returncode == 0, result.stderr
    candidates = record(output)
    assert set(candidates) == {"", "fp32", "ort", "transformer", "fp16", "int8-dynamic", "int8-static", "bf16-torch"}
    assert candidates["fp32"]["status"] == "passed", candidates["fp32"]["reason"]
    bf16 = candidates["bf16-torch"]
    if cpu_computes_bfloat16():
        assert bf16["status"] == "passed", bf16["reason"]
        assert (output / "torch_mlp-bf16-torch" / "1" / "model.pt2").is_file()
        config = (output / "torch_mlp-bf16-torch" / "config.pbtxt").read_text()
        assert 'platform: "pytorch_libtorch"' in config and 'string_value: "bfloat16"' in config
    else:
        assert bf16["status"] == "skipped" and "no bfloat16 arithmetic" in str(bf16["reason"])
    # Validated against the original: the torch.export program, run by inferd's PyTorch runtime.
    assert candidates[""]["reference"] == str(source)
    config = (output / "torch_mlp" / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in config and "max_batch_size: 8" in config


def test_a_candidate_outside_its_tolerance_is_reported_and_not_written(tmp_path: Path) -> None:
    mlp_model(tmp_path / "mlp" / "1" / "model.onnx", seed=4)
    output = tmp_path / "out"
    # No INT8 port keeps every element within 1e-9 of the original: the gate must say no.
    result = optimize(str(tmp_path / "mlp"), "-o", str(output), "--candidates", "fp32,int8-dynamic",
                      "--tolerance", "int8:atol=1e-9")  # fmt: skip
    assert result.returncode == 0, result.stderr
    candidates = record(output)
    assert candidates["int8-dynamic"]["status"] == "rejected"
    assert "|diff| max" in str(candidates["int8-dynamic"]["reason"])
    assert not (output / "mlp-int8-dynamic").exists()
    assert candidates[""]["winner"] == "fp32" and (output / "mlp" / "1" / "model.onnx").is_file()
    # Nothing passes: exit 1, nothing written as the winner.
    none = optimize(str(tmp_path / "mlp"), "-o", str(tmp_path / "none"), "--candidates", "int8-dynamic",
                    "--tolerance", "int8:atol=1e-9")  # fmt: skip
    assert none.returncode == 1 and "no candidate passed" in none.stdout
    assert not (tmp_path / "none" / "mlp").exists()
    # The same output again would overwrite the winner's version: refused, one line.
    again = optimize(str(tmp_path / "mlp"), "-o", str(output), "--candidates", "fp32")
    assert again.returncode == 1 and "exists: choose another --version" in again.stderr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["missing.onnx"], "does not exist"),
        (["MLP", "--candidates", "fp32,int4"], "unknown candidates ['int4']"),
        (["MLP", "--tolerance", "int4:atol=1"], "PRECISION:key=value"),
        (["MLP", "--calibration", "missing.npz", "--candidates", "int8-static"], "calibration file"),
        (["MINILM"], "takes token ids"),
    ],
)
def test_bad_arguments_are_one_line_errors(
    arguments: list[str], message: str, tmp_path: Path, pipeline_repository: Path
) -> None:
    mlp_model(tmp_path / "mlp" / "1" / "model.onnx")
    replaced = [
        str(tmp_path / "mlp") if a == "MLP" else str(pipeline_repository / "minilm") if a == "MINILM" else a
        for a in arguments
    ]
    result = optimize(*replaced, "-o", str(tmp_path / "out"))
    assert result.returncode in (1, 2) and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.timeout(600)
def test_a_hugging_face_folder_s_bf16_torch_candidate_is_validated_and_served(tmp_path: Path) -> None:
    """MiniLM from its Hugging Face folder: the FP32 ONNX export is the reference; bf16-torch is the
    same encoder as a float32 torch.export program run under bfloat16 autocast. Its folder serves
    as it was validated."""
    pairs = tmp_path / "pairs.tsv"
    lines = (REPO_ROOT / "examples" / "sentence_pairs.tsv").read_text(encoding="utf-8").splitlines()
    pairs.write_text("\n".join(lines[:21]) + "\n", encoding="utf-8")
    output = tmp_path / "out"
    result = optimize(str(minilm_files()), "-o", str(output), "--name", "minilm", "--inputs", str(pairs),
                      "--candidates", "fp32,bf16-torch,bf16-tf")  # fmt: skip
    assert result.returncode == 0, result.stderr
    candidates = record(output)
    assert candidates["bf16-tf"]["status"] == "skipped"
    bf16 = candidates["bf16-torch"]
    if not cpu_computes_bfloat16():
        assert bf16["status"] == "skipped" and "no bfloat16 arithmetic" in str(bf16["reason"])
        return
    assert bf16["status"] == "passed", bf16["reason"]
    validation = bf16["validation"]
    assert isinstance(validation, dict)
    similarity, embedding = validation["outputs"]
    # Computed in bfloat16: not the FP32 answers, yet no decision flipped.
    assert similarity["flips"] == 0 and 0 < similarity["abs_diff_max"] < 0.05 and embedding["cosine_min"] > 0.995

    encoding = Tokenizer.from_file(str(minilm_files() / "tokenizer.json")).encode(lines[1].split("\t")[0])
    inputs = {
        "input_ids": np.array([encoding.ids], dtype=np.int64),
        "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
        "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
    }
    with run_server(output, tmp_path / "server.log", "--model-control-mode", "explicit",
                    "--load-model", "minilm-bf16-torch", "--load-model", "minilm-fp32") as server:  # fmt: skip
        client = Client(f"http://{server.http_url}")
        try:
            served = client.infer("minilm-bf16-torch", inputs).as_numpy("sentence_embedding")
            original = client.infer("minilm-fp32", inputs).as_numpy("sentence_embedding")
        finally:
            client.close()
    assert served.dtype == np.float32 and served.shape == (1, 384)
    cosine = float(np.dot(served[0], original[0]) / (np.linalg.norm(served[0]) * np.linalg.norm(original[0])))
    assert cosine > 0.995 and not np.array_equal(served, original)

"""`inferd validate` through its CLI: identical models pass, a perturbed one fails (exit 1) and
says where, score and class outputs are judged by their decisions, inputs come from files or the
metadata, one side may be a running server, sentence pairs on all-MiniLM-L6-v2, and the report."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inferd.testing.models import add_sub_model, cross_encoder_program, minilm_files, mlp_model
from inferd.testing.server import ServerProcess

pytestmark = pytest.mark.e2e
REPO_ROOT = Path(__file__).resolve().parents[2]


def validate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferd", "validate", *args], capture_output=True, text=True, timeout=300
    )


def perturbed_copy(source: Path, target: Path, scale: float) -> Path:
    """`source` with every float weight multiplied by (1 + noise * scale): a deliberately different
    port (shapes and other integer constants left as they are)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    rng = np.random.default_rng(7)
    for initializer in model.graph.initializer:
        weights = numpy_helper.to_array(initializer)
        if weights.dtype.kind != "f":
            continue
        noisy = weights * (1 + rng.standard_normal(weights.shape) * scale)
        noisy = np.where(np.abs(weights) > 1e30, weights, noisy)  # a mask's "minus infinity" stays one
        initializer.CopyFrom(numpy_helper.from_array(noisy.astype(weights.dtype), initializer.name))
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(target))
    return target


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mlp") / "model.onnx"
    mlp_model(path, seed=3)
    return path


def test_an_identical_model_passes_and_a_perturbed_one_fails(mlp: Path, tmp_path: Path) -> None:
    same = validate(str(mlp), str(mlp.parent))
    assert same.returncode == 0, same.stderr
    assert "y" in same.stdout and "pass" in same.stdout and "FAIL" not in same.stdout
    perturbed = perturbed_copy(mlp, tmp_path / "perturbed" / "model.onnx", scale=0.05)
    different = validate(str(mlp), str(perturbed))
    assert different.returncode == 1, different.stderr
    assert "FAIL: |diff| max" in different.stdout
    # Looser tolerances can accept it: the gate is what the user sets.
    loose = validate(str(mlp), str(perturbed), "--atol", "10", "--min-cosine", "0.5")
    assert loose.returncode == 0, loose.stdout


def test_class_and_score_outputs_are_judged_by_their_decisions(mlp: Path, tmp_path: Path) -> None:
    perturbed = perturbed_copy(mlp, tmp_path / "p" / "model.onnx", scale=0.3)
    report_dir = tmp_path / "report"
    result = validate(
        str(mlp), str(perturbed), "--classes", "y", "--atol", "0", "--min-cosine", "0", "--samples", "200",
        "--report", str(report_dir),
    )  # fmt: skip
    record = json.loads((report_dir / "validate.json").read_text())
    (output,) = record["outputs"]
    assert output["kind"] == "classes" and output["samples"] == 200
    assert output["top1_disagreements"] > 0 and result.returncode == 1 and not record["passed"]
    assert "top-1 class differs" in output["failures"][0]
    assert (report_dir / "diffs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tolerated = validate(
        str(mlp), str(perturbed), "--classes", "y", "--atol", "0", "--min-cosine", "0", "--samples", "200",
        "--max-top1", str(output["top1_disagreements"]),
    )  # fmt: skip
    assert tolerated.returncode == 0, tolerated.stdout
    scored = validate(str(mlp), str(perturbed), "--scores", "y", "--threshold", "0", "--atol", "0", "--min-cosine", "0")
    assert scored.returncode == 1 and "decisions flip at threshold 0" in scored.stdout


def test_inputs_from_files_and_a_server_as_one_side(server: ServerProcess, repository: Path, tmp_path: Path) -> None:
    add_sub = repository / "add_sub" / "1" / "model.onnx"
    values = np.random.default_rng(0).random((5, 16), dtype=np.float32)
    jsonl = tmp_path / "inputs.jsonl"
    jsonl.write_text("\n".join(json.dumps({"INPUT0": v.tolist(), "INPUT1": (v * 2).tolist()}) for v in values))
    npz = tmp_path / "inputs.npz"
    np.savez(npz, INPUT0=values, INPUT1=values * 2)
    for inputs in (jsonl, npz):
        result = validate(str(add_sub), f"http://{server.http_url}/add_sub", "--inputs", str(inputs))
        assert result.returncode == 0, result.stderr + result.stdout
        assert "5 samples" in result.stdout
    # The served model against a different one: a server is judged like a file.
    other = tmp_path / "add_sub_32" / "model.onnx"
    add_sub_model(other, size=16)
    assert validate(f"grpc://{server.grpc_url}/add_sub", str(other)).returncode == 0


def test_sentence_pairs_on_minilm(pipeline_repository: Path, pipeline_server: ServerProcess, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text(
        "".join((REPO_ROOT / "examples" / "sentence_pairs.tsv").read_text().splitlines(keepends=True)[:25])
    )
    minilm = pipeline_repository / "minilm"
    tokenizer = minilm_files() / "tokenizer.json"
    report_dir = tmp_path / "report"
    result = validate(str(minilm), str(minilm / "1" / "model.onnx"), "--inputs", str(pairs), "--tokenizer",
                      str(tokenizer), "--report", str(report_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    record = json.loads((report_dir / "validate.json").read_text())
    assert (
        record["mode"] == "pairs"
        and record["samples"] == 24
        and set(record["label_accuracy"]) == {"reference", "candidate"}
    )
    similarity = record["outputs"][0]
    assert similarity["name"] == "similarity" and similarity["flips"] == 0 and similarity["abs_diff_max"] == 0
    # The served text pipeline (tokenizer → minilm → mean pooling) against the ONNX file tokenized here.
    served = validate(f"http://{pipeline_server.http_url}/sentence_embedding", str(minilm), "--inputs", str(pairs),
                      "--tokenizer", str(tokenizer), "--atol", "1e-4")  # fmt: skip
    assert served.returncode == 0, served.stderr + served.stdout


def test_the_published_regression_check_on_0_to_5_scores(pipeline_repository: Path, tmp_path: Path) -> None:
    """As the published BF16 check ran it: MiniLM's 5 x cosine as a 0-5 score, threshold 3, flips
    between the two sides, F1 of each against gold 0-5 labels binarized at 3, |diff| on the scale."""
    pairs = tmp_path / "graded.tsv"
    pairs.write_text(
        "sentence_a\tsentence_b\tscore\n"
        "A man is playing a guitar.\tSomeone plays the guitar.\t4.6\n"
        "A woman is slicing an onion.\tA woman cuts an onion.\t4.8\n"
        "The cat sat on the mat.\tA stock market report for today.\t0.0\n"
        "Two dogs run in a field.\tTwo dogs are sleeping on a couch.\t1.6\n"
    )
    minilm = pipeline_repository / "minilm"
    report_dir = tmp_path / "report"
    perturbed = perturbed_copy(minilm / "1" / "model.onnx", tmp_path / "perturbed" / "model.onnx", scale=0.02)
    result = validate(str(minilm), str(perturbed), "--inputs", str(pairs), "--tokenizer",
                      str(minilm_files() / "tokenizer.json"), "--score-scale", "5", "--threshold", "3",
                      "--atol", "0", "--min-cosine", "0", "--report", str(report_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    record = json.loads((report_dir / "validate.json").read_text())
    similarity = record["outputs"][0]
    assert similarity["flips"] == 0 and 0 < similarity["abs_diff_max"] < 5  # on the 0-5 scale
    assert record["label_f1"] == {"reference": 1.0, "candidate": 1.0}  # the two alike pairs, and only they, above 3
    assert "F1 1.0000" in " ".join(result.stdout.split())


def test_the_regression_check_on_a_cross_encoder_in_bfloat16_against_float32(tmp_path: Path) -> None:
    """The form a cross-encoder (a model reading both sentences) takes: its logit through a sigmoid,
    x 5; the same program computing in bfloat16 (MIXED_PRECISION) as the candidate. The scores
    are checked against torch's own on the pairs encoded together, with the threshold put between
    the two sides' scores of one pair, so that its decision flips by construction."""
    import torch
    from tokenizers import Tokenizer

    reference, candidate = tmp_path / "cross", tmp_path / "cross-bf16"
    cross_encoder_program(reference / "1" / "model.pt2", seed=3)
    (candidate / "1").mkdir(parents=True)
    shutil.copyfile(reference / "1" / "model.pt2", candidate / "1" / "model.pt2")
    (candidate / "config.pbtxt").write_text('parameters { key: "MIXED_PRECISION" value { string_value: "bfloat16" } }')
    rows = [
        ("A man is playing a guitar.", "Someone plays the guitar.", 4.6),
        ("The cat sat on the mat.", "A stock market report for today.", 0.0),
        ("Two dogs run in a field.", "Two dogs are sleeping on a couch.", 1.6),
    ]
    pairs = tmp_path / "graded.tsv"
    pairs.write_text("".join(f"{a}\t{b}\t{label}\n" for a, b, label in rows))

    program = torch.export.load(str(reference / "1" / "model.pt2")).module()
    tokenizer = Tokenizer.from_file(str(minilm_files() / "tokenizer.json"))

    def score(a: str, b: str, bfloat16: bool) -> float:
        encoding = tokenizer.encode(a, b)
        tensors = [torch.tensor([ids]) for ids in (encoding.ids, encoding.attention_mask, encoding.type_ids)]
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            return 5 * float(torch.sigmoid(program(*tensors).float()).reshape(()))

    expected = np.array([[score(a, b, bf16) for bf16 in (False, True)] for a, b, _ in rows])
    threshold = float(expected[0].mean())  # between the two sides' scores of the first pair
    flips = int(np.sum((expected[:, 0] > threshold) != (expected[:, 1] > threshold)))
    assert flips >= 1 and expected[0, 0] != expected[0, 1]
    report_dir = tmp_path / "report"
    result = validate(str(reference), str(candidate), "--inputs", str(pairs), "--tokenizer",
                      str(minilm_files() / "tokenizer.json"), "--score-activation", "sigmoid", "--score-scale", "5",
                      "--threshold", repr(threshold), "--atol", "0.05", "--max-flips", "3",
                      "--report", str(report_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    record = json.loads((report_dir / "validate.json").read_text())
    assert record["pair_model"] == "cross-encoder" and record["samples"] == 3
    [similarity] = record["outputs"]  # a score a pair: no embeddings to compare
    assert similarity["name"] == "similarity" and similarity["flips"] == flips
    assert similarity["abs_diff_max"] == pytest.approx(np.abs(expected[:, 0] - expected[:, 1]).max(), abs=1e-5)
    assert set(record["label_f1"]) == {"reference", "candidate"}
    assert "per pair" in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("missing.onnx", "also_missing.onnx"), "is neither a model file or folder nor a server model"),
        (("{mlp}", "{mlp}", "--inputs", "nope.npz"), "does not exist"),
        (("{mlp}", "{mlp}", "--output", "z"), "outputs ['z'] are not outputs of both models"),
        (("{mlp}", "{mlp}", "--inputs", "pairs.tsv"), "does not exist"),
        (("{mlp}", "http://127.0.0.1:1"), "name the model after the server"),
    ],
)
def test_what_cannot_run_is_a_one_line_error_with_exit_2(mlp: Path, args: tuple[str, ...], message: str) -> None:
    result = validate(*(a.format(mlp=mlp) for a in args))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr

"""Which runtime a model version gets: named by its config, else told by its model file."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.config.model import ModelConfig
from inferd.errors import ModelLoadError
from inferd.runtimes import ONNX, PYTHON, PYTORCH, TENSORFLOW, detect_runtime, runtime_kind


@pytest.mark.parametrize(
    ("files", "kind"),
    [
        (["model.onnx"], ONNX),
        (["model.pt"], PYTORCH),
        (["model.pt2"], PYTORCH),
        (["model.py"], PYTHON),
        (["helper.py", "model.onnx"], ONNX),  # only model.py makes a Python model
        (["exported.onnx"], ONNX),
        (["model.savedmodel"], TENSORFLOW),  # Triton's layout (a folder)
        (["saved_model.pb", "variables"], TENSORFLOW),  # TF Serving's
        (["graph.pb"], None),  # a .pb of any other name is not a SavedModel
        (["notes.txt"], None),
    ],
)
def test_the_model_file_tells_the_runtime(tmp_path: Path, files: list[str], kind: object) -> None:
    for name in files:
        (tmp_path / name).write_bytes(b"")
    assert detect_runtime(tmp_path) is kind


@pytest.mark.parametrize(
    ("platform", "backend", "kind"),
    [
        ("onnxruntime_onnx", "", ONNX),
        ("", "onnxruntime", ONNX),
        ("pytorch_libtorch", "", PYTORCH),
        ("", "pytorch", PYTORCH),
        ("", "python", PYTHON),
        ("tensorflow_savedmodel", "", TENSORFLOW),
        ("", "tensorflow", TENSORFLOW),
    ],
)
def test_the_config_names_the_runtime(tmp_path: Path, platform: str, backend: str, kind: object) -> None:
    (tmp_path / "model.onnx").write_bytes(b"")  # the config wins over the file
    assert runtime_kind(ModelConfig(name="m", platform=platform, backend=backend), tmp_path) is kind


def test_unknown_names_and_missing_files_say_what_is_supported(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="platform/backend 'tensorflow_graphdef' is not supported"):
        runtime_kind(ModelConfig(name="m", platform="tensorflow_graphdef"), tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"no model file in .* tells one .*found: weights\.bin"):
        runtime_kind(ModelConfig(name="m"), tmp_path)

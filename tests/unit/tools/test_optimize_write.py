"""What `inferd optimize` writes into a model folder that already holds versions: only a version
of the same platform, or the folder's other versions would stop loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.tools import model_config
from inferd.tools.optimize.run import OptimizeError, _check_platform


def test_a_version_of_another_platform_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    model_config.write(tmp_path / "m", model_config.new_message("m", "onnxruntime_onnx", 8))
    _check_platform(tmp_path / "m", model_config.new_message("m", "onnxruntime_onnx", 8))  # the same: fine
    _check_platform(tmp_path / "new", model_config.new_message("m", "pytorch_libtorch", 8))  # no folder yet: fine
    with pytest.raises(OptimizeError, match=r"holds versions of onnxruntime_onnx, and this version would be "
                                            r"pytorch_libtorch"):  # fmt: skip
        _check_platform(tmp_path / "m", model_config.new_message("m", "pytorch_libtorch", 8))

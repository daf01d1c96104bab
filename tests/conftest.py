"""What every test's servers share."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

ONNX_CACHE_VARIABLE = "INFERD_ONNX_CACHE_DIR"


def pytest_configure(config: pytest.Config) -> None:
    # Servers the tests start keep ONNX Runtime's optimized models in this run's own folder, not
    # in the user's cache; the tests that look at the cache give their servers one of their own.
    if ONNX_CACHE_VARIABLE not in os.environ:
        folder = tempfile.mkdtemp(prefix="inferd-onnx-cache-")
        os.environ[ONNX_CACHE_VARIABLE] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))

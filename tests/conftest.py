"""What every test's servers share."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

import pytest

ONNX_CACHE_VARIABLE = "INFERD_ONNX_CACHE_DIR"


def pytest_configure(config: pytest.Config) -> None:
    # Servers the tests start keep ONNX Runtime's optimized models in this run's own folder, not
    # in the user's cache; the tests that look at the cache give their servers one of their own.
    if ONNX_CACHE_VARIABLE not in os.environ:
        folder = tempfile.mkdtemp(prefix="inferd-onnx-cache-")
        os.environ[ONNX_CACHE_VARIABLE] = folder
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.fixture(scope="session", autouse=True)
def tensorflow_stays_out_of_this_process() -> Iterator[None]:
    """TensorFlow's bundled libraries crash OR-Tools' solver in a process where both ran: tests run
    TensorFlow in processes of their own (inferd.testing.isolated), never in the test run's."""
    yield
    assert "tensorflow" not in sys.modules, "a test imported TensorFlow in the test run's process"

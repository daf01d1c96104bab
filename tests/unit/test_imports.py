"""`import inferd` stays light, and the layer contracts (pyproject.toml) hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEAVY = ("onnxruntime", "torch", "grpc", "starlette", "uvicorn", "tritonclient", "google.protobuf", "opentelemetry")


def test_import_inferd_is_light() -> None:
    code = (
        "import sys, inferd, inferd.types, inferd.errors, inferd.config.model, inferd.cli.main\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "[]"


def test_a_server_without_pytorch_or_tensorflow_models_never_imports_either() -> None:
    code = (
        "import sys, inferd.server.app, inferd.runtimes, inferd.runtimes.onnx, inferd.runtimes.python\n"
        "print([m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules])"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "[]"


def test_a_server_that_does_not_trace_never_imports_opentelemetry() -> None:
    code = (
        "import sys, inferd.server.app, inferd.server.http, inferd.server.grpc, inferd.cli.serve, inferd.core.service\n"
        "print([m for m in sys.modules if m.startswith('opentelemetry')])"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == "[]"


def test_layer_contracts() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    completed = subprocess.run(
        [str(lint_imports)], capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2], check=False
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr

"""Seldon MLServer 1.7.1 serving an ONNX model through the custom runtime in mlserver_runtime.py,
with adaptive batching on, in ONE process (parallel_workers 0) like inferd. Writes a temporary model
repository (settings.json + <MODEL_NAME>/model-settings.json), runs `mlserver start` on it in this
process, and removes it when MLServer stops (SIGTERM or SIGINT: MLServer's own handlers).

    scripts/install_baselines.sh mlserver
    .venv-mlserver/bin/python benchmarks/baselines/mlserver_server.py MODEL.onnx MODEL_NAME PORT

Serves KServe v2 at http://127.0.0.1:PORT/v2/models/MODEL_NAME/infer.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# Adaptive batching as a user would turn it on: MLServer's model-settings names.
MAX_BATCH_SIZE = 32
MAX_BATCH_TIME_S = 0.001


def write_repository(root: Path, model_path: Path, model_name: str, port: int) -> None:
    settings: dict[str, Any] = {
        "host": "127.0.0.1",
        "http_port": port,
        # gRPC cannot be switched off in 1.7.1 (MLServer.start always starts it): port 0 lets the
        # OS pick a free one so it never clashes.
        "grpc_port": 0,
        # 0 = inference runs in this process; the default (1) adds a worker process and IPC.
        "parallel_workers": 0,
        # None disables the metrics server on its own port and the Prometheus REST middleware.
        "metrics_endpoint": None,
        # debug (default true) turns on uvicorn's access log; inferd and the floor server have none.
        "debug": False,
    }
    model_settings: dict[str, Any] = {
        "name": model_name,
        "implementation": "mlserver_runtime.OnnxRuntimeModel",
        "max_batch_size": MAX_BATCH_SIZE,
        "max_batch_time": MAX_BATCH_TIME_S,
        "parameters": {"uri": str(model_path.resolve())},
    }
    (root / "settings.json").write_text(json.dumps(settings, indent=2))
    (root / model_name).mkdir()
    (root / model_name / "model-settings.json").write_text(json.dumps(model_settings, indent=2))


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    model_path, model_name, port = Path(argv[0]), argv[1], int(argv[2])
    if not model_path.is_file():
        print(f"no such model file: {model_path}", file=sys.stderr)
        return 2
    # The runtime module is found on sys.path; inference stays in this process, so this suffices.
    sys.path.insert(0, str(HERE))
    from mlserver.cli.main import main as mlserver_main

    with tempfile.TemporaryDirectory(prefix="mlserver-repo-") as folder:
        write_repository(Path(folder), model_path, model_name, port)
        sys.argv = ["mlserver", "start", folder]
        try:
            mlserver_main()  # click: installs uvloop, serves until a signal, then raises SystemExit
        except SystemExit as exit_:
            return exit_.code if isinstance(exit_.code, int) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

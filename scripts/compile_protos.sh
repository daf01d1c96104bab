#!/usr/bin/env bash
# Regenerate the Python modules of protos/ (TF Serving's messages and services, trimmed; see the
# .proto files) into src/inferd/protocol/tfserving_pb/. The generated files are committed: neither installing
# nor running inferd needs protoc. grpcio-tools 1.72 writes code for protobuf >= 6.30, the oldest
# runtime tritonclient[grpc] allows (a newer grpcio-tools would demand protobuf 7, which it refuses),
# so it runs from a venv of its own:
#   python3 -m venv /tmp/protoc && /tmp/protoc/bin/pip install grpcio-tools==1.72.1
#   PYTHON=/tmp/protoc/bin/python scripts/compile_protos.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" -m grpc_tools.protoc -I protos --python_out=src --pyi_out=src --grpc_python_out=src \
    protos/inferd/protocol/tfserving_pb/tensorflow.proto protos/inferd/protocol/tfserving_pb/tensorflow_serving.proto
touch src/inferd/protocol/tfserving_pb/__init__.py

#!/usr/bin/env bash
# Install TF Serving's official Python client (tensorflow-serving-api, which pulls the full
# tensorflow: about 570 MB) into its own venv, .venv-tfserving/ at the repo root, so it never
# touches the project's venv: the compatibility tests of inferd's TF Serving gRPC door run it
# as a subprocess. Idempotent: a stamp file records a working install; a second run returns at once.
# Prints the venv's python on stdout.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV="$(pwd)/.venv-tfserving"
STAMP="$VENV/.installed"
TFSERVING_API_VERSION="${TFSERVING_API_VERSION:-2.19.0}"
PYTHON="${PYTHON:-python3}"

if [[ -f "$STAMP" ]] && "$VENV/bin/python" -c "import tensorflow_serving.apis.prediction_service_pb2_grpc" 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi
echo "install_tfserving_client: creating $VENV (tensorflow-serving-api==$TFSERVING_API_VERSION, with tensorflow)" >&2
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "tensorflow-serving-api==$TFSERVING_API_VERSION"
"$VENV/bin/python" -c "import tensorflow_serving.apis.prediction_service_pb2_grpc, tensorflow" >/dev/null
touch "$STAMP"
echo "$VENV/bin/python"

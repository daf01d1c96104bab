#!/usr/bin/env bash
# Install the third-party baseline servers for benchmarks/, each in its own venv at the repo
# root so their pins never touch the project's main venv:
#   .venv-mlserver  Seldon MLServer 1.7.1 (benchmarks/baselines/mlserver_server.py)
#   .venv-fastapi   FastAPI + uvicorn[standard] (benchmarks/baselines/fastapi_server.py)
# Idempotent: a venv whose pinned versions already import is left alone (about 1 s).
# Quiet: pip's output is shown only when it fails. Exits non-zero on any failure.
# Usage: scripts/install_baselines.sh [mlserver] [fastapi]   (no argument: both)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
PYTHON="${PYTHON:-python3}"

# ONNX Runtime and NumPy match the main venv's, so only the serving stack differs.
ORT_VERSION="${ORT_VERSION:-1.32.0}"
NUMPY_VERSION="${NUMPY_VERSION:-2.4.6}"

# mlserver 1.7.1's own requirements are unbounded; newer protobuf (7), fastapi (0.116+) and
# uvloop (0.22+) break it at import or at start, hence the upper bounds in the same pip call.
MLSERVER_PINS=(
  "mlserver==1.7.1" "protobuf<7" "fastapi<0.116" "uvloop<0.22"
  "onnxruntime==$ORT_VERSION" "numpy==$NUMPY_VERSION"
)
MLSERVER_CHECK='import importlib.metadata as m, mlserver, onnxruntime, numpy; assert m.version("mlserver") == "1.7.1"'

FASTAPI_PINS=(
  "fastapi==0.165.0" "uvicorn[standard]==0.54.0"
  "onnxruntime==$ORT_VERSION" "numpy==$NUMPY_VERSION"
)
FASTAPI_CHECK='import importlib.metadata as m, fastapi, uvicorn, uvloop, httptools, onnxruntime, numpy; assert m.version("fastapi") == "0.165.0"'

log() { echo "install_baselines: $*" >&2; }

# install VENV_DIR CHECK_CODE PIN...
install() {
  local venv="$ROOT/$1" check="$2"
  shift 2
  if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$check" >/dev/null 2>&1; then
    return 0
  fi
  log "installing $(basename "$venv"): $*"
  local piplog
  piplog="$(mktemp)"
  if ! { [[ -x "$venv/bin/python" ]] || "$PYTHON" -m venv "$venv"; } >"$piplog" 2>&1 ||
     ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" >>"$piplog" 2>&1; then
    cat "$piplog" >&2; rm -f "$piplog"; log "pip install into $venv failed"; return 1
  fi
  rm -f "$piplog"
  if ! "$venv/bin/python" -c "$check"; then
    log "$venv does not import after install"; return 1
  fi
}

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(mlserver fastapi)
for target in "${targets[@]}"; do
  case "$target" in
    mlserver) install .venv-mlserver "$MLSERVER_CHECK" "${MLSERVER_PINS[@]}" ;;
    fastapi) install .venv-fastapi "$FASTAPI_CHECK" "${FASTAPI_PINS[@]}" ;;
    *) log "unknown baseline: $target (mlserver, fastapi)"; exit 2 ;;
  esac
done

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
# uvloop (0.22+) are known to break it, hence the upper bounds in the same pip call.
MLSERVER_PINS=(
  "mlserver==1.7.1" "protobuf<7" "fastapi<0.116" "uvloop<0.22"
  "onnxruntime==$ORT_VERSION" "numpy==$NUMPY_VERSION"
)
MLSERVER_MODULES="mlserver onnxruntime numpy"

FASTAPI_PINS=(
  "fastapi==0.165.0" "uvicorn[standard]==0.54.0"
  "onnxruntime==$ORT_VERSION" "numpy==$NUMPY_VERSION"
)
FASTAPI_MODULES="fastapi uvicorn uvloop httptools onnxruntime numpy"

log() { echo "install_baselines: $*" >&2; }

# Exits 0 when every "name==version" pin is installed at that version and MODULES import.
CHECK='
import importlib, importlib.metadata as m, sys
modules, pins = sys.argv[1].split(), sys.argv[2:]
for pin in pins:
    name, _, version = pin.partition("==")
    installed = m.version(name.split("[")[0])  # raises when absent
    if version and installed != version:
        sys.exit(f"{name} is {installed}, want {version}")
for module in modules:
    importlib.import_module(module)
'

# install VENV_DIR MODULES PIN...
install() {
  local venv="$ROOT/$1" modules="$2"
  shift 2
  if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "$CHECK" "$modules" "$@" >/dev/null 2>&1; then
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
  if ! "$venv/bin/python" -c "$CHECK" "$modules" "$@"; then
    log "$venv does not match its pins after install"; return 1
  fi
}

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(mlserver fastapi)
for target in "${targets[@]}"; do
  case "$target" in
    mlserver) install .venv-mlserver "$MLSERVER_MODULES" "${MLSERVER_PINS[@]}" ;;
    fastapi) install .venv-fastapi "$FASTAPI_MODULES" "${FASTAPI_PINS[@]}" ;;
    *) log "unknown baseline: $target (mlserver, fastapi)"; exit 2 ;;
  esac
done

#!/usr/bin/env bash
# Install NVIDIA Triton's real C++ perf_analyzer into its own venv, .venv-perf/
# at the repo root, so its pins never touch the project's main venv.
# Idempotent: returns at once when scripts/perf_analyzer already works.
# Prints the wrapper's path (scripts/perf_analyzer) on stdout.
#
# The binary ships in tritonclient's manylinux wheel (tritonclient-<v>.data/
# data/bin/perf_analyzer -> <venv>/bin/); the PyPI "perf-analyzer" project is
# a placeholder. Wheels 2.52-2.60 also carry it but need GLIBC_2.38 (Debian 12
# has 2.36); 2.61+ do not carry it. 2.51.0 also runs here (override with
# TRITONCLIENT_VERSION=2.51.0). It links libcudart.so.12 (from
# nvidia-cuda-runtime-cu12; only cudaMalloc/cudaFree/... symbols, loaded but
# unused without a GPU) and libb64.so.0d (Debian libb64-0d).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
VENV="$ROOT/.venv-perf"
WRAPPER="$ROOT/scripts/perf_analyzer"
TRITONCLIENT_VERSION="${TRITONCLIENT_VERSION:-2.50.0}"
CUDART_VERSION="${CUDART_VERSION:-12.6.77}"
PYTHON="${PYTHON:-python3}"

log() { echo "install_perf_analyzer: $*" >&2; }

works() {
  # --version prints e.g. "perf_analyzer 2.50.0..." and exits 0 when every
  # shared library resolves.
  "$WRAPPER" --version >/dev/null 2>&1
}

if works; then
  echo "$WRAPPER"
  exit 0
fi

if [[ ! -x "$VENV/bin/perf_analyzer" ]]; then
  log "creating $VENV (tritonclient==$TRITONCLIENT_VERSION, nvidia-cuda-runtime-cu12==$CUDART_VERSION)"
  [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    --only-binary=:all: \
    "tritonclient==$TRITONCLIENT_VERSION" \
    "nvidia-cuda-runtime-cu12==$CUDART_VERSION"
fi
[[ -x "$VENV/bin/perf_analyzer" ]] || { log "no perf_analyzer in $VENV/bin after pip install"; exit 1; }

# System libraries the binary still lacks, mapped to Debian packages.
missing_pkgs() {
  local lib
  { LD_LIBRARY_PATH="$(echo "$VENV"/lib/python3*/site-packages/nvidia/cuda_runtime/lib)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      ldd "$VENV/bin/perf_analyzer" || true; } | awk '/not found/ {print $1}' |
  while read -r lib; do
    case "$lib" in
      libb64.so.0d) echo libb64-0d ;;
      libssl.so.3|libcrypto.so.3) echo libssl3 ;;
      libz.so.1) echo zlib1g ;;
      libstdc++.so.6) echo libstdc++6 ;;
      libgcc_s.so.1) echo libgcc-s1 ;;
      *) log "unresolved library with no known package: $lib" ;;
    esac
  done | sort -u
}

pkgs="$(missing_pkgs)"
if [[ -n "$pkgs" ]]; then
  SUDO=""
  [[ "$(id -u)" -eq 0 ]] || SUDO="sudo"
  log "apt-get install $(echo $pkgs)"
  aptlog="$(mktemp)"
  # shellcheck disable=SC2086
  if ! { $SUDO apt-get update -qq &&
         $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $pkgs; } >"$aptlog" 2>&1; then
    cat "$aptlog" >&2; rm -f "$aptlog"; log "apt-get failed"; exit 1
  fi
  rm -f "$aptlog"
fi

if ! works; then
  log "perf_analyzer still fails to run:"
  "$WRAPPER" --version >&2 || true
  exit 1
fi
echo "$WRAPPER"

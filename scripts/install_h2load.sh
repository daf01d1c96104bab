#!/usr/bin/env bash
# h2load (Debian's nghttp2-client): the open-loop load generator of benchmarks/overload.py, which
# starts connections at a fixed rate whatever the server answers (wrk and perf_analyzer wait).
# Installs only when no h2load is on the machine; needs root or sudo for apt-get.
set -euo pipefail
if command -v h2load >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
echo "install_h2load: apt-get install nghttp2-client"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q nghttp2-client >/dev/null || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q nghttp2-client >/dev/null; }

#!/usr/bin/env bash
# Prometheus (Debian's) for the fleet rollout tests: a test starts its own on 127.0.0.1, scraping
# the replicas every second, and the rollout controller judges from its PromQL.
# Installs only when no prometheus is on the machine; needs root or sudo for apt-get.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
echo "install_prometheus: apt-get install --no-install-recommends prometheus"
export DEBIAN_FRONTEND=noninteractive
install() { $SUDO apt-get install -y -q --no-install-recommends prometheus >/dev/null; }
install || { $SUDO apt-get update -q >/dev/null && install; }
# The package may start a system Prometheus on port 9090; the tests run their own, so stop that one.
$SUDO service prometheus stop >/dev/null 2>&1 || true

#!/usr/bin/env bash
# redis-server (Debian's) for the async inference tests (a shared Redis Streams job queue).
# Installs only when no redis-server is on the machine; needs root or sudo for apt-get.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
echo "install_redis: apt-get install redis-server"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q redis-server >/dev/null || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q redis-server >/dev/null; }
# The package may start a system redis on 6379; the tests run their own, so stop that one.
$SUDO service redis-server stop >/dev/null 2>&1 || true

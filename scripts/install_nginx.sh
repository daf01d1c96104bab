#!/usr/bin/env bash
# nginx (Debian's nginx-light) for the local fleet tests (inferd fleet up puts it in front of the bins).
# Installs only when no nginx is on the machine; needs root or sudo for apt-get.
set -euo pipefail
if command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ]; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
echo "install_nginx: apt-get install nginx-light"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q nginx-light >/dev/null || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q nginx-light >/dev/null; }
# The package may start a system nginx on port 80; the fleet runs its own, so stop that one.
$SUDO service nginx stop >/dev/null 2>&1 || true

#!/usr/bin/env bash
# Chromium (Debian's), headless, for the docs site test that opens every built page
# (tests/docs/test_browser.py). Installs only when no chromium is on the machine; needs root or
# sudo for apt-get.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
echo "install_chromium: apt-get install chromium"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null \
    || { $SUDO apt-get update -q >/dev/null && $SUDO apt-get install -y -q --no-install-recommends chromium >/dev/null; }

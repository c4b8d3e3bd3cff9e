#!/bin/sh
# Make sure a Prometheus server binary is on PATH (Debian's package), for the end-to-end
# tests and the local demo. Installing needs root (or passwordless sudo).
set -eu
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
  exit 0
fi
echo "[setup] installing Prometheus from Debian's packages"
if [ "$(id -u)" -eq 0 ]; then
  sudo=""
elif command -v sudo >/dev/null 2>&1; then
  sudo="sudo"
else
  echo "Prometheus is not installed and this user cannot install packages;" >&2
  echo "install it (Debian/Ubuntu: apt-get install prometheus) and run again." >&2
  exit 1
fi
$sudo apt-get update -qq
# The package's service is not started: tests and the demo run their own server.
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus

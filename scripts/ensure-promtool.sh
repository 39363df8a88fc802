#!/bin/sh
# Make sure Prometheus' promtool is present (the alerting rules' checks and unit tests use it).
# Installs Debian's prometheus package, which ships it, when missing.
set -eu
if command -v promtool >/dev/null 2>&1; then
    exit 0
fi
echo "promtool is missing; installing Debian's prometheus package" >&2
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO="sudo"
else
    echo "error: run as root, or install Debian's prometheus package (it ships promtool)" >&2
    exit 1
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
# The package starts a Prometheus server where a service manager runs; the tests need only promtool.
command -v promtool >/dev/null 2>&1

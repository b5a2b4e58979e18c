#!/usr/bin/env bash
# Installs Debian's Bazel 4.2.3 (bazel-bootstrap) and its `platforms`
# repository (bazel-platforms) when they are missing. Needs root and apt-get.
# Usage: scripts/install_bazel.sh        (idempotent)
set -euo pipefail

die() { echo "install_bazel: error: $*" >&2; exit 2; }

if command -v bazel >/dev/null 2>&1 && [ -d /usr/share/bazel/platforms ]; then
  exit 0
fi
command -v apt-get >/dev/null 2>&1 \
  || die "no apt-get: install Bazel 4.2.3 and bazel-platforms (/usr/share/bazel/platforms) yourself"
[ "$(id -u)" -eq 0 ] \
  || die "needs root: run 'apt-get install bazel-bootstrap bazel-platforms' as root"
echo "install_bazel: installing bazel-bootstrap and bazel-platforms with apt-get" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap bazel-platforms >/dev/null
command -v bazel >/dev/null 2>&1 || die "apt-get installed no bazel command"
echo "install_bazel: $(command -v bazel) ready" >&2

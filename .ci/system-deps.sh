#!/usr/bin/env bash
# Installs the system packages raylog's tests need when they are missing: a Java 17+ runtime
# (PySpark 4) and kcat (the client compatibility suite). Debian/Ubuntu via apt-get, as root or
# with sudo; elsewhere it says what to install and fails.
set -euo pipefail

need=()
java_major() {
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ] 2>/dev/null; then
  need+=(openjdk-17-jre-headless)
fi
command -v kcat >/dev/null 2>&1 || need+=(kcat)

[ ${#need[@]} -eq 0 ] && exit 0

echo "system-deps: installing ${need[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo=""
elif command -v sudo >/dev/null 2>&1; then
  sudo="sudo"
else
  echo "system-deps: please install: ${need[*]} (not root, no sudo)" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: please install: ${need[*]} (no apt-get on this machine)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${need[@]}"

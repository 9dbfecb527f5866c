#!/usr/bin/env bash
# Check the Debian packages vramlab needs; install them when root with apt, else print the
# exact apt-get line and stop.
set -euo pipefail
pkgs=(cmake pkg-config libopenblas-dev libopenblas-openmp-dev libcmocka-dev libcjson-dev libinih-dev libturbojpeg0-dev libdnnl-dev gnuplot-nox)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
else
  echo "deps: missing packages: ${missing[*]}" >&2
  echo "run: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

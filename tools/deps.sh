#!/usr/bin/env bash
# Check the Debian packages vramlab needs; install them with apt-get when root, or through
# sudo when not root and sudo can run without a password (GitHub's ubuntu runners); else
# print the exact apt-get line and stop.
set -euo pipefail
pkgs=(cmake pkg-config libopenblas-dev libopenblas-openmp-dev libcmocka-dev libcjson-dev libinih-dev libturbojpeg0-dev libdnnl-dev gnuplot-nox libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=()
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo=(sudo -n DEBIAN_FRONTEND=noninteractive)
fi
if command -v apt-get >/dev/null && { [ "$(id -u)" = 0 ] || [ ${#sudo[@]} -gt 0 ]; }; then
  echo "deps: installing ${missing[*]}${sudo[*]:+ (via sudo)}" >&2
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
else
  echo "deps: missing packages: ${missing[*]}" >&2
  echo "run: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

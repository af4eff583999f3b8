#!/usr/bin/env bash
# Installs the Debian packages dptrain needs, only those missing (safe to run any number of times).
# Usage: launch/deps.sh [extra-package ...]
set -euo pipefail
pkgs=(g++ pkg-config meson ninja-build libopenmpi-dev openmpi-bin libcxxopts-dev libgtest-dev
      libdnnl-dev zlib1g-dev nlohmann-json3-dev dataset-fashion-mnist "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "deps: installing ${missing[*]}" >&2
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

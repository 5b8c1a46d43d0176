#!/usr/bin/env bash
# Installs what libwush needs to build and test, on Debian 12 (as root, or with sudo available).
# Packages already present are not touched; nothing is downloaded when all are there.
set -euo pipefail

debs=(
  cmake g++ make pkg-config
  libopenblas-openmp-dev   # OpenMP build of OpenBLAS: libwush parallelizes with OpenMP too
  liblapacke-dev
  libgtest-dev libbenchmark-dev
  nlohmann-json3-dev       # JSON headers of safetensors files
  abigail-tools            # abidw/abidiff for the ABI check
  golang-go                # the Go bindings example (cgo)
  python3
)
command -v cargo >/dev/null 2>&1 || debs+=(cargo)  # the Rust bindings example

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

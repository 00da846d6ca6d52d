#!/usr/bin/env bash
# Installs what transformer-boost needs from Debian packages. Idempotent: when every
# package is already present it does nothing (no apt-get update, no network).
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev ocl-icd-opencl-dev   # oneDNN; its CMake config requires OpenCL headers/ICD
  libhwy-dev                       # Highway SIMD with runtime dispatch
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  nlohmann-json3-dev
  libcli11-dev
  libonnx-dev libprotobuf-dev protobuf-compiler   # ONNX import (graph layer)
  libsentencepiece-dev libicu-dev  # tokenizers: SentencePiece models; Unicode tables, NFD/NFC
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

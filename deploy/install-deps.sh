#!/usr/bin/env bash
# Installs every Debian 12 package that lockstep's build, tests, benchmarks and
# default job need. Idempotent: when everything is present it only checks.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libtorch-dev libgloo-dev
  libopenblas0-pthread
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev
  libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libxxhash-dev zlib1g-dev libpng-dev libjpeg-dev
  dataset-fashion-mnist openssl
  iproute2 util-linux time
  slurmd slurmctld slurm-client munge python3-yaml
  python3-torch python3-numpy python3-torchvision python3-pil
  python3-protobuf python3-crc32c
  chromium
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install-deps: done"

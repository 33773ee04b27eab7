#!/usr/bin/env bash
# Installs every Debian 12 package that lockstep's build, tests, benchmarks and
# default job need, then PyPI's torch (LibTorch with CUDA and NCCL, pinned in
# deploy/requirements.txt) into the project's own virtual environment, .venv.
# Idempotent: when everything is present it only checks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  build-essential cmake ninja-build pkg-config git
  libgloo-dev python3-venv
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev
  libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libxxhash-dev zlib1g-dev libpng-dev libjpeg-dev
  dataset-fashion-mnist openssl
  iproute2 util-linux time
  slurmd slurmctld slurm-client munge python3-yaml
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
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The Python side and LibTorch: .venv, made by Debian's python3 with its
# system packages visible (python3-yaml, python3-protobuf, python3-crc32c for
# the tests), the pinned set on top. Done again only when requirements.txt
# changes (its checksum is kept in the venv).
venv="$root/.venv"
requirements="$root/deploy/requirements.txt"
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [[ -x $venv/bin/python3 && -f $venv/.requirements-sha256 && $(cat "$venv/.requirements-sha256") == "$want" ]] &&
   "$venv/bin/python3" -c "import torch" 2> /dev/null; then
  echo "install-deps: .venv has $(grep '^torch==' "$requirements")"
else
  echo "install-deps: making .venv with $(grep '^torch==' "$requirements") (a few GB from PyPI the first time)"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python3" -m pip install --disable-pip-version-check --no-input -q -r "$requirements"
  echo "$want" > "$venv/.requirements-sha256"
fi
echo "install-deps: done"

#!/usr/bin/env bash
# The GPU checks, for a machine with an NVIDIA GPU and PyTorch (CUDA) in
# Python, that may have neither network nor a compiler for lockstep's
# dependencies: it runs the lockstep packed by tests/device/pack.sh (or a
# lockstep built there, with LOCKSTEP_BIN) against that PyTorch's LibTorch,
# trains the cnn on Fashion-MNIST on the GPU, 2 ranks on the one GPU, fp16
# with the scaler, moves a checkpoint between GPU and CPU, and compares the
# step time with PyTorch DDP on the same GPU. Prints one JSON object; exits
# 1 when a check failed, 2 when there is no GPU to check on.
#   tests/device/run.sh [BUNDLE_DIR]        (default: build-device)
# Environment: LOCKSTEP_PYTHON (a python with torch; default: the first of
# /opt/torch/.venv/bin/python3, .venv/bin/python3, python3 that imports it),
# LOCKSTEP_BIN, OUT (a folder for the JSON and the run folders' logs).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
bundle=${1:-$source_dir/build-device}
python=${LOCKSTEP_PYTHON:-}
if [ -z "$python" ]; then
  for candidate in /opt/torch/.venv/bin/python3 "$source_dir/.venv/bin/python3" python3; do
    if "$candidate" -c 'import torch' 2>/dev/null; then python=$candidate; break; fi
  done
fi
[ -n "$python" ] || { echo "tests/device/run.sh: no python with torch (set LOCKSTEP_PYTHON)" >&2; exit 2; }
nvidia-smi -L >&2 || echo "tests/device/run.sh: nvidia-smi failed; asking PyTorch" >&2
"$python" - <<'PY' >&2 || { echo "tests/device/run.sh: PyTorch sees no CUDA device: nothing to check here" >&2; exit 2; }
import torch
import sys
if not torch.cuda.is_available(): sys.exit(1)
print("PyTorch", torch.__version__, "CUDA", torch.version.cuda, "on", torch.cuda.get_device_name(0),
      "capability", torch.cuda.get_device_capability(0))
PY
# LibTorch and its CUDA libraries from that PyTorch; the bundle's Debian libraries first.
torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
nvidia_libs=$(ls -d "$torch_lib"/../../nvidia/*/lib 2>/dev/null | tr '\n' ':')
export LD_LIBRARY_PATH="$bundle/lib:$torch_lib:$nvidia_libs${LD_LIBRARY_PATH:-}"
lockstep=${LOCKSTEP_BIN:-$bundle/lockstep}
if ! "$lockstep" --version >&2; then
  echo "tests/device/run.sh: $lockstep does not start here; missing libraries:" >&2
  ldd "$lockstep" | grep -i "not found\|version" >&2
  [ -f "$bundle/PACKED" ] && cat "$bundle/PACKED" >&2
  exit 1
fi
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
data=$bundle/data
[ -d "$data" ] || data=/usr/share/datasets/fashion-mnist
exec "$python" "$here/gpu_checks.py" --lockstep "$lockstep" --data "$data" --source "$source_dir" --out "$out"

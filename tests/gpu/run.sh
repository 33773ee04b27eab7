#!/usr/bin/env bash
# For a machine with an NVIDIA GPU and a CUDA build of PyTorch installed:
# builds lockstep against that PyTorch's LibTorch (CUDA, NCCL) in build-gpu/
# and runs the GPU checks. CI never runs this (no GPU there).
#   tests/gpu/run.sh [PYTHON]      (default: python3)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
python=${1:-python3}
nvidia-smi -L || { echo "tests/gpu/run.sh: no NVIDIA GPU visible (nvidia-smi -L failed)" >&2; exit 2; }
prefix=$("$python" -c 'import torch; assert torch.cuda.is_available(), "this PyTorch has no usable CUDA"; print(torch.utils.cmake_prefix_path)')
echo "LibTorch from: $prefix" >&2
cmake -S "$source_dir" -B "$source_dir/build-gpu" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release | tee "$source_dir/build-gpu-configure.log"
grep -q "with CUDA" "$source_dir/build-gpu-configure.log" || {
  echo "tests/gpu/run.sh: the configure step did not find a CUDA LibTorch" >&2; exit 1; }
cmake --build "$source_dir/build-gpu"
lockstep="$source_dir/build-gpu/lockstep"
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
fail=0
check() {  # check NAME EXPECTED_TEXT COMMAND...: the output must contain EXPECTED_TEXT
  local name=$1 expected=$2; shift 2
  local out
  out=$("$@" 2>&1) || true
  if grep -qF -- "$expected" <<<"$out"; then echo "PASS $name"; else
    echo "FAIL $name: expected '$expected' in:"; echo "$out" | tail -20; fail=1; fi
}
# The probe measures every CUDA device next to the CPU and names the GPU.
check probe-cuda "cuda:0   fp32   matmul" env LOCKSTEP_CACHE_DIR="$cache" "$lockstep" probe --force
check probe-fingerprint '"major"' env LOCKSTEP_CACHE_DIR="$cache" "$lockstep" probe --json
# Until the trainer places models on CUDA, device = gpu is refused with the reason
# and auto says why it trains on the CPU: never a CPU run under a GPU banner.
check device-gpu-refused "does not place a model on CUDA yet" \
  "$lockstep" run "$source_dir/examples/synthetic.toml" --set device=gpu --set job.run_dir="$cache/runs"
check device-auto-says-why "Decision: device = cpu (device = auto: CUDA is visible" \
  "$lockstep" run "$source_dir/examples/synthetic.toml" --set job.steps=5 --set job.run_dir="$cache/runs"
# The CPU test suite still passes in the CUDA build.
(cd "$source_dir/build-gpu" && ctest --output-on-failure -j"$(nproc)") || fail=1
exit $fail

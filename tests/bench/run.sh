#!/usr/bin/env bash
# Runs lockstep's benchmarks and prints their JSON. Needs a built tree
# (README command 2). Usage: tests/bench/run.sh [BUILD_DIR] [repetitions]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
repetitions=${2:-5}
# The PyTorch side runs on the torch lockstep links: the project's .venv.
python=${LOCKSTEP_PYTHON:-$here/../../.venv/bin/python3}
echo "== lockstep vs PyTorch DDP" >&2
"$python" "$here/compare_ddp.py" "$build" "$repetitions"
echo "== audit overhead" >&2
"$build/tests/bench/audit_overhead" "$repetitions"
echo "== gradient-sync efficiency" >&2
"$build/tests/bench/sync_efficiency" 300
echo "== rendezvous store over gRPC against TCPStore: start-up" >&2
"$build/tests/bench/store_startup" "$repetitions"
echo "== recovery after a killed worker" >&2
"$python" "$here/recovery.py" "$build" "$repetitions"
echo "== bf16 against fp32" >&2
"$python" "$here/precision.py" "$build" "$repetitions"
echo "== scripted resnet18: lockstep against PyTorch DDP, TorchScript against eager" >&2
"$python" "$here/scripted_resnet.py" "$build" "$repetitions"
echo "== image folders: data wait against the step" >&2
"$python" "$here/image_data_wait.py" "$build" "$repetitions"
echo "== exact summation (the same bits on any world size) against float and PyTorch DDP" >&2
"$python" "$here/summation.py" "$build" "$repetitions"
echo "== does the result depend on the world size? identical or the distance, per model and precision" >&2
"$build/tests/bench/world_sizes" 50
echo "== step time across namespace hosts and capped links (root)" >&2
"$build/tests/bench/multihost_links" "$repetitions" 60 || echo "multihost_links: skipped or failed (it needs root)" >&2
echo "== membership at scale: 1,000 to 10,000 simulated workers against a real coordinator" >&2
"$build/tests/bench/coordinator_scale" 1000,4000,10000 60
echo "== elastic: seconds lost per shrink and grow, the state from a peer against a checkpoint" >&2
"$python" "$here/elastic.py" "$build" "$repetitions"
echo "== checking the arithmetic: audit.verify_every = 1, 10, 100 against off, the step evidence, lockstep verify" >&2
"$python" "$here/verify_cost.py" "$build" "$repetitions"

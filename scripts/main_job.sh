#!/usr/bin/env bash
# The main job: installs the package (`pip install .`, CUDA code included when nvcc is
# found) and runs the flex-attention benchmark CLI side by side with PyTorch. On a GPU it
# runs the eight BENCHMARK.md masks at S=131072; without one, a checked S=512 CPU run.
# Extra arguments go to `python -m flashspan.bench` (e.g. --quick, --mask causal).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$PATH:/usr/local/cuda/bin"
python3 -m pip install -q --no-build-isolation "$root" -C build-dir="$root/build/wheel"
cd "$root"
python3 -m flashspan.bench --output-dir "${FLASHSPAN_BENCH_OUT:-$root/bench_out}" "$@"

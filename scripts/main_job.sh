#!/usr/bin/env bash
# The main job: installs the package (`pip install .`, CUDA code included when nvcc is
# found) and runs the flex-attention benchmark CLI side by side with PyTorch. On a GPU it
# runs the eight docs/BENCHMARK.md masks at S=131072; without one, a checked S=512 CPU run.
# Extra arguments go to `python -m flashspan.bench` (e.g. --quick, --mask causal).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
export PATH="$PATH:/usr/local/cuda/bin"
# The first install compiles the library (how long on 2 cores: README "Measured times"; ccache makes
# later ones cheap): ninja's [n/N] progress lines are shown, the full log is printed if it fails.
echo "== pip install . (compiling flashspan; progress below)"
log=$(mktemp)
if ! python3 -m pip install -v --no-build-isolation "$root" -C build-dir="$root/build/wheel" 2>&1 \
    | tee "$log" | bash "$root/scripts/build_progress.sh"; then
  tail -60 "$log"
  exit 1
fi
cd "$root"
python3 -m flashspan.bench --output-dir "${FLASHSPAN_BENCH_OUT:-$root/bench_out}" "$@"

#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan, CPU only) and runs each one:
# first every input of tests/fuzz/regressions/ once (inputs that found bugs), then mutation
# seeded with tests/fuzz/corpus/<target>/. New inputs go to a temporary folder, never into the
# repository. Exit status 1 on any crash, sanitizer report, broken invariant, timeout (20 s per
# input) or out-of-memory (2 GB).
#   bash tests/fuzz/run_fuzz.sh [build-dir]        (default: ${FLASHSPAN_BUILD_DIR:-build}/fuzz)
# Two modes:
#   - gate (default, what CI runs): a fixed random seed (FLASHSPAN_FUZZ_SEED, default 1) and a
#     fixed number of mutations (FLASHSPAN_FUZZ_RUNS, default 6000 per target, ~10-15 s on one
#     core), so CI is reproducible: the same inputs on every machine, a red run re-runs red here.
#   - hunt: FLASHSPAN_FUZZ_SECONDS=600 bash tests/fuzz/run_fuzz.sh mutates for that long with a
#     fresh seed each run (new inputs each time). A finding goes into tests/fuzz/regressions/
#     (named <target>-<what-broke>) together with its fix, so the gate then replays it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-${FLASHSPAN_BUILD_DIR:-$root/build}/fuzz}
if [ -n "${FLASHSPAN_FUZZ_SECONDS:-}" ]; then
  budget=(-max_total_time="$FLASHSPAN_FUZZ_SECONDS")  # hunt: libFuzzer picks a fresh seed
  what="${FLASHSPAN_FUZZ_SECONDS} s (hunt)"
else
  budget=(-seed="${FLASHSPAN_FUZZ_SEED:-1}" -runs="${FLASHSPAN_FUZZ_RUNS:-6000}")
  what="seed ${FLASHSPAN_FUZZ_SEED:-1} (gate)"
fi
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLASHSPAN_CUDA=OFF -DFLASHSPAN_BUILD_TESTS=OFF -DFLASHSPAN_FUZZ=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target fuzz_plan fuzz_ops fuzz_sdpa

status=0
for target in plan ops sdpa; do
  bin="$build/tests/fuzz/fuzz_$target"
  work=$(mktemp -d)
  regressions=("$root"/tests/fuzz/regressions/"$target"-*)
  if [ -e "${regressions[0]}" ]; then
    "$bin" -artifact_prefix="$work/" "${regressions[@]}" >"$work/regressions.log" 2>&1 \
      || { echo "fuzz_$target: a regression input fails again:"; tail -40 "$work/regressions.log"; status=1; }
  fi
  if "$bin" "${budget[@]}" -timeout=20 -rss_limit_mb=2048 -artifact_prefix="$work/" -print_final_stats=1 \
      "$work" "$root/tests/fuzz/corpus/$target" >"$work/fuzz.log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/fuzz.log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz_$target: ${#regressions[@]} regression inputs pass; $runs inputs, $what, no finding"
  else
    echo "fuzz_$target: FINDING after $what (input saved under $work):"
    grep -v '^#[0-9]' "$work/fuzz.log" | tail -40
    status=1
  fi
done
exit $status

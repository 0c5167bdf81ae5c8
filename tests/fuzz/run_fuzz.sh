#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan, CPU only) and runs each one:
# first every input of tests/fuzz/regressions/ once (inputs that found bugs), then mutation for
# FLASHSPAN_FUZZ_SECONDS seconds (default 15) seeded with tests/fuzz/corpus/<target>/.
# New inputs go to a temporary folder, never into the repository. Exit status 1 on any crash,
# sanitizer report, broken invariant, timeout (20 s per input) or out-of-memory (2 GB).
#   bash tests/fuzz/run_fuzz.sh [build-dir]        (default: ${FLASHSPAN_BUILD_DIR:-build}/fuzz)
# A longer local run: FLASHSPAN_FUZZ_SECONDS=600 bash tests/fuzz/run_fuzz.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-${FLASHSPAN_BUILD_DIR:-$root/build}/fuzz}
secs=${FLASHSPAN_FUZZ_SECONDS:-15}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLASHSPAN_CUDA=OFF -DFLASHSPAN_BUILD_TESTS=OFF -DFLASHSPAN_FUZZ=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target fuzz_plan fuzz_ops

status=0
for target in plan ops; do
  bin="$build/tests/fuzz/fuzz_$target"
  work=$(mktemp -d)
  regressions=("$root"/tests/fuzz/regressions/"$target"-*)
  if [ -e "${regressions[0]}" ]; then
    "$bin" -artifact_prefix="$work/" "${regressions[@]}" >"$work/regressions.log" 2>&1 \
      || { echo "fuzz_$target: a regression input fails again:"; tail -40 "$work/regressions.log"; status=1; }
  fi
  if "$bin" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -artifact_prefix="$work/" -print_final_stats=1 \
      "$work" "$root/tests/fuzz/corpus/$target" >"$work/fuzz.log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/fuzz.log" | grep -o '[0-9]*$' || echo "?")
    echo "fuzz_$target: ${#regressions[@]} regression inputs pass; $runs inputs in ${secs} s, no finding"
  else
    echo "fuzz_$target: FINDING (input saved under $work):"
    grep -v '^#[0-9]' "$work/fuzz.log" | tail -40
    status=1
  fi
done
exit $status

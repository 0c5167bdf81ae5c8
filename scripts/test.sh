#!/usr/bin/env bash
# Builds flashspan (CUDA code included when nvcc is found), runs the C++ tests (ctest),
# installs the Python package with `pip install .`, and runs the Python tests (pytest).
# GPU tests skip with a reason when no GPU is visible.
# Env: FLASHSPAN_BUILD_DIR (default build/), FLASHSPAN_CMAKE_ARGS (extra CMake args),
# FLASHSPAN_WERROR (default ON: the CMake build treats the host compiler's warnings as errors, so CI
# stays warning-free; OFF for a compiler that warns where GCC 12 does not),
# FLASHSPAN_FUZZ=0 skips fuzzing (tests/fuzz/run_fuzz.sh: a fixed-seed gate by default,
# FLASHSPAN_FUZZ_SECONDS=N hunts for N s per target with a fresh seed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${FLASHSPAN_BUILD_DIR:-$root/build}
export PATH="$PATH:/usr/local/cuda/bin"
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
jobs=$(nproc)

echo "== configure + build ($build)"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHSPAN_WERROR="${FLASHSPAN_WERROR:-ON}" \
  ${FLASHSPAN_CMAKE_ARGS:-}
cmake --build "$build" -j"$jobs"

echo "== C++ tests"
ctest --test-dir "$build" --output-on-failure -j"$jobs" --output-junit "$build/ctest-junit.xml"
# ctest's "100% tests passed" counts skipped tests (the GPU tests, without a GPU) as passed: say how many
# were skipped and why, so a CPU run is not mistaken for a full one.
python3 "$root/scripts/ctest_summary.py" "$build/ctest-junit.xml"

# libFuzzer targets over the C ABI (tests/fuzz; clang, ASan + UBSan, CPU): the regression inputs,
# then a fixed-seed, fixed-count mutation run per target (reproducible on every machine).
# FLASHSPAN_FUZZ=0 (or FLASHSPAN_FUZZ_SECONDS=0) skips; FLASHSPAN_FUZZ_SECONDS=N hunts instead.
if [ "${FLASHSPAN_FUZZ:-1}" != 0 ] && [ "${FLASHSPAN_FUZZ_SECONDS:-}" != 0 ] && command -v clang++ >/dev/null 2>&1; then
  echo "== fuzzing (tests/fuzz)"
  bash "$root/tests/fuzz/run_fuzz.sh" "$build/fuzz"
fi

# Without a GPU, the CUDA planner's GPU tests also run on the CPU through the emulation
# layer of tests/emu (its logic, not its speed; every test; how long: README "Measured times").
# FLASHSPAN_EMU_TESTS=0 skips.
if [ "${FLASHSPAN_EMU_TESTS:-auto}" = 1 ] || { [ "${FLASHSPAN_EMU_TESTS:-auto}" = auto ] && ! nvidia-smi -L >/dev/null 2>&1; }; then
  echo "== CUDA planner tests on the CPU (tests/emu)"
  # Compiled in the build tree through ccache (a g++ link to ccache first on PATH): an unchanged
  # planner recompiles nothing on the next run.
  emu_path=$PATH
  if command -v ccache >/dev/null 2>&1; then
    mkdir -p "$build/emu-ccache"
    ln -sf "$(command -v ccache)" "$build/emu-ccache/g++"
    emu_path="$build/emu-ccache:$PATH"
  fi
  PATH="$emu_path" EMU_OUT="$build/emu" bash "$root/tests/emu/run_planner_emu.sh"
fi

echo "== pip install ."
# The same FLASHSPAN_WERROR as the CMake build: the compile flags then match, so ccache serves every
# object of this second build.
# shellcheck disable=SC2086
python3 -m pip install -q --no-build-isolation "$root" \
  -C build-dir="$build/wheel" -C cmake.define.FLASHSPAN_WERROR="${FLASHSPAN_WERROR:-ON}" ${FLASHSPAN_PIP_ARGS:-}

echo "== Python tests (installed package)"
cd "$root"
python3 -m pytest -q -rs -p no:cacheprovider tests/python

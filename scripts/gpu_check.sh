#!/usr/bin/env bash
# The one command for a GPU machine: runs the GPU test suite (C++ and Python), the
# compute-sanitizer checks and a short benchmark. Logs are written to a log folder and
# packed at the end into $OUT/gpu_check_logs.tgz, with summary.txt beside it ($OUT defaults
# to ./gpu_check_out). Prints a summary table last; exits non-zero if any step failed.
#
# Usage: scripts/gpu_check.sh [BUILD_DIR]
#   BUILD_DIR holds libflashspan.so, tests/cpp/flashspan_tests and benchmarks/* (default: build).
#   When it has no test binary, the project is built there first (cmake + ninja, arch 90a).
# Env: GPU_CHECK_SKIP_BENCH=1 skips the benchmarks; GPU_CHECK_BENCH_SECONDS bounds the Python
# benchmark; GPU_CHECK_SANITIZER_FILTER / GPU_CHECK_RACECHECK_FILTER pick the sanitizer cases.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" 2>/dev/null && pwd || echo "${1:-$root/build}")
dest=${OUT:-$root/gpu_check_out}
out=${GPU_CHECK_LOGDIR:-/tmp/gpu_check_logs}
rm -rf "$out"
mkdir -p "$out" "$dest"
declare -a summary
status=0

step() {  # step NAME LOGFILE CMD...
  local name=$1 log=$2
  shift 2
  local t0=$SECONDS
  "$@" >"$out/$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-28s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - t0))" "$log")")
  [ "$rc" = 0 ] || status=1
  tail -n 5 "$out/$log"
  return $rc
}

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv >"$out/gpu.txt" 2>&1 || true
cat "$out/gpu.txt"

if [ ! -x "$build/tests/cpp/flashspan_tests" ]; then
  step build build.log bash -c "cmake -S '$root' -B '$build' -G Ninja -DFLASHSPAN_CUDA_ARCHS=90a && cmake --build '$build' -j\$(nproc)"
fi
tests=$build/tests/cpp/flashspan_tests
export FLASHSPAN_LIBRARY=$build/libflashspan.so
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1

# 1. The whole C++ suite (GPU tests included; CPU tests are cheap).
step "gtest (all)" gtest.log "$tests" --gtest_brief=1

# 2. compute-sanitizer: memcheck on small GPU cases, racecheck on a few, synccheck on the sm90 ones.
if command -v compute-sanitizer >/dev/null; then
  filt=${GPU_CHECK_SANITIZER_FILTER:-'FlexGpu.SanitizerSmall:FlexGpuSm90.SanitizerSmall:FlexGpu.PackedGqaGridAndNoWorkspace:PlannerGpu.ThdWithEmptySamples:PlannerGpu.RandomMasksGqaPerHead'}
  step "memcheck" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 3 "$tests" --gtest_filter="$filt"
  step "racecheck" racecheck.log compute-sanitizer --tool racecheck --error-exitcode 3 "$tests" \
    --gtest_filter="${GPU_CHECK_RACECHECK_FILTER:-FlexGpu.SanitizerSmall:FlexGpuSm90.SanitizerSmall:PlannerGpu.ThdWithEmptySamples}"
  step "synccheck (sm90)" synccheck.log compute-sanitizer --tool synccheck --error-exitcode 3 "$tests" \
    --gtest_filter=FlexGpuSm90.SanitizerSmall
fi

# 3. Python suite (GPU tests run here; CPU ones too).
step "pytest" pytest.log python3 -m pytest -q -p no:cacheprovider -x "$root/tests/python"

# 4. Short benchmark.
if [ "${GPU_CHECK_SKIP_BENCH:-0}" != 1 ]; then
  [ -x "$build/benchmarks/flashspan_plan_bench" ] && step "plan bench" plan_bench.log "$build/benchmarks/flashspan_plan_bench"
  [ -x "$build/benchmarks/flashspan_kernel_bench" ] && step "kernel bench" kernel_bench.log "$build/benchmarks/flashspan_kernel_bench"
  [ -x "$build/benchmarks/flashspan_family_bench" ] && step "family bench (sm80 vs sm90)" family_bench.log "$build/benchmarks/flashspan_family_bench" 5 32768 128 4
  step "pack_gqa bench" pack_gqa_bench.log python3 "$root/benchmarks/pack_gqa_bench.py" --reps 10
  step "flashspan-bench --quick" bench.log python3 -m flashspan.bench --quick \
    --time-limit "${GPU_CHECK_BENCH_SECONDS:-180}" --output-dir "$out/bench"
  cp "$out/bench/results.md" "$dest/bench_results.md" 2>/dev/null
  cp "$out/bench/results.json" "$dest/bench_results.json" 2>/dev/null
fi

echo
echo "== gpu_check summary (logs packed into $dest/gpu_check_logs.tgz)"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
tar czf "$dest/gpu_check_logs.tgz" -C "$out" . && cp "$out/summary.txt" "$dest/summary.txt"
exit $status

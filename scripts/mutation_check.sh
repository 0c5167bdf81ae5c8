#!/usr/bin/env bash
# Mutation check: plants known bugs, one at a time, in a scratch copy of the committed tree
# (git archive HEAD) and requires the test suite to FAIL on each. A mutant that survives (the
# suite still passes) means a hole in the tests; a mutant that can no longer be planted (its
# source line changed) is reported too. Either makes the exit status 1.
#
# CPU part (default; ~15 min on 2 cores, not part of CI): the scratch copy is built CPU-only,
# then for each mutant, in this order until one fails: the C++ suite (flashspan_tests), the CPU
# Python tests of the reference backend and planner (test_flex_cpu.py, test_plan.py), and the
# emulated CUDA planner tests (tests/emu/run_planner_emu.sh, only for planner mutants).
#   M1 host planner: a block with all but one element visible classified as full
#   M2 CUDA planner: the same bug (caught by the emulated planner tests)
#   M3 CPU reference: the partial tail key block dropped (forward and dQ)
#   M4 CPU reference: softmax_scale ignored (1/sqrt(D) instead)
#   M5 CPU reference: the last visible interval of each row dropped
#   M6 host planner: the last interval of each row dropped
#   M7 CPU reference: the dK/dV GQA reduction over one query head instead of the group
# GPU part (--gpu, on a GPU machine only; builds the scratch copy with CUDA, arch 90a, and runs
# the GPU kernel tests FlexGpu.*):
#   G1 kernels: scale used where scale * log2(e) belongs
#   G2 kernels: softmax_scale ignored (1/sqrt(D) instead)
#
# Usage: scripts/mutation_check.sh [--gpu] [--only M1,M3,...] [--all-suites]
#   --all-suites runs every listed suite on each mutant (a full matrix, slower) instead of
#   stopping at the first suite that fails. Results name the failing tests.
# Env: MUTATION_DIR (scratch folder, default a new temp dir), MUTATION_KEEP=1 keeps it,
# MUTATION_EMU_FILTER (gtest filter of the emulated planner tests; default: the block-mask,
# random-mask and THD cases, a few seconds each -- the S = 32768 / 131072 cases take minutes
# under emulation; '*' runs them all).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
gpu=0
only=""
all_suites=0
while [ $# -gt 0 ]; do
  case $1 in
    --gpu) gpu=1 ;;
    --only) only=$2; shift ;;
    --all-suites) all_suites=1 ;;
    *) echo "usage: $0 [--gpu] [--only M1,M2,...]" >&2; exit 2 ;;
  esac
  shift
done
work=${MUTATION_DIR:-$(mktemp -d /tmp/flashspan_mutation.XXXXXX)}
emu_filter=${MUTATION_EMU_FILTER:-'PlannerGpu.FullMinusOneBlocksArePartial:PlannerGpu.BlockStructuredMasks:PlannerGpu.RandomMasksGqaPerHead:PlannerGpu.ThdWithEmptySamples'}
src=$work/src_copy
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
export PATH="$PATH:/usr/local/cuda/bin"
jobs=$(nproc)
rm -rf "$src"
mkdir -p "$src"
git -C "$root" archive HEAD | tar -x -C "$src"
echo "== scratch copy of $(git -C "$root" rev-parse --short HEAD) in $src"

# mutate ID: applies mutant ID to the scratch copy (every occurrence of its pattern, in the one
# file under src/ that holds it); prints the file, exits 3 when the pattern is not found.
mutate() {
  python3 - "$src" "$1" <<'PY'
import pathlib, sys
root, mid = pathlib.Path(sys.argv[1]), sys.argv[2]
M = {
    "M1": [("const bool full = count == full_count;", "const bool full = count >= full_count - 1;  // MUTANT")],
    "M2": [("const bool first_prev_full = tid == 0 ? s_carry[pass & 1] != 0 : run == full;",
            "const bool first_prev_full = tid == 0 ? s_carry[pass & 1] != 0 : run >= full - 1;  // MUTANT"),
           ("const bool f = run == full;", "const bool f = run >= full - 1;  // MUTANT"),
           ("const bool f = cnt[k] == full;", "const bool f = cnt[k] >= full - 1;  // MUTANT")],
    "M3": [("const int64_t c1 = std::min(c0 + kKeyBlock, lk);",
            "const int64_t c1 = c0 + kKeyBlock <= lk ? c0 + kKeyBlock : c0;  // MUTANT: tail block dropped")],
    "M4": [("const Acc scale = static_cast<Acc>(a.softmax_scale);",
            "const Acc scale = static_cast<Acc>(1.0 / std::sqrt(double(a.geometry->head_dim_qk)));  // MUTANT")],
    "M5": [("for (int f = 0; f < nfunc; f += 2) {", "for (int f = 0; f < nfunc - 2; f += 2) {  // MUTANT")],
    "M6": [("for (int f = 1; f + 1 < nf; f += 2) add_interval(", "for (int f = 1; f + 3 < nf; f += 2) add_interval(")],
    "M7": [("for (int h = t.hk * group; h < (t.hk + 1) * group; ++h) {",
            "for (int h = t.hk * group; h < t.hk * group + 1; ++h) {  // MUTANT")],
    "G1": [("p.scale_log2 = a.softmax_scale * 1.4426950408889634f;", "p.scale_log2 = a.softmax_scale;  // MUTANT")],
    "G2": [("p.scale_log2 = a.softmax_scale * 1.4426950408889634f;",
            "p.scale_log2 = 1.4426950408889634f / sqrtf(float(g.head_dim_qk));  // MUTANT")],
}[mid]
files = [p for p in (root / "src").rglob("*") if p.is_file() and p.suffix in (".cpp", ".cu", ".cuh", ".h")]
for old, new in M:
    hits = [p for p in files if old in p.read_text()]
    if len(hits) != 1:
        print(f"{mid}: pattern found in {len(hits)} files (need exactly 1): {old!r}")
        sys.exit(3)
    t = hits[0].read_text()
    hits[0].write_text(t.replace(old, new))
    print(f"{mid}: {hits[0].relative_to(root)}: {t.count(old)} x {old!r}")
PY
}

# Puts src/ back as committed. `tar -m` stamps the files with the current time: with the
# archive's (old) times ninja would keep the mutant's object files and the next mutant would
# be tested with this one still in the build.
restore() { git -C "$root" archive HEAD src | tar -x -m -C "$src"; }

build() {  # build DIR CMAKE_ARGS...
  local dir=$1
  shift
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >"$work/cmake.log" 2>&1 &&
    cmake --build "$dir" -j"$jobs" >"$work/build.log" 2>&1
}

declare -a results
status=0
run_mutant() {  # run_mutant ID SUITES... (suites: gtest pytest emu gpu)
  local id=$1
  shift
  if [ -n "$only" ] && [[ ",$only," != *",$id,"* ]]; then return; fi
  echo "== $id"
  local log=$work/$id.log
  if ! mutate "$id" >"$log" 2>&1; then
    cat "$log"
    results+=("$id NOT PLANTED (pattern not found: the source changed; update scripts/mutation_check.sh)")
    status=1
    restore
    return
  fi
  cat "$log"
  local caught="" missed=""
  local bdir=$work/build_cpu
  [ "$1" = gpu ] && bdir=$work/build_gpu
  if [ "$1" != emu ]; then
    local args=(-DFLASHSPAN_CUDA=OFF)
    [ "$1" = gpu ] && args=(-DFLASHSPAN_CUDA_ARCHS=90a)
    if ! build "$bdir" "${args[@]}"; then
      # A mutant must compile to say anything about the tests.
      cp "$work/build.log" "$work/$id.build.log"
      results+=("$id DOES NOT COMPILE (a broken mutant, not a test result; see $work/$id.build.log)")
      status=1
      restore
      return
    fi
  fi
  for suite in "$@"; do
    local slog=$work/$id.$suite.log what="" rc=0
    case $suite in
      gtest)
        what="C++ suite"
        "$bdir/tests/cpp/flashspan_tests" --gtest_brief=1 >"$slog" 2>&1 || rc=1 ;;
      gpu)
        what="GPU kernel tests"
        "$bdir/tests/cpp/flashspan_tests" --gtest_brief=1 --gtest_filter='FlexGpu.*' >"$slog" 2>&1 || rc=1 ;;
      pytest)
        what="Python CPU tests"
        (cd "$src" && FLASHSPAN_LIBRARY="$bdir/libflashspan.so" PYTHONPATH="$src/python" \
          python3 -m pytest -q -p no:cacheprovider tests/python/test_flex_cpu.py tests/python/test_plan.py) \
          >"$slog" 2>&1 || rc=1 ;;
      emu)
        what="emulated CUDA planner tests"
        EMU_OUT=$work/emu bash "$src/tests/emu/run_planner_emu.sh" "$emu_filter" >"$slog" 2>&1 || rc=1 ;;
    esac
    cat "$slog" >>"$log"
    if [ "$rc" = 1 ]; then
      # Failing test names: gtest "[  FAILED  ] Suite.Test", pytest "FAILED path::test".
      local names
      names=$(grep -hoE '^\[  FAILED  \] [A-Za-z0-9_/]+\.[A-Za-z0-9_./]+|^FAILED [^ ]+' "$slog" | sed -E 's/^\[  FAILED  \] //; s/^FAILED //; s/.*:://' |
              sort -u | head -6 | paste -sd, - | sed 's/,/, /g')
      caught+="${caught:+; }$what (${names:-see $slog})"
      [ "$all_suites" = 1 ] || break
    else
      missed+="${missed:+, }$what"
    fi
  done
  if [ -n "$caught" ]; then
    results+=("$id caught by: $caught${missed:+; passed: $missed}")
  else
    results+=("$id SURVIVED: every suite passed with the bug planted (log: $log)")
    status=1
  fi
  restore
}

t0=$SECONDS
if [ "$gpu" = 0 ]; then
  echo "== baseline (unmutated) CPU build"
  if ! build "$work/build_cpu" -DFLASHSPAN_CUDA=OFF; then
    echo "baseline build failed: $work/build.log"
    exit 1
  fi
  run_mutant M1 gtest pytest emu
  run_mutant M2 emu
  run_mutant M3 gtest pytest
  run_mutant M4 gtest pytest
  run_mutant M5 gtest pytest
  run_mutant M6 gtest pytest emu
  run_mutant M7 gtest pytest
else
  nvidia-smi -L >/dev/null 2>&1 || { echo "--gpu needs a visible GPU"; exit 1; }
  run_mutant G1 gpu
  run_mutant G2 gpu
fi

echo
echo "== mutation check ($((SECONDS - t0)) s, scratch: $work)"
printf '%s\n' "${results[@]}"
[ "${MUTATION_KEEP:-0}" = 1 ] || [ -n "${MUTATION_DIR:-}" ] || rm -rf "$work"
exit $status

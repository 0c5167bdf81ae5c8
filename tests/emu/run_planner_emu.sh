#!/usr/bin/env bash
# Runs the CUDA planner's GPU tests (tests/cpp/test_planner_gpu.cpp) on the CPU through the
# emulation layer in tests/emu/inc (no GPU, no nvcc needed). Kernel launches (<<<...>>>) and
# the dynamic shared array are rewritten into plain C++ in a scratch copy of the sources.
#
#   tests/emu/run_planner_emu.sh [gtest filter]     (default: every test, S = 131072 and the
#                                                    packed-GQA cases included; how long on 2
#                                                    cores: README "Measured times")
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${EMU_OUT:-$(mktemp -d)}"
FILTER="${1:-*}"
mkdir -p "$OUT/src/plan"
python3 - "$ROOT" "$OUT" <<'PY'
import re, sys
root, out = sys.argv[1], sys.argv[2]
for name, dst in (("planner_cuda.cu", "planner_cuda.cpp"), ("planner_kernels.cuh", "planner_kernels.cuh")):
    s = open(f"{root}/src/plan/{name}").read()
    s = re.sub(r'([A-Za-z_][\w:]*(?:<[^<>]*>)?)<<<(.*?)>>>\(', r'EmuLaunch(\2).run(\1, ', s, flags=re.S)
    s = s.replace('extern __shared__ int32_t diff[];', 'int32_t* diff = static_cast<int32_t*>(emu_dyn_smem);')
    open(f"{out}/src/plan/{dst}", "w").write(s)
PY
FLAGS=(-std=c++20 -O2 -DFLASHSPAN_WITH_CUDA=1 -I"$ROOT/tests/emu/inc" -I"$OUT/src" -I"$ROOT/include" -I"$ROOT/src"
       -I"$ROOT/tests/cpp" -w)
g++ "${FLAGS[@]}" -c "$OUT/src/plan/planner_cuda.cpp" -o "$OUT/planner_cuda.o" &
g++ "${FLAGS[@]}" -c "$ROOT/src/plan/mask_plan.cpp" -o "$OUT/mask_plan.o" &
wait
g++ "${FLAGS[@]}" -c "$ROOT/src/plan/planner_host.cpp" -o "$OUT/planner_host.o" &
g++ "${FLAGS[@]}" -c "$ROOT/src/core/validation.cpp" -o "$OUT/validation.o" &
g++ "${FLAGS[@]}" -c "$ROOT/src/dispatch/family.cpp" -o "$OUT/family.o" &
g++ "${FLAGS[@]}" -c "$ROOT/src/kernels/sm90/switches_sm90.cpp" -o "$OUT/switches_sm90.o" &
wait
g++ "${FLAGS[@]}" -c "$ROOT/tests/cpp/test_planner_gpu.cpp" -o "$OUT/test_planner_gpu.o"
g++ "$OUT"/*.o -lgtest -lgtest_main -pthread -o "$OUT/planner_emu_tests"
"$OUT/planner_emu_tests" --gtest_filter="$FILTER"

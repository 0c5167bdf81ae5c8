#!/usr/bin/env bash
# Context-parallel GPU check (issue 15). NOT RUN YET: written in a session without GPU time for
# it; the first run is the check. It runs tests/python/test_distributed_cpu.py over NCCL with
# CUDA tensors (BF16 in place of fp32; every rank compares its shard with single-process
# flashspan.flex_attn_func on the same GPU):
#   1. one rank (world size 1 over NCCL): the CP code path (plans, merge, ring of one step,
#      all-gather / reduce-scatter of one rank) on the GPU kernels;
#   2. FLASHSPAN_CP_RANKS ranks (default: the GPU count, at least 2) -- one GPU per rank when the
#      machine has enough, otherwise several ranks on one GPU. Recent NCCL refuses two ranks on
#      one device ("Duplicate GPU detected"); then step 2 fails at init and says so: that is a
#      limit of NCCL, not a result of flashspan.
# Keeps NVLink multicast off (KINDS.md). Logs go to $OUT (default ./cp_gpu_check_out).
#
# Usage: scripts/cp_gpu_check.sh [BUILD_DIR]   (BUILD_DIR holds libflashspan.so built with CUDA, arch 90a)
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dest=${OUT:-$root/cp_gpu_check_out}
mkdir -p "$dest"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export FLASHSPAN_LIBRARY=${FLASHSPAN_LIBRARY:-$build/libflashspan.so}
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}
export FLASHSPAN_CP_DEVICE=cuda
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
ranks=${FLASHSPAN_CP_RANKS:-$(( gpus > 1 ? (gpus > 4 ? 4 : gpus) : 2 ))}
status=0
cd "$root"
echo "== 1 rank over NCCL" | tee "$dest/summary.txt"
FLASHSPAN_CP_RANKS=1 python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_distributed_cpu.py \
  >"$dest/cp_nccl_1rank.log" 2>&1 || status=1
tail -n 3 "$dest/cp_nccl_1rank.log" | tee -a "$dest/summary.txt"
echo "== $ranks ranks over NCCL on $gpus GPU(s)" | tee -a "$dest/summary.txt"
FLASHSPAN_CP_RANKS=$ranks python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_distributed_cpu.py \
  >"$dest/cp_nccl_${ranks}ranks.log" 2>&1 || status=1
tail -n 3 "$dest/cp_nccl_${ranks}ranks.log" | tee -a "$dest/summary.txt"
if grep -q "Duplicate GPU" "$dest/cp_nccl_${ranks}ranks.log"; then
  echo "NCCL refused several ranks on one GPU (Duplicate GPU detected): multi-rank NCCL needs >= $ranks GPUs" \
    | tee -a "$dest/summary.txt"
fi
exit $status

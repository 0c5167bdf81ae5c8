// Host helpers shared by the sm80 launchers: tensor addressing, alignment checks, launch
// error checks, and the tile table of the sm80 kernels.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/error.h"
#include "core/geometry.h"
#include "core/tensor_view.h"
#include "kernels/common/flex_params.h"
#include "plan/mask_plan.h"

namespace flashspan::sm80 {

// Throws Error(kCudaError) naming `what` when the last launch failed.
inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  FS_CHECK(e == cudaSuccess, Status::kCudaError, what, ": kernel launch failed: ", cudaGetErrorString(e));
}

inline void check_cuda(cudaError_t e, const char* what) {
  FS_CHECK(e == cudaSuccess, Status::kCudaError, what, ": ", cudaGetErrorString(e));
}

// Raises a kernel's dynamic shared memory limit to `bytes` once per device (the attribute
// belongs to the kernel as loaded in the current device's context). `done` is the kernel's
// own bitmask of configured devices. Not a stream operation, so capture-safe.
template <class Kernel>
void ensure_smem_limit(Kernel kernel, int bytes, std::atomic<uint64_t>& done, const char* what) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), what);
  const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what);
  done.fetch_or(bit, std::memory_order_acq_rel);
}

// Strides of a q/k/v/o-like tensor: BSHD [B,S,H,D] or THD [T,H,D].
inline FlexTensorAddr qkv_addr(const TensorView& t, bool varlen) {
  FlexTensorAddr a;
  if (varlen) {
    a.batch_stride = 0;
    a.row_stride = t.stride(0);
    a.head_stride = t.stride(1);
  } else {
    a.batch_stride = t.stride(0);
    a.row_stride = t.stride(1);
    a.head_stride = t.stride(2);
  }
  return a;
}

// Strides of an LSE-like fp32 tensor: BSHD [B,Hq,Sq] or THD [Hq,Tq].
inline FlexTensorAddr lse_addr(const TensorView& t, bool varlen) {
  FlexTensorAddr a;
  if (varlen) {
    a.batch_stride = 0;
    a.head_stride = t.stride(0);
    a.row_stride = t.stride(1);
  } else {
    a.batch_stride = t.stride(0);
    a.head_stride = t.stride(1);
    a.row_stride = t.stride(2);
  }
  return a;
}

// The kernels move 16-byte chunks (8 elements): data pointers must be 16-byte aligned and
// every stride but the last a multiple of 8 elements.
inline void check_vec_aligned(const TensorView& t, const char* name) {
  FS_CHECK_SUPPORTED(reinterpret_cast<uintptr_t>(t.data) % 16 == 0, name,
                     ": data pointer must be 16-byte aligned for the GPU kernels");
  for (int d = 0; d + 1 < t.ndim; ++d) {
    FS_CHECK_SUPPORTED(t.shape[d] <= 1 || t.strides[d] % 8 == 0, name, ": stride ", t.strides[d], " of dimension ",
                       d, " must be a multiple of 8 elements for the GPU kernels");
  }
}

// CTAs of a persistent grid (split schedule) on the current device: SMs x resident CTAs
// per SM, capped by FlexSplitSchedule::kMaxCtas (the item-list bound). Cached per device in
// `cache` (0 = not yet known); host queries only, so safe during stream capture.
template <class Kernel>
int persistent_ctas(Kernel kernel, int threads, int smem, std::atomic<int> (&cache)[64], const char* what) {
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), what);
  if (dev < 64) {
    const int c = cache[dev].load(std::memory_order_relaxed);
    if (c > 0) return c;
  }
  int sms = 0, per_sm = 0;
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), what);
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, size_t(smem)), what);
  int n = std::max(1, sms) * std::max(1, per_sm);
  n = std::min(n, FlexSplitSchedule::kMaxCtas);
  if (dev < 64) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

// Tiles of the sm80 kernels, by head dims (the head-dim tile is the next of 64, 128,
// (192, 128), 256 that covers both dims).
struct TileSm80 {
  int dqk_tile, dv_tile;
  int fwd_bq, fwd_bk;
  int bwd_bq, bwd_bk;
};

inline TileSm80 tile_sm80(int dqk, int dv) {
  if (dqk <= 64 && dv <= 64) return {64, 64, 128, 64, 64, 128};
  if (dqk <= 128 && dv <= 128) return {128, 128, 128, 64, 64, 128};
  if (dqk == 192 && dv == 128) return {192, 128, 128, 64, 64, 64};
  return {256, 256, 64, 64, 64, 64};
}

// The tile the sm80 kernels run for a plan's consumer: tile_sm80(dqk, dv), whose forward
// tile is the default one, or, when the plan's forward tile is the decode tile
// (kDecodeBlockQ x 64, consumer_for_plan) and both head dims are <= 128, the same tile with
// the forward part replaced by the decode kernel's (always on the 128 head-dim tile; smaller
// dims run predicated). Returns false (and leaves *out alone) when no sm80 forward kernel
// has the plan's forward tile. The backward part is always tile_sm80's.
inline bool fwd_tile_for_plan_sm80(int dqk, int dv, int plan_bq, int plan_bk, TileSm80* out) {
  TileSm80 t = tile_sm80(dqk, dv);
  if (plan_bq == t.fwd_bq && plan_bk == t.fwd_bk) {
    *out = t;
    return true;
  }
  if (plan_bq == kDecodeBlockQ && plan_bk == 64 && dqk <= 128 && dv <= 128) {
    t.dqk_tile = 128;
    t.dv_tile = 128;
    t.fwd_bq = kDecodeBlockQ;
    t.fwd_bk = 64;
    *out = t;
    return true;
  }
  return false;
}

// Dynamic shared memory of the kernels for a tile (bytes; 16-bit elements). The launchers
// static_assert that these match the kernels' own layouts.
constexpr int fwd_smem_bytes(int bq, int bk, int dqk, int dv) { return (bq * dqk + bk * dqk + bk * dv) * 2; }
// dK/dV kernel: K, V, double-buffered Q and dO, P and dS, then the 16-byte work item slot.
constexpr int bwd_dkdv_smem_bytes(int bq, int bk, int dqk, int dv) {
  return (bk * dqk + bk * dv + 2 * (bq * dqk + bq * dv) + 2 * bq * bk) * 2 + 16;
}
// Deterministic dQ kernel: Q, dO, double-buffered K and V.
constexpr int bwd_dq_smem_bytes(int bq, int bk, int dqk, int dv) {
  return (bq * dqk + bq * dv + 2 * (bk * dqk + bk * dv)) * 2;
}
inline int fwd_smem_bytes(const TileSm80& t) { return fwd_smem_bytes(t.fwd_bq, t.fwd_bk, t.dqk_tile, t.dv_tile); }
inline int bwd_smem_bytes(const TileSm80& t, bool deterministic) {
  const int dkdv = bwd_dkdv_smem_bytes(t.bwd_bq, t.bwd_bk, t.dqk_tile, t.dv_tile);
  const int dq = bwd_dq_smem_bytes(t.bwd_bq, t.bwd_bk, t.dqk_tile, t.dv_tile);
  return deterministic && dq > dkdv ? dq : dkdv;
}

void launch_fwd_sm80(const FlexFwdParams& p, const TileSm80& tile, DType dtype, int num_tasks, cudaStream_t stream);

// Byte offsets into the backward workspace (a pure function of the geometry; the tile comes
// from the head dims, as the plan's consumer must match it). All offsets 256-aligned.
//   delta, lse2        fp32 [Hq, total_q] each
//   deterministic = false adds:
//   dq_accum           fp32 [Hq, total_q, Dqk]
//   split schedule     (FlexBwdSplit): hdr int32 [4]; task_iters, task_slot int32 [max_tasks];
//                      item_start int32 [max_tasks + 1]; items int32 [max_items, 4];
//                      dk_accum fp32 [max_split, Bk, Dqk]; dv_accum fp32 [max_split, Bk, Dv]
//   with max_tasks = Hkv * min(B * ceil(max_seqlen_k / Bk), ceil(total_k / Bk) + B)  (>= the
//   plan's Hkv * NKB), max_items = max_tasks + kItemsPerCta * kMaxCtas,
//   max_split = min(max_tasks, kMaxSplit).
// The split-schedule arrays both workspaces hold (FlexSplitSchedule), as byte offsets, in this
// order: hdr int32 [kHdrInts]; task_iters int32 [max_tasks]; item_start int32 [max_tasks + 1];
// task_slot int32 [max_tasks]; items int32 [max_items, 4].
struct SplitScheduleOffsets {
  size_t hdr = 0, task_iters = 0, item_start = 0, task_slot = 0, items = 0;

  // Lays the arrays out in that order with take(bytes) -> offset.
  template <class Take>
  void take_all(Take&& take, int64_t max_tasks, int64_t max_items) {
    hdr = take(sizeof(int32_t) * FlexSplitSchedule::kHdrInts);
    task_iters = take(sizeof(int32_t) * size_t(max_tasks));
    item_start = take(sizeof(int32_t) * size_t(max_tasks + 1));
    task_slot = take(sizeof(int32_t) * size_t(max_tasks));
    items = take(4 * sizeof(int32_t) * size_t(max_items));
  }
  // Points the schedule's arrays into the workspace that starts at ws.
  void bind(FlexSplitSchedule& s, char* ws) const {
    s.hdr = reinterpret_cast<int32_t*>(ws + hdr);
    s.task_iters = reinterpret_cast<int32_t*>(ws + task_iters);
    s.item_start = reinterpret_cast<int32_t*>(ws + item_start);
    s.task_slot = reinterpret_cast<int32_t*>(ws + task_slot);
    s.items = reinterpret_cast<int32_t*>(ws + items);
  }
};

struct BwdWorkspaceLayout : SplitScheduleOffsets {
  size_t delta = 0, lse2 = 0, dq_accum = 0;
  size_t dk_accum = 0, dv_accum = 0;
  size_t total = 0;
  int64_t max_tasks = 0, max_items = 0, max_split = 0;
};

inline size_t ws_align(size_t x) { return (x + 255) / 256 * 256; }

inline BwdWorkspaceLayout bwd_workspace_layout(const FlexGeometry& g, bool deterministic) {
  BwdWorkspaceLayout w;
  const size_t per = ws_align(sizeof(float) * size_t(g.num_heads_q) * size_t(g.total_q));
  w.delta = 0;
  w.lse2 = per;
  size_t off = 2 * per;
  if (deterministic) {
    w.total = off;
    return w;
  }
  w.dq_accum = off;
  off += ws_align(per * size_t(g.head_dim_qk));
  const int64_t bk = tile_sm80(g.head_dim_qk, g.head_dim_v).bwd_bk;
  const int64_t by_batch = int64_t(g.batch) * ((g.max_seqlen_k + bk - 1) / bk);
  const int64_t by_total = (g.total_k + bk - 1) / bk + g.batch;
  w.max_tasks = int64_t(g.num_heads_kv) * (by_batch < by_total ? by_batch : by_total);
  w.max_items = w.max_tasks + int64_t(FlexSplitSchedule::kItemsPerCta) * FlexSplitSchedule::kMaxCtas;
  w.max_split = w.max_tasks < FlexBwdSplit::kMaxSplit ? w.max_tasks : FlexBwdSplit::kMaxSplit;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += ws_align(bytes);
    return at;
  };
  w.take_all(take, w.max_tasks, w.max_items);
  w.dk_accum = take(sizeof(float) * size_t(w.max_split) * size_t(bk) * size_t(g.head_dim_qk));
  w.dv_accum = take(sizeof(float) * size_t(w.max_split) * size_t(bk) * size_t(g.head_dim_v));
  w.total = off;
  return w;
}

// Byte offsets into the forward workspace (a pure function of the geometry, the plan's
// pack_gqa flag and its forward tile Bq x Bk: plan.signature.consumer.fwd_block_q/_k).
// Empty (total 0) when no task can be split: a task has at most ceil(max_seqlen_k / Bk)
// steps and the chunk is at least kChunkMin. All offsets 256-aligned.
//   split schedule (FlexFwdSplit): hdr int32 [4]; task_iters, task_slot int32 [max_tasks];
//                  item_start int32 [max_tasks + 1]; items int32 [max_items, 4];
//                  o_accum fp32 [max_slots, Bq, Dv]; ml fp32 [max_slots, 2, Bq]
//   with P = G when packed (rows per query position, mask_plan.h "Packed GQA"), else 1, and
//   max_tasks = (Hq / P) * min(B * ceil(max_seqlen_q P / Bq), ceil(total_q P / Bq) + B)
//   (>= the plan's task heads x NQB: sum_b ceil(len_q(b) P / Bq)),
//   max_slots = min(2 * kMaxSplit, max_tasks * ceil(max_steps / 8)) (items of split tasks:
//   < 2 kMaxSplit, and each has >= 8 of the <= max_tasks * max_steps steps;
//   split_schedule_sm80.cuh), max_items = max_tasks + max_slots.
// Bytes: about max_slots * (Bq * Dv * 4 + 2 * Bq * 4), e.g. 2048 * 66 KB = 135 MB at
// (Bq, Dv) = (128, 128) for long sequences (17 MB with the 16-row decode tile).
struct FwdWorkspaceLayout : SplitScheduleOffsets {
  size_t o_accum = 0, ml = 0;
  size_t total = 0;
  int64_t max_tasks = 0, max_items = 0, max_slots = 0;
};

inline FwdWorkspaceLayout fwd_workspace_layout(const FlexGeometry& g, bool pack_gqa, int fwd_bq, int fwd_bk) {
  FwdWorkspaceLayout w;
  const int64_t bq = fwd_bq, bk = fwd_bk;
  if (bq <= 0 || bk <= 0) return w;
  const int64_t max_steps = (g.max_seqlen_k + bk - 1) / bk;
  if (max_steps <= FlexSplitSchedule::kChunkMin || g.total_q == 0) return w;
  const int64_t pack = fwd_pack_group(g, pack_gqa);
  const int64_t by_batch = int64_t(g.batch) * ((g.max_seqlen_q * pack + bq - 1) / bq);
  const int64_t by_total = (g.total_q * pack + bq - 1) / bq + g.batch;
  w.max_tasks = int64_t(g.num_heads_q / pack) * std::min(by_batch, by_total);
  w.max_slots = std::min<int64_t>(2 * FlexSplitSchedule::kMaxSplit, w.max_tasks * ((max_steps + 7) / 8));
  w.max_items = w.max_tasks + w.max_slots;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += ws_align(bytes);
    return at;
  };
  w.take_all(take, w.max_tasks, w.max_items);
  w.o_accum = take(sizeof(float) * size_t(w.max_slots) * size_t(bq) * size_t(g.head_dim_v));
  w.ml = take(sizeof(float) * size_t(w.max_slots) * 2 * size_t(bq));
  w.total = off;
  return w;
}

struct BwdLaunchSm80 {
  bool deterministic = false;
  int num_q_blocks = 0;     // bwd view NQB (all samples)
  int num_bwd_tasks = 0;    // dK/dV CTAs (tasks, or key blocks in grid mode)
  int64_t total_q = 0;
  int64_t max_seqlen_q = 0;
};
void launch_bwd_sm80(const FlexBwdParams& p, const TileSm80& tile, DType dtype, const BwdLaunchSm80& cfg,
                     cudaStream_t stream);

}  // namespace flashspan::sm80

// Kernel parameter blocks of the flex forward/backward kernels (plain C++, filled on the
// host by the launchers, passed by value to the kernels).
//
// Tensor addressing. Row i of sample b, head h of a [B,S,H,D] (BSHD) or [T,H,D] (THD) tensor
// starts at element
//   b * batch_stride + (row0(b) + i) * row_stride + h * head_stride
// where row0(b) = cu_seqlens[b] for THD (batch_stride = 0 then) and 0 for BSHD. The last
// dimension is contiguous. LSE uses the same formula with its own strides ([B,Hq,Sq] or
// [Hq,Tq], fp32). Sample lengths come from the plan's device copies of cu_seqlens, which
// hold b*S for BSHD, so len(b) = cu[b+1] - cu[b] in both layouts.
#pragma once

#include <cstdint>

#include "plan/mask_plan.h"

namespace flashspan {

struct FlexTensorAddr {
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;  // elements
};

struct FlexFwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  FlexTensorAddr qa, ka, va, oa;
  float* lse = nullptr;  // optional
  FlexTensorAddr lsea;
  float* max_logit = nullptr;  // optional, [Hq], reset to -inf before the kernel
  const int32_t* cu_seqlens_q = nullptr;  // device, [B+1]
  const int32_t* cu_seqlens_k = nullptr;
  int varlen = 0;
  int num_batch = 0;
  int num_heads_q = 0, group_size = 1, mask_per_head = 0;
  int dqk = 0, dv = 0;
  float scale = 0.f;       // softmax scale
  float scale_log2 = 0.f;  // scale * log2(e)
  PlanViewPtrs view;       // forward view, device pointers
  // 0: one CTA per entry of view.tasks (cost order); 1: grid (query block, head) over every
  // global query block, for plans whose task list omits blocks without visible keys.
  int grid_mode = 0;
};

// Split schedule of the non-deterministic dK/dV kernel (load balancing; see
// src/kernels/sm80/bwd_split_sm80.cuh). Backward task t (an entry of view.tasks) walks
// iters(t) (query head, query block) pairs: the concatenation over the kv group's query
// heads of each head's K2Q list in ascending query-block order. A work item is a range
// [begin, end) of those pairs; a task whose pairs exceed the run's chunk is split into
// several items whose dK/dV partial sums meet in fp32 accumulators (one slot per split
// task) and are converted afterwards. All arrays live in the backward workspace.
struct FlexBwdSplit {
  // hdr[kTotal]: number of items; hdr[kCounter]: next item to claim (zeroed by the scan
  // kernel); hdr[kChunk]: pairs per item of this run; hdr[kNumSplit]: split tasks.
  static constexpr int kTotal = 0, kCounter = 1, kChunk = 2, kNumSplit = 3, kHdrInts = 4;
  // Chunk = max(kChunkMin, ceil(total pairs / (kItemsPerCta * num_ctas)),
  //             ceil(total pairs / kMaxSplit)), so that
  //   items <= num_tasks + kItemsPerCta * num_ctas   and   split tasks < kMaxSplit.
  static constexpr int kChunkMin = 16;
  static constexpr int kItemsPerCta = 4;
  static constexpr int kMaxCtas = 1024;   // persistent grid cap (bounds the item list)
  static constexpr int kMaxSplit = 1024;  // accumulator slots (bounds the fp32 scratch)

  int32_t* hdr = nullptr;         // [kHdrInts]
  int32_t* task_iters = nullptr;  // [num_tasks] pairs of each task
  int32_t* item_start = nullptr;  // [num_tasks + 1] first item of each task (exclusive scan)
  int32_t* task_slot = nullptr;   // [num_tasks] accumulator slot of a split task, -1 if unsplit
  int32_t* items = nullptr;       // [max items * 4] {task, begin, end, slot}; nullptr = no split
                                  // schedule (one CTA per task or grid cell, direct writes)
  float* dk_accum = nullptr;      // [kMaxSplit or fewer slots, block_k, head_dqk] fp32, unscaled
  float* dv_accum = nullptr;      // [slots, block_k, head_dv] fp32
  int num_tasks = 0;
  int num_ctas = 0;               // persistent dK/dV grid
};

struct FlexBwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  FlexTensorAddr qa, ka, va, oa, doa, dqa, dka, dva;
  const float* lse = nullptr;
  FlexTensorAddr lsea;
  // Workspace, [Hq, total_q] fp32 each: D_i = dO_i . O_i, and LSE * log2(e) (+inf for an
  // empty row, so that exp2(s - lse2) = 0 there).
  float* delta = nullptr;
  float* lse2 = nullptr;
  float* dq_accum = nullptr;  // [Hq, total_q, Dqk] fp32 (atomic dQ path), else unused
  int64_t total_q = 0;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int varlen = 0;
  int batch = 0;
  int num_heads_q = 0, group_size = 1, mask_per_head = 0;
  int head_dqk = 0, head_dv = 0;
  float scale = 0.f, scale_log2 = 0.f;
  PlanViewPtrs view;  // backward view, device pointers
  int grid_mode = 0;  // dK/dV kernel: 0 = view.tasks, 1 = grid (key block, kv head)
  FlexBwdSplit split;  // non-deterministic task mode only (split.items != nullptr)
};

}  // namespace flashspan

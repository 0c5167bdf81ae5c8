// Workspace layouts of the flex forward and backward calls: byte offsets of the split
// schedule, the fp32 accumulators and the backward statistics inside the caller's workspace.
// Pure functions of the geometry and the plan's signature (never of the plan's arrays), so
// workspace_size() at compile() serves every compatible plan. Plain C++, no CUDA.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/geometry.h"
#include "kernels/params.h"
#include "kernels/sm90/tile_sm90.h"
#include "plan/mask_plan.h"

namespace flashspan {

// Byte offsets into the backward workspace (a pure function of the geometry and the plan's
// signature: its consumer's backward tile Bq x Bk and family). All offsets 256-aligned.
//   delta, lse2        fp32 [Hq, total_q] each
//   deterministic = true, sm90 plans of head dims the sm90 backward runs, adds:
//   dq_accum           fp32 [Hq, max_q_blocks, Bq, Dqk] (the sm90 tiles, below)
//   dq_sem             int32 [Hq, max_q_blocks, kDqSemStride]: the tiles' ordering counters, one per half of a tile
//                      (BwdParams::dq_chunks), each on a 128-byte line of its own
//   split schedule     as below, one slot per item of a split task (bwd_split.cuh, deterministic
//                      form): max_split = min(kMaxSplit, max(1, max_tasks * G * max_q_blocks_1 / 8)),
//                      G = Hq / Hkv, max_q_blocks_1 = ceil(min(max_seqlen_q, total_q) / Bq)
//   deterministic = false adds:
//   dq_accum           fp32 [Hq, total_q, Dqk]; for plans of the sm90 family (whose backward
//                      kernel adds dQ in Bq-row tiles, kernels/sm90/kernel_bwd_sm90.cuh) the
//                      larger of that and [Hq, max_q_blocks, Bq, Dqk], max_q_blocks =
//                      min(B * ceil(max_seqlen_q / Bq), ceil(total_q / Bq) + B) (>= the plan's
//                      backward query blocks)
//   split schedule     (BwdSplit): hdr int32 [4]; task_iters, task_slot int32 [max_tasks];
//                      item_start int32 [max_tasks + 1]; items int32 [max_items, 4];
//                      dk_accum fp32 [max_split, Bk, Dqk]; dv_accum fp32 [max_split, Bk, Dv]
//   with max_tasks = Hkv * min(B * ceil(max_seqlen_k / Bk), ceil(total_k / Bk) + B)  (>= the
//   plan's Hkv * NKB), max_items = max_tasks + kItemsPerCta * kMaxCtas,
//   max_split = min(max_tasks, kMaxSplit).
// The split-schedule arrays both workspaces hold (SplitSchedule), as byte offsets, in this
// order: hdr int32 [kHdrInts]; task_iters int32 [max_tasks]; item_start int32 [max_tasks + 1];
// task_slot int32 [max_tasks]; items int32 [max_items, 4].
struct SplitScheduleOffsets {
  size_t hdr = 0, task_iters = 0, item_start = 0, task_slot = 0, items = 0;

  // Lays the arrays out in that order with take(bytes) -> offset.
  template <class Take>
  void take_all(Take&& take, int64_t max_tasks, int64_t max_items) {
    hdr = take(sizeof(int32_t) * SplitSchedule::kHdrInts);
    task_iters = take(sizeof(int32_t) * size_t(max_tasks));
    item_start = take(sizeof(int32_t) * size_t(max_tasks + 1));
    task_slot = take(sizeof(int32_t) * size_t(max_tasks));
    items = take(4 * sizeof(int32_t) * size_t(max_items));
  }
  // Points the schedule's arrays into the workspace that starts at ws.
  void bind(SplitSchedule& s, char* ws) const {
    s.hdr = reinterpret_cast<int32_t*>(ws + hdr);
    s.task_iters = reinterpret_cast<int32_t*>(ws + task_iters);
    s.item_start = reinterpret_cast<int32_t*>(ws + item_start);
    s.task_slot = reinterpret_cast<int32_t*>(ws + task_slot);
    s.items = reinterpret_cast<int32_t*>(ws + items);
  }
};

struct BwdWorkspaceLayout : SplitScheduleOffsets {
  size_t delta = 0, lse2 = 0, dq_accum = 0, dq_sem = 0;
  size_t split_at = 0;  // where the split schedule's arrays start (the total without them)
  size_t dk_accum = 0, dv_accum = 0;
  size_t item_counter = 0;  // the sm90 SDPA backward's (sdpa_params.cpp sdpa_bwd_layout); 0: none
  size_t total = 0;
  int64_t max_tasks = 0, max_items = 0, max_split = 0;
};

inline size_t ws_align(size_t x) { return (x + 255) / 256 * 256; }

inline BwdWorkspaceLayout bwd_workspace_layout(const FlexGeometry& g, const PlanSignature& sig, bool deterministic) {
  BwdWorkspaceLayout w;
  const size_t per = ws_align(sizeof(float) * size_t(g.num_heads_q) * size_t(g.total_q));
  w.delta = 0;
  w.lse2 = per;
  size_t off = 2 * per;
  // Query blocks of the backward tile over all samples, a bound of the plan's (sm90 plans).
  const bool sm90 = sig.consumer.arch == 90 && g.total_q > 0 && sig.consumer.bwd_block_q > 0;
  int64_t max_q_blocks = 0;
  if (sm90) {
    const int64_t rows = sig.consumer.bwd_block_q;
    const int64_t by_total = (g.total_q + rows - 1) / rows + g.batch;
    const int64_t per_sample = (std::min(g.max_seqlen_q, g.total_q) + rows - 1) / rows;
    const int64_t by_batch =
        (g.batch > 0 && per_sample > by_total / g.batch) ? by_total : int64_t(g.batch) * per_sample;
    max_q_blocks = std::min(by_batch, by_total);
  }
  // (tiles as wide as the sm90 backward kernel's Dqk: the call's, or 64 / 128 for smaller dims)
  const size_t dq_tiles = sizeof(float) * size_t(g.num_heads_q) * size_t(max_q_blocks) *
                          size_t(std::max(sig.consumer.bwd_block_q, 0)) *
                          size_t(sm90 && sm90::bwd_runs_head_dims_sm90(g.head_dim_qk, g.head_dim_v)
                                     ? sm90::bwd_kernel_dims_sm90(g.head_dim_qk, g.head_dim_v).dqk
                                     : g.head_dim_qk);
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += ws_align(bytes);
    return at;
  };
  // The split schedule (BwdSplit) with max_split slots (fp32 [max_split, Bk, Dqk / Dv]).
  const int64_t bk = sig.consumer.bwd_block_k;
  auto take_split = [&](bool slot_per_item) {
    w.split_at = off;
    const int64_t by_batch_k = int64_t(g.batch) * ((g.max_seqlen_k + bk - 1) / bk);
    const int64_t by_total_k = (g.total_k + bk - 1) / bk + g.batch;
    w.max_tasks = int64_t(g.num_heads_kv) * (by_batch_k < by_total_k ? by_batch_k : by_total_k);
    w.max_items = w.max_tasks + int64_t(SplitSchedule::kItemsPerCta) * SplitSchedule::kMaxCtas;
    if (slot_per_item) {
      // One slot per item of a split task: fewer than kMaxSplit (split_rule.h, plan-only rule),
      // and fewer than total steps / 8 (each such item has at least 8 steps, split_schedule.cuh);
      // a task has at most group x (query blocks of a sample) steps.
      const int64_t rows = sig.consumer.bwd_block_q > 0 ? sig.consumer.bwd_block_q : 1;
      const int64_t q_blocks = (std::min(g.max_seqlen_q, g.total_q) + rows - 1) / rows;
      const int64_t steps = w.max_tasks * int64_t(g.num_heads_q / std::max(g.num_heads_kv, 1)) * q_blocks;
      w.max_split = std::max<int64_t>(1, std::min<int64_t>(BwdSplit::kMaxSplit, steps / 8));
    } else {
      w.max_split = w.max_tasks < BwdSplit::kMaxSplit ? w.max_tasks : BwdSplit::kMaxSplit;
    }
    w.take_all(take, w.max_tasks, w.max_items);
    w.dk_accum = take(sizeof(float) * size_t(w.max_split) * size_t(bk) * size_t(g.head_dim_qk));
    w.dv_accum = take(sizeof(float) * size_t(w.max_split) * size_t(bk) * size_t(g.head_dim_v));
  };
  if (deterministic) {
    // The sm90 backward's deterministic path: the tiles, their counters (dq_sem) and the
    // split schedule's deterministic form (one slot per item, bwd_split.cuh); the sm80 family's
    // dQ kernel needs none of them.
    // (No query rows: no tiles or counters, but the split schedule still runs the cells, which
    // write dK = dV = 0.)
    if (sig.consumer.arch == 90 && sig.consumer.bwd_block_q > 0 &&
        sm90::bwd_runs_head_dims_sm90(g.head_dim_qk, g.head_dim_v)) {
      if (sm90) {
        w.dq_accum = off;
        off += ws_align(dq_tiles);
        w.dq_sem = off;
        off += ws_align(sizeof(int32_t) * kDqSemStride * size_t(g.num_heads_q) * size_t(max_q_blocks));
      }
      take_split(true);
    } else {
      w.split_at = off;
    }
    w.total = off;
    return w;
  }
  w.dq_accum = off;
  off += ws_align(std::max(per * size_t(g.head_dim_qk), dq_tiles));
  take_split(false);
  w.total = off;
  return w;
}

// Byte offsets into the forward workspace (a pure function of the geometry and the plan's
// signature: its pack_gqa flag and its consumer's forward tile Bq x Bk, fwd_block_q/_k).
// Empty (total 0) when no task can be split: a task has at most ceil(max_seqlen_k / Bk)
// steps and the chunk is at least kChunkMin. All offsets 256-aligned.
//   split schedule (FwdSplit): hdr int32 [4]; task_iters, task_slot int32 [max_tasks];
//                  item_start int32 [max_tasks + 1]; items int32 [max_items, 4];
//                  o_accum fp32 [max_slots, Bq, Dv]; ml fp32 [max_slots, 2, Bq]
//   with P = G when packed (rows per query position, mask_plan.h "Packed GQA"), else 1, and
//   max_tasks = (Hq / P) * min(B * ceil(max_seqlen_q P / Bq), ceil(total_q P / Bq) + B)
//   (>= the plan's task heads x NQB: sum_b ceil(len_q(b) P / Bq)),
//   max_slots = min(2 * kMaxSplit, max_tasks * ceil(max_steps / 8)) (items of split tasks:
//   < 2 kMaxSplit, and each has >= 8 of the <= max_tasks * max_steps steps;
//   split_schedule.cuh), max_items = max_tasks + max_slots.
// Bytes: about max_slots * (Bq * Dv * 4 + 2 * Bq * 4), e.g. 2048 * 66 KB = 135 MB at
// (Bq, Dv) = (128, 128) for long sequences (17 MB with the 16-row decode tile).
struct FwdWorkspaceLayout : SplitScheduleOffsets {
  size_t o_accum = 0, ml = 0;
  size_t total = 0;
  int64_t max_tasks = 0, max_items = 0, max_slots = 0;
};

inline FwdWorkspaceLayout fwd_workspace_layout(const FlexGeometry& g, const PlanSignature& sig) {
  FwdWorkspaceLayout w;
  const int64_t bq = sig.consumer.fwd_block_q, bk = sig.consumer.fwd_block_k;
  if (bq <= 0 || bk <= 0) return w;
  const int64_t max_steps = (g.max_seqlen_k + bk - 1) / bk;
  if (max_steps <= SplitSchedule::kChunkMin || g.total_q == 0) return w;
  const int64_t pack = fwd_pack_group(g, sig.pack_gqa);
  // A sample is never longer than total_q (THD's max_seqlen_q may be a looser bound); the
  // product B * blocks-per-sample is only formed when it stays below by_total (no overflow).
  const int64_t by_total = (g.total_q * pack + bq - 1) / bq + g.batch;
  const int64_t per_sample = (std::min(g.max_seqlen_q, g.total_q) * pack + bq - 1) / bq;
  const int64_t by_batch = (g.batch > 0 && per_sample > by_total / g.batch) ? by_total : int64_t(g.batch) * per_sample;
  w.max_tasks = int64_t(g.num_heads_q / pack) * std::min(by_batch, by_total);
  w.max_slots = std::min<int64_t>(2 * SplitSchedule::kMaxSplit, w.max_tasks * ((max_steps + 7) / 8));
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

}  // namespace flashspan

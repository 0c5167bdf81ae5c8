// The chunk rule of the split schedule (split_schedule.cuh): how many steps a work item takes,
// from the whole run's step counts. Arch-neutral integer code for host and device (the scan
// kernel calls it; the CPU tests check its bounds, test_split_rule.cpp), no CUDA headers.
#pragma once

#include <cstdint>

#include "kernels/params.h"

#if defined(__CUDACC__)
#define FS_SPLIT_HD __host__ __device__ __forceinline__
#else
#define FS_SPLIT_HD inline
#endif

namespace flashspan::kern {

FS_SPLIT_HD int64_t split_max(int64_t a, int64_t b) { return a > b ? a : b; }
FS_SPLIT_HD int64_t split_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / (b > 0 ? b : 1); }

// How a run cuts its tasks: a task of more than `above` steps is split into ceil(steps / chunk)
// near-equal items (above >= chunk), any other task is one item.
struct SplitCut {
  int64_t chunk, above;
};

// Items of a task of `steps` steps under cut c.
FS_SPLIT_HD int64_t split_items(int64_t steps, SplitCut c) {
  return steps > c.above ? split_ceil_div(steps, c.chunk) : 1;
}

// The per-grid rule (forward, non-deterministic backward): steps per item of a run of
// `num_tasks` tasks with `total` steps in all, on a persistent grid of `num_ctas` CTAs (< 1
// counts as 1):
//   chunk = max(kChunkMin, ceil(total / (kItemsPerCta * ctas)), ceil(total / kMaxSplit),
//               ceil(2 total / num_tasks) when num_tasks >= ctas, or
//               ceil(total / (ctas - num_tasks)) when 2 num_tasks <= ctas).
FS_SPLIT_HD int64_t split_chunk(int64_t total, int64_t num_tasks, int64_t num_ctas) {
  const int64_t ctas = num_ctas > 0 ? num_ctas : 1;
  int64_t chunk = SplitSchedule::kChunkMin;
  chunk = split_max(chunk, split_ceil_div(total, int64_t(SplitSchedule::kItemsPerCta) * ctas));
  chunk = split_max(chunk, split_ceil_div(total, SplitSchedule::kMaxSplit));
  // Enough tasks to fill the grid: split only walks far above the mean. Causal-like masks
  // (longest walk < 2x the mean) then run unsplit, since their longest-first task order
  // already balances the grid and a split only adds the partial-sum traffic and the combine
  // (H200, S=8K causal forward: 341.6 TFLOP/s unsplit vs 314.7 split at the plain chunk).
  if (num_tasks >= ctas) {
    chunk = split_max(chunk, split_ceil_div(2 * total, num_tasks));
  } else if (2 * num_tasks <= ctas) {
    // Few tasks (decode, small batches): at most one item per CTA. With chunk >= total /
    // (ctas - n), sum ceil(it_t / chunk) <= total / chunk + n <= ctas, so every item starts at
    // once and no second, mostly idle wave follows (H200 packed decode, 32 tasks of 512 steps
    // on 792 CTAs: chunk 16 gave 1024 items, 1.3 waves; chunk 22 gives 768).
    chunk = split_max(chunk, split_ceil_div(total, ctas - num_tasks));
  }
  return chunk;
}

// Whether a run's walks are uneven: its longest task has more than twice the mean task's steps
// (`longest` of `num_tasks` tasks with `total` steps). Causal-like plans (every walk within 2x the
// mean, causal's longest exactly 2x) are not; document, tree, sink and global-token plans are. The
// deterministic sm90 backward claims its items in list order on uneven plans and runs the snake waves
// on the others (SplitSchedule::kUneven, BwdParams::det_claim; PERF_LOG v2.50).
FS_SPLIT_HD bool split_walks_uneven(int64_t longest, int64_t num_tasks, int64_t total) {
  return longest * num_tasks > 2 * total;
}

// Whether the deterministic sm90 backward claims its items in list order (else the snake waves): forced by
// det_claim (BwdParams::det_claim: 1 claim, 0 snake), or, det_claim < 0, the scan's answer (`uneven`,
// SplitSchedule::kUneven, split_walks_uneven).
FS_SPLIT_HD bool split_det_claims(int det_claim, int uneven) { return det_claim > 0 || (det_claim < 0 && uneven != 0); }

// The plan-only rule (the deterministic backward: one slot per item of a split task, the same
// split on every GPU whatever its SM count, so that dK / dV sum the same pieces in the same
// order). Its tasks run in dependency order (descending key blocks), so a long walk of a
// sink-like mask (key block 0) is among the last items of the list, and its item size is the
// tail of the run: long walks are cut finer than the per-grid rule cuts them, and only walks
// far above the mean are cut (as in the per-grid rule: causal walks stay whole):
//   first cut: chunk c1 = max(kChunkMin, ceil(total / (kPlanOnlyItemsPerCta * kPlanOnlyCtas))),
//              above max(c1, ceil(m total / num_tasks)), m = above_mean (2 unless the caller
//              asks for fewer cut walks: SplitSchedule::above_mean);
//   kept when its items of split tasks (sum of split_items over the tasks above) are fewer than
//   kMaxSplit, else chunk c2 = max(c1, ceil(2 total / kMaxSplit)), above max(c2, ceil(m total /
//   num_tasks)).
// Bounds: items <= num_tasks + total / chunk <= num_tasks + kPlanOnlyItemsPerCta *
// kPlanOnlyCtas; items of split tasks < kMaxSplit (first cut: by the test; else they are <=
// total / c2 + split tasks < 2 total / c2 <= kMaxSplit, a split task having more than c2
// steps); an item of a split task has >= floor(chunk / 2) >= 8 steps (split_schedule.cuh's
// argument, the task having more than chunk steps).
constexpr int64_t kPlanOnlyCtas = 132;        // an H100 / H200's SM count
constexpr int64_t kPlanOnlyItemsPerCta = 16;  // so items <= num_tasks + 2112 (workspace: + 4096)
static_assert(kPlanOnlyItemsPerCta * kPlanOnlyCtas <= int64_t(SplitSchedule::kItemsPerCta) * SplitSchedule::kMaxCtas,
              "the plan-only rule's items must fit the workspace's item list");

FS_SPLIT_HD SplitCut split_cut_plan_only_first(int64_t total, int64_t num_tasks, int64_t above_mean = 2) {
  const int64_t c1 = split_max(SplitSchedule::kChunkMin, split_ceil_div(total, kPlanOnlyItemsPerCta * kPlanOnlyCtas));
  return SplitCut{c1, split_max(c1, split_ceil_div(above_mean * total, num_tasks))};
}
// The cut from the first one and the items of split tasks under it.
FS_SPLIT_HD SplitCut split_cut_plan_only(int64_t total, int64_t num_tasks, SplitCut first, int64_t split_items_first,
                                         int64_t above_mean = 2) {
  if (split_items_first < SplitSchedule::kMaxSplit) return first;
  const int64_t c2 = split_max(first.chunk, split_ceil_div(2 * total, SplitSchedule::kMaxSplit));
  return SplitCut{c2, split_max(c2, split_ceil_div(above_mean * total, num_tasks))};
}

}  // namespace flashspan::kern

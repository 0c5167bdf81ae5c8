// Split schedule shared by the flex forward and the non-deterministic dK/dV backward: load
// balancing of kernels whose tasks walk block lists of very different lengths.
//
// Why: a task walks its list serially. A block every row sees (attention sinks, Longformer
// global tokens, a tree root's span) makes one task hundreds of steps long while the rest of
// the GPU idles. The schedule cuts long walks into work items that a persistent grid claims.
//
// Steps (all on the stream, no host sync, no allocation; arrays in SplitSchedule):
//   A. count  (caller's kernel, one thread per task): task_iters[t] = steps of task t.
//   S. scan   (one CTA, split_scan_kernel): total = sum of task_iters; chunk = max(kChunkMin,
//              ceil(total / (kItemsPerCta * num_ctas)), ceil(total / kMaxSplit), and, when
//              num_tasks >= num_ctas, ceil(2 * total / num_tasks), or, when 2 * num_tasks <=
//              num_ctas, ceil(total / (num_ctas - num_tasks)) (at most one item per CTA))
//              (split_rule.h, split_chunk; the deterministic backward has a rule of the plan
//              alone, split_cut_plan_only); a task with more than `chunk` steps (plan-only:
//              more than `above`) is split into ceil(steps / chunk) near-equal items;
//              exclusive scans give item_start and the slots (one per split task, or one per
//              item of a split task with kSlotPerItem); the header gets the item count, the
//              chunk, the slots used and a zeroed claim counter.
//   B. items  (one CTA per task, write_split_items): the task's items {task, begin, end,
//              slot} in task order (tasks are sorted by cost descending, so long tasks' items
//              come first).
//   then the persistent kernel claims items with an atomic counter, and a combine/convert
//   kernel finishes the split tasks.
// The split decision depends on the whole plan (total steps), so balanced masks (causal)
// split only their few longest tasks while sink / global-token masks split the long ones.
//
// Bounds (C = chunk, T = total steps, k = split tasks, it_t > C the steps of split task t):
//   k * C < sum it_t <= T <= kMaxSplit * C, so k < kMaxSplit;
//   items of split tasks = sum ceil(it_t / C) <= sum (it_t / C + 1) <= T / C + k < 2 kMaxSplit;
//   every item of a split task has >= floor(it_t / ceil(it_t / C)) >= floor(C / 2) >= 8
//   steps (it_t / ceil(it_t / C) >= it_t C / (it_t + C) > C / 2 as it_t > C), so split-task
//   items are also < T / 8 + 1; unsplit tasks give one item each.
//   items <= num_tasks + T / C <= num_tasks + kItemsPerCta * num_ctas.
//   The plan-only rule has bounds of its own (split_rule.h): items <= num_tasks +
//   kPlanOnlyItemsPerCta * kPlanOnlyCtas, items of split tasks < kMaxSplit.
#pragma once

#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/common/split_rule.h"
#include "kernels/params.h"

namespace flashspan::kern {

// S. Chunk, item offsets and slots. One CTA of kSplitScanThreads; thread i owns the
// contiguous task range [i * per, (i + 1) * per). kSlotPerItem: every item of a split task
// gets its own slot (forward, deterministic backward), else one slot per split task
// (non-deterministic backward). kRule: kSplitPerGrid (split_chunk, for num_ctas),
// kSplitPlanOnly (split_cut_plan_only: the deterministic backward), kSplitNone (every task one
// item: the deterministic backward without FLASHSPAN_EXPERIMENTAL=1, launch_sm90.h).
constexpr int kSplitScanThreads = 1024;

constexpr int kSplitPerGrid = 0, kSplitPlanOnly = 1, kSplitNone = 2;

// kSplitFirst (the per-grid rule only: the non-deterministic sm90 backward in cell order,
// kGridCellsAscending, with FLASHSPAN_EXPERIMENTAL=1: SplitSchedule::split_first; PERF_LOG v2.10:
// longformer +15 %, tree_bfs -7 % at S=131072): the items of every split task first (in task order), then the unsplit
// tasks' (in task order), so that the cut walks (sink columns, global tokens) start first and
// are spread over the heads, as in a longest-first list; item_start is then not monotone
// (write_split_items counts a task's items from the cut instead).
template <bool kSlotPerItem, int kRule = kSplitPerGrid, bool kSplitFirst = false>
__global__ void __launch_bounds__(kSplitScanThreads) split_scan_kernel(const SplitSchedule sp) {
  static_assert(!kSplitFirst || (kRule == kSplitPerGrid && !kSlotPerItem), "split-first lists: the per-grid rule");
  using Reduce = cub::BlockReduce<long long, kSplitScanThreads>;
  using Scan = cub::BlockScan<int, kSplitScanThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ long long s_total, s_max;
  const int n = sp.num_tasks;
  const int per = (n + kSplitScanThreads - 1) / kSplitScanThreads;
  const int t0 = min(n, int(threadIdx.x) * per), t1 = min(n, t0 + per);

  // The longest task: only the deterministic backward's rules (kSplitPlanOnly, kSplitNone) read it, for its item
  // order (kUneven).
  constexpr bool kLongest = kRule != kSplitPerGrid;
  long long local = 0, local_max = 0;
  for (int t = t0; t < t1; ++t) {
    local += sp.task_iters[t];
    if constexpr (kLongest) local_max = max(local_max, (long long)sp.task_iters[t]);
  }
  const long long sum = Reduce(tmp.reduce).Sum(local);
  if (threadIdx.x == 0) s_total = sum;
  __syncthreads();  // s_total visible; tmp reused
  if constexpr (kLongest) {
    const long long longest =
        Reduce(tmp.reduce).Reduce(local_max, [](long long a, long long b) { return a > b ? a : b; });
    if (threadIdx.x == 0) s_max = longest;
    __syncthreads();  // s_max visible; tmp free for the scans
  }
  const long long total = s_total;
  // split_rule.h: the per-grid rule, or the plan-only rule (its first cut, then the items of
  // split tasks under it summed over the block).
  SplitCut cut{};
  if constexpr (kRule == kSplitPlanOnly) {
    const SplitCut first = split_cut_plan_only_first(total, n, sp.above_mean);
    long long at_first = 0;
    for (int t = t0; t < t1; ++t) {
      const int it = sp.task_iters[t];
      if (it > first.above) at_first += split_items(it, first);
    }
    __syncthreads();  // tmp.reduce reused
    const long long s = Reduce(tmp.reduce).Sum(at_first);
    if (threadIdx.x == 0) s_total = s;
    __syncthreads();
    cut = split_cut_plan_only(total, n, first, s_total, sp.above_mean);
    __syncthreads();  // every thread has read s_total; tmp free for the scans
  } else if constexpr (kRule == kSplitNone) {
    cut = SplitCut{total + 1, total + 1};  // no task has more steps than the total
  } else {
    const long long chunk = split_chunk(total, n, sp.num_ctas);
    cut = SplitCut{chunk, chunk};
  }

  int items = 0, unsplit = 0, slots = 0;  // items: of split tasks only when kSplitFirst
  for (int t = t0; t < t1; ++t) {
    const int it = sp.task_iters[t];
    if (it > cut.above) {
      const int k = int(split_items(it, cut));
      items += k;
      slots += kSlotPerItem ? k : 1;
    } else if (kSplitFirst) {
      ++unsplit;
    } else {
      ++items;
    }
  }
  int item_base = 0, slot_base = 0, split_total = 0, unsplit_base = 0;
  Scan(tmp.scan).ExclusiveSum(items, item_base, split_total);
  __syncthreads();  // tmp reused
  Scan(tmp.scan).ExclusiveSum(slots, slot_base);
  if constexpr (kSplitFirst) {
    __syncthreads();
    Scan(tmp.scan).ExclusiveSum(unsplit, unsplit_base);
    unsplit_base += split_total;  // the unsplit tasks' items follow every split task's
  }
  for (int t = t0; t < t1; ++t) {
    const int it = sp.task_iters[t];
    if (it > cut.above) {
      const int k = int(split_items(it, cut));
      sp.item_start[t] = item_base;
      item_base += k;
      sp.task_slot[t] = slot_base;
      slot_base += kSlotPerItem ? k : 1;
    } else {
      sp.item_start[t] = kSplitFirst ? unsplit_base++ : item_base++;
      sp.task_slot[t] = -1;
    }
  }
  // The last thread's running sums are the totals (its range is the last, maybe empty).
  if (threadIdx.x == kSplitScanThreads - 1) {
    const int total_items = kSplitFirst ? unsplit_base : item_base;
    sp.item_start[n] = total_items;
    sp.hdr[SplitSchedule::kTotal] = total_items;
    sp.hdr[SplitSchedule::kCounter] = 0;
    sp.hdr[SplitSchedule::kChunk] = int(cut.chunk);
    sp.hdr[SplitSchedule::kNumSplit] = slot_base;
    sp.hdr[SplitSchedule::kUneven] = kLongest && split_walks_uneven(s_max, n, total) ? 1 : 0;
  }
}

// B. Items of task t, written by the threads of one CTA. Item i of n covers steps
// [i * it / n, (i + 1) * it / n); its slot is the task's (kSlotPerItem = false) or the
// task's first slot + i (kSlotPerItem = true); -1 for an unsplit task. split_first: a list
// of split_scan_kernel<..., kSplitFirst = true> (n from the header's chunk).
template <bool kSlotPerItem>
__device__ __forceinline__ void write_split_items(const SplitSchedule& sp, int t, bool split_first = false) {
  const int start = sp.item_start[t];
  int n = sp.item_start[t + 1] - start;
  if (split_first) {
    const int64_t chunk = sp.hdr[SplitSchedule::kChunk];
    n = int(split_items(sp.task_iters[t], SplitCut{chunk, chunk}));
  }
  const int it = sp.task_iters[t], slot = sp.task_slot[t];
  int4* items = reinterpret_cast<int4*>(sp.items);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int s = slot < 0 ? -1 : (kSlotPerItem ? slot + i : slot);
    items[start + i] = make_int4(t, int(int64_t(i) * it / n), int(int64_t(i + 1) * it / n), s);
  }
}

// Claim of the next work item by a CTA of a persistent grid (forward and dK/dV kernels):
// thread 0 takes index atomicAdd(counter) and writes that item {task, begin, end, slot} to
// s_item (int32 [4], shared), or task -1 once the list is exhausted. The first __syncthreads
// lets every thread finish with the previous item's shared memory (s_item included), the
// second publishes s_item. Returns the claimed task index, -1 when there is none left.
__device__ __forceinline__ int claim_split_item(const SplitSchedule& sp, int32_t* s_item) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const int i = atomicAdd(sp.hdr + SplitSchedule::kCounter, 1);
    int4 it = make_int4(-1, 0, 0, -1);
    if (i < sp.hdr[SplitSchedule::kTotal]) it = reinterpret_cast<const int4*>(sp.items)[i];
    s_item[0] = it.x;
    s_item[1] = it.y;
    s_item[2] = it.z;
    s_item[3] = it.w;
  }
  __syncthreads();
  return s_item[0];
}

}  // namespace flashspan::kern

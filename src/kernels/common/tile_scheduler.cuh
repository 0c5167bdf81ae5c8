// The tile scheduler role of the kernels of every family (arch-neutral): which work item a CTA
// runs next -- a block of the plan's view (query block forward, key block backward), its head
// and sample, and the range of its walk -- from one of the three sources of QkvParams:
//   split items  (split_schedule = 1): the split schedule's item list (split_schedule.cuh),
//                claimed in list order with its atomic counter; or, a list whose tasks are
//                every cell in descending block order (grid_mode, cell_descending: the
//                deterministic sm90 backward), taken in snake waves (next_cell_item);
//   grid cells   (grid_mode = 1): (block, head) over every block of every sample, for task
//                lists that omit blocks (folded as grid.h's grids: block fastest);
//   tasks        (otherwise): the view's task list, in its cost order;
//   SDPA grid    (AnalyticGrid, the analytic-mask kernels, no plan): (query block, query head,
//                sample) of every sample padded to the same number of query blocks.
// A persistent CTA asks for its n-th item (next): cell or task blockIdx.x + n gridDim.x, or the
// next claimed item. A one-CTA-per-task kernel reads its task with load_task.
#pragma once

#include <cstdint>

#include "kernels/common/block_range.cuh"
#include "kernels/params.h"

namespace flashspan::kern {

// An entry of a view's task list (mask_plan.h: {block, head, sample, cost}, longest first):
// forward {local query block, query head (the kv head when packed), sample}, backward
// {local key block, kv head, sample}. `tasks` is the view's pointer (view.tasks), taken by
// value: binding a reference to a kernel's parameter struct changed the sm80 kernels' code.
struct Task {
  int block, head, batch;
};

__device__ __forceinline__ Task load_task(const int32_t* tasks, int64_t t) {
  const int32_t* e = tasks + 4 * t;
  return Task{__ldg(e + 0), __ldg(e + 1), __ldg(e + 2)};
}

// Index of the n-th item of this CTA of a persistent grid taking a list in snake waves: wave n
// is items n gridDim.x .. (n + 1) gridDim.x - 1, which the CTAs take forwards on even waves and
// backwards on odd ones. For a list whose items shrink along it (longest first), a plain stride
// gives CTA 0 the longest item of every wave (+25 % work on the last CTA to finish at S = 32K
// causal, PERF_LOG v2.2 detsplit); the snake evens the sums. A CTA's items rise in index.
__device__ __forceinline__ int64_t snake_index(uint32_t n) {
  const int64_t lane = (n & 1) ? int64_t(gridDim.x) - 1 - blockIdx.x : int64_t(blockIdx.x);
  return int64_t(n) * gridDim.x + lane;
}

// A unit of work: steps [begin, begin + count) of the walk (the Q2K row forward, the K2Q walk
// backward) of local block `block` of head `head`, sample `batch`; slot >= 0 for an item of a
// split task (its workspace slot), -1 otherwise. block < 0: no work left.
struct WorkItem {
  int block, head, batch, begin, count, slot;
  static constexpr int kWholeWalk = 0x7fffffff;  // count of an unsplit item
};

// The scheduler of one kernel launch: copies of the few parameters it reads (values, for the
// reason load_task gives).
struct TileScheduler {
  const int32_t* tasks;        // view.tasks
  int64_t num_tasks;           // view.num_tasks
  const int32_t* block_start;  // first global block of each sample (view.q_block_start / k_block_start)
  int64_t num_blocks;          // global blocks over all samples
  int heads;                   // task heads: query heads forward (kv heads when packed), kv heads backward
  int batch;
  int32_t* hdr;                // split.hdr: item count and claim counter
  const int32_t* items;        // split.items {task, begin, end, slot}
  int split_schedule, grid_mode;
  int band = 1;                // cell_descending's band of blocks (BwdParams::det_band; 1: heads fastest)

  // Forward: query blocks of `task_heads` heads (Hq / pack).
  __device__ __forceinline__ static TileScheduler forward(const FwdParams& p, int task_heads) {
    return TileScheduler{p.view.tasks, p.view.num_tasks, p.view.q_block_start, p.view.num_q_blocks, task_heads,
                         p.batch,      p.split.hdr,      p.split.items,        p.split_schedule,    p.grid_mode,
                         1};
  }
  // Backward (dK/dV): key blocks of the kv heads.
  __device__ __forceinline__ static TileScheduler backward(const BwdParams& p) {
    return TileScheduler{p.view.tasks, p.view.num_tasks, p.view.k_block_start, p.view.num_k_blocks,
                         p.num_heads_q / p.group_size, p.batch, p.split.hdr, p.split.items, p.split_schedule,
                         p.grid_mode, p.det_band};
  }

  __device__ __forceinline__ static WorkItem none() { return WorkItem{-1, 0, 0, 0, 0, -1}; }

  // The whole walk of task t; none past the list.
  __device__ __forceinline__ WorkItem task(int64_t t) const {
    if (t >= num_tasks) return none();
    const Task k = load_task(tasks, t);
    return WorkItem{k.block, k.head, k.batch, 0, WorkItem::kWholeWalk, -1};
  }
  // The whole walk of grid cell i = head * num_blocks + global block; none past the grid.
  __device__ __forceinline__ WorkItem cell(int64_t i) const {
    if (i >= num_blocks * heads) return none();
    const int gb = int(i % num_blocks);
    const int b = find_block_owner(block_start, batch, gb);
    return WorkItem{gb - __ldg(block_start + b), int(i / num_blocks), b, 0, WorkItem::kWholeWalk, -1};
  }
  // The whole walk of cell i in descending block order (the deterministic sm90 backward's split
  // tasks: a key block's dQ tiles wait for the larger key blocks of its head, which this order
  // starts first), in bands of `band` blocks from the top, each band's cells head by head: band j
  // holds blocks num_blocks - 1 - j band down to w_j blocks (w_j = band but for a short last band),
  // its r-th cell block num_blocks - 1 - j band - r % w_j of head r / w_j. band 1: heads fastest
  // (block num_blocks - 1 - i / heads of head i % heads); band >= num_blocks: heads slowest (block
  // num_blocks - 1 - i % num_blocks of head i / num_blocks: the CTAs running at once walk one head's
  // query blocks, in L2 once, as kGridCellsAscending's; experimental, benchmarks/
  // det_schedule_model.py). Every band keeps each head's blocks descending, so a tile's earlier
  // additions (its head's larger blocks) are earlier cells. None past the grid.
  __device__ __forceinline__ WorkItem cell_descending(int64_t i) const {
    if (i >= num_blocks * heads) return none();
    // (32-bit: cells fit the workspace's int32 task list; 64-bit divisions spilled the producer.)
    const int c = int(i), nb = int(num_blocks);
    int gb, head;
    if (band <= 1) {
      gb = nb - 1 - c / heads;
      head = c % heads;
    } else {
      const int w = band < nb ? band : nb;
      const int j = c / (w * heads), r = c - j * w * heads;
      const int wj = min(w, nb - j * w);
      gb = nb - 1 - j * w - r % wj;
      head = r / wj;
    }
    const int b = find_block_owner(block_start, batch, gb);
    return WorkItem{gb - __ldg(block_start + b), head, b, 0, WorkItem::kWholeWalk, -1};
  }
  // Task t of the split schedule (its whole walk): the view's task t, or with grid_mode 1 the
  // descending cell t (cell_descending: the deterministic sm90 backward's split schedule, whose task
  // list is every cell in the order its dQ tiles are added). None past the list.
  // grid_mode kGridCellsAscending (the non-deterministic sm90 backward's cell order): cell(t),
  // heads slowest, blocks ascending.
  __device__ __forceinline__ WorkItem split_task(int64_t t) const {
    return grid_mode == kGridCellsAscending ? cell(t) : grid_mode ? cell_descending(t) : task(t);
  }
  // Item i of the split schedule's list (i < its item count): steps [begin, end) of split_task.
  __device__ __forceinline__ WorkItem split_item(int i) const {
    const int4 x = reinterpret_cast<const int4*>(items)[i];
    WorkItem w = split_task(x.x);
    w.begin = x.y;
    w.count = x.z - x.y;
    w.slot = x.w;
    return w;
  }
  // The next unclaimed item of the split list (one thread claims it); none once it is exhausted.
  __device__ __forceinline__ WorkItem claim() const {
    const int i = atomicAdd(hdr + SplitSchedule::kCounter, 1);
    if (i >= hdr[SplitSchedule::kTotal]) return none();
    return split_item(i);
  }
  // Item n of this CTA of a split list over descending cells (the deterministic sm90 backward):
  // one wave of gridDim.x items at a time, the CTAs taking a wave's items forwards on even waves
  // and backwards on odd ones (snake: causal walks grow with the index, so a plain stride would
  // give the last CTA the longest item of every wave, +25 % work at S = 32K causal; measured on
  // the H200, claiming items with the counter instead ran causal at 426 TFLOP/s against the
  // snake's 552, PERF_LOG v2.2 detsplit). A CTA's items rise in index, so the lowest unfinished
  // item's CTA is always running it: waits on lower items (larger blocks) cannot deadlock.
  // None past the list.
  __device__ __forceinline__ WorkItem next_cell_item(uint32_t n) const {
    const int64_t i = snake_index(n);
    if (i >= hdr[SplitSchedule::kTotal]) return none();
    return split_item(int(i));
  }
  // Item n of this CTA of a persistent grid (n = 0, 1, ...; one thread asks).
  __device__ __forceinline__ WorkItem next(uint32_t n) const {
    if (split_schedule) return claim();
    const int64_t i = int64_t(blockIdx.x) + int64_t(n) * gridDim.x;
    return grid_mode ? cell(i) : task(i);
  }
};

// The work items of a persistent analytic-mask (SDPA) forward: cells (query block, query head,
// sample) of `batch` samples padded to `num_q_blocks` blocks each, the last query block first
// (cell i: block num_q_blocks - 1 - i / (heads * batch), head i % heads, sample i / heads %
// batch): under a causal band the last blocks walk the most key blocks, so the longest cells
// start first. A CTA takes the cells in snake waves (next(n), snake_index); none past the grid.
// A grid of one CTA per cell (the sm80 SDPA forward and deterministic dQ kernels) runs the same
// order with next(0): CTA i's first item is cell i (snake_index(0) = blockIdx.x), the hardware
// starting the CTAs in index order.
// group > 0 (the sm90 forward: AnalyticMaskParams::l2_group, launch_fwd_sm90.cu set_sdpa_fwd_l2_group; by default
// for calls without a left bound or a block mask): the same order inside groups of `group`
// consecutive (sample, head) pairs r = b heads + h, the groups one after the other, so that the CTAs of a wave walk the
// K / V of a few heads (in L2 once) instead of every head's (PERF_LOG v2.59: B=4 H=16 S=8192 causal read 4.7 GB of
// DRAM for 0.4 GB of Q / K / V, L2 hit rate 48 %); each group still starts with its longest cells.
// counter (non-null: the sm90 forward's grouped cells of unequal cost, analytic_mask.h sdpa_fwd_cells_unequal: a
// causal band by default, a window or a block mask where the group size is forced): the cells claimed in list order
// (one atomic add a cell, the counter zeroed before the launch), not in snake waves: the waves balance a list whose
// cost falls slowly along it, which the groups' sawtooth is not (PERF_LOG v2.60: causal S = 8192 in groups of 4 ran
// at 0.7x the ungrouped order). n is then unused.
//
// grouped_cell: cell i of both analytic grids' grouped lists (`blocks` blocks of `pairs` (sample, head) pairs, pairs
// fastest, in groups of `group` consecutive pairs one after the other, the partial group (pairs % group pairs) first;
// group <= 0 or >= pairs: one group): its step along the group's walk (0 first; the forward counts its query blocks
// down from it) and pair. The partial group first: last, its few pairs' longest cells started only as the list ran
// out, a tail of one walk (PERF_LOG v2.61: 16 pairs in groups of 3 ran 12-15 % slower than in groups of 2 or 4, both
// directions); first, the list ends on a whole group as a size dividing the pairs does.
__device__ __forceinline__ void grouped_cell(int64_t i, int64_t blocks, int64_t pairs, int group, int64_t& step,
                                             int64_t& pair) {
  if (group <= 0 || group >= pairs) {
    step = i / pairs;
    pair = i % pairs;
    return;
  }
  const int64_t partial = pairs % group;  // the first group's pairs when partial (0: every group whole)
  int64_t first = 0, size = partial, j = i;
  if (i >= partial * blocks) {
    const int64_t k = i - partial * blocks;
    first = partial + k / (int64_t(group) * blocks) * group;
    size = group;
    j = i - first * blocks;
  }
  step = j / size;
  pair = first + j % size;
}

struct AnalyticGrid {
  int num_q_blocks, heads, batch;
  int group = 0;
  int* counter = nullptr;

  __device__ __forceinline__ WorkItem next(uint32_t n) const {
    const int64_t i = counter != nullptr ? int64_t(atomicAdd(counter, 1)) : snake_index(n);
    const int64_t per_block = int64_t(heads) * batch;
    if (i >= per_block * num_q_blocks) return TileScheduler::none();
    int64_t qb, r;
    grouped_cell(i, num_q_blocks, per_block, group, qb, r);
    return WorkItem{int(num_q_blocks - 1 - qb), int(r % heads), int(r / heads), 0, WorkItem::kWholeWalk, -1};
  }
};

// The work items of a persistent analytic-mask (SDPA) backward: cells (key block, kv head,
// sample) of `batch` samples padded to `num_k_blocks` key blocks each, whole walks.
//   next(n), cell i = snake_index(n) (snake waves: the cells of a band shrink along the list):
//     heads_slowest (no band: analytic_mask.h sdpa_bwd_grid_heads_slowest): global key block
//       i % (num_k_blocks batch) (sample-major) of head i / (num_k_blocks batch), as the flex
//       grid's cells, so that the CTAs of a wave walk the same head's Q / dO (in L2 once);
//     else (a causal band or a window): key block i / (heads batch), ascending (the first key
//       blocks walk the most query blocks: the longest cells first), head i % heads, sample
//       i / heads % batch.
//     Measured on the H200 (PERF_LOG v2.2, B=1 H=16 D=128): no mask, S=32768, 483 (heads
//     fastest) -> 531 TFLOP/s (heads slowest); causal 469 -> 422, S=8192 causal 463 -> 338, so
//     each order is kept where it was the faster;
//   next_descending(n): the deterministic order (as TileScheduler::next_cell_item's over
//     uncut cells) over the global key blocks gb = b num_k_blocks + kb, descending, heads
//     fastest, snake waves: a key
//     block's dQ additions wait only for larger key blocks of its own sample, which are lower
//     cells, so the lowest unfinished cell never waits (kernel_bwd_sm90.cuh).
//   next(0) in a grid of one CTA per cell (the sm80 SDPA dK/dV kernel): cell blockIdx.x.
// None past the grid. slot(kb, head, b): the cell's index in (sample, head, key block) order,
// whatever the order the cells run in (the sm90 backward's dK / dV slots of H_k != H_v,
// kernel_bwd_sm90.cuh AnalyticSourceBwdSm90).
// group > 0, counter (the sm90 non-deterministic backward with heads fastest, AnalyticMaskParams::l2_group /
// item_counter): the heads-fastest order inside groups of `group` consecutive (sample, kv head) pairs, one group
// after the other, so that the CTAs of a wave walk the Q / dO / dQ of a few heads (in L2 once) instead of every
// head's (PERF_LOG v2.61: B=4 H=16 S=8192 causal read 12.9 GB of DRAM, L2 hit rate 45 %), the cells claimed in list
// order by the warp's lane 0 (next_warp), as AnalyticGrid's. The deterministic order likewise (next_descending_warp,
// cell_descending): inside each group the pairs' key blocks descending, pairs fastest, so that a pair's larger key
// blocks are still lower cells.
struct AnalyticBwdGrid {
  int num_k_blocks, heads, batch;
  bool heads_slowest;
  int group = 0;
  int* counter = nullptr;

  __device__ __forceinline__ int64_t slot(int kb, int head, int b) const {
    return (int64_t(b) * heads + head) * num_k_blocks + kb;
  }

  __device__ __forceinline__ WorkItem cell(int64_t i) const {
    const int64_t blocks = int64_t(num_k_blocks) * batch;
    if (i >= blocks * heads) return TileScheduler::none();
    if (heads_slowest) {
      const int64_t gb = i % blocks;
      return WorkItem{int(gb % num_k_blocks), int(i / blocks), int(gb / num_k_blocks), 0, WorkItem::kWholeWalk, -1};
    }
    int64_t kb, r;
    grouped_cell(i, num_k_blocks, int64_t(heads) * batch, group, kb, r);
    return WorkItem{int(kb), int(r % heads), int(r / heads), 0, WorkItem::kWholeWalk, -1};
  }
  __device__ __forceinline__ WorkItem next(uint32_t n) const { return cell(snake_index(n)); }
  // The list index that lane 0 claims through the counter, broadcast to the warp (the whole warp calls it).
  __device__ __forceinline__ int64_t claim_warp(int lane) const {
    int c = 0;
    if (lane == 0) c = atomicAdd(counter, 1);
    return __shfl_sync(0xffffffffu, c, 0);
  }
  // The whole warp asks (lane: its lane): claimed by lane 0 through the counter when there is one, else next(n).
  __device__ __forceinline__ WorkItem next_warp(uint32_t n, int lane) const {
    return counter == nullptr ? next(n) : cell(claim_warp(lane));
  }
  // Cell i of the deterministic list: ungrouped (group 0), global key blocks gb = b num_k_blocks + kb descending, heads
  // fastest; grouped, each group's key blocks descending, its pairs fastest (grouped_cell). Either way a pair's larger
  // key blocks are lower cells.
  __device__ __forceinline__ WorkItem cell_descending(int64_t i) const {
    const int64_t blocks = int64_t(num_k_blocks) * batch;
    if (i >= blocks * heads) return TileScheduler::none();
    if (group > 0) {
      int64_t step, r;
      grouped_cell(i, num_k_blocks, int64_t(heads) * batch, group, step, r);
      return WorkItem{int(num_k_blocks - 1 - step), int(r % heads), int(r / heads), 0, WorkItem::kWholeWalk, -1};
    }
    const int64_t gb = blocks - 1 - i / heads;
    return WorkItem{int(gb % num_k_blocks), int(i % heads), int(gb / num_k_blocks), 0, WorkItem::kWholeWalk, -1};
  }
  __device__ __forceinline__ WorkItem next_descending(uint32_t n) const { return cell_descending(snake_index(n)); }
  // The whole warp asks: claimed in list order by lane 0 when there is a counter (the grouped deterministic order),
  // else next_descending(n). Claims keep the progress argument of the snake: a CTA's items rise in index, so the
  // lowest unfinished cell's CTA is running it and it waits on lower cells only.
  __device__ __forceinline__ WorkItem next_descending_warp(uint32_t n, int lane) const {
    return counter == nullptr ? next_descending(n) : cell_descending(claim_warp(lane));
  }
};

}  // namespace flashspan::kern

// Split schedule of the flex backward: load balancing of the dK/dV kernel.
//
// Why: a dK/dV task (key block, kv head, batch) walks the K2Q lists of its kv group's query
// heads serially. A key block that every query sees (attention sinks, a tree root's span,
// Longformer global tokens) has S/Bq pairs per head, so one CTA works hundreds of steps
// while the rest of the GPU idles. The schedule cuts long walks into work items.
//
// Two forms (p.deterministic):
//   non-deterministic: the tasks are the view's task list (cost order); one fp32 slot per
//     split task, which its items add into with fp32 atomics; the chunk is split_chunk's
//     (split_rule.h) for the run's persistent grid.
//   deterministic (the sm90 backward, grid_mode = 1): the tasks are every cell (key block, kv
//     head) in descending key-block order, heads fastest (TileScheduler::cell_descending, the
//     order its dQ tiles are added in); one slot per item, which that item alone writes; the
//     convert sums a task's slots in item order; the cut is split_cut_plan_only's (the
//     same split on every GPU, whatever its SM count), so dK / dV are bitwise reproducible.
//     An item of key block kb covers a disjoint range of its walk's (query head, query block)
//     pairs, so every dQ tile still gets exactly one addition from kb (kernel_bwd_sm90.cuh).
//
// Steps (all on the stream, no host sync, no allocation; arrays in BwdParams::split):
//   A. count   (one thread per task):  task_iters[t] = pairs of task t (K2Q list lengths
//               summed over the group's query heads).
//   S. scan    (one CTA, split_schedule.cuh): total = sum of task_iters; the chunk
//               (split_rule.h); a task with more than `chunk` pairs is split into
//               ceil(pairs / chunk) near-equal items and gets its slot(s); the header gets
//               the item count and a zeroed claim counter.
//   B. items   (one CTA per task): writes the task's items {task, begin, end, slot} in task
//               order and zeroes the slots of a split task.
//   dK/dV      (persistent, kernel_bwd_sm80.cuh / kernel_bwd_sm90.cuh): claims items with an
//               atomic counter.
//   C. convert (one CTA per task): dk = scale * accumulator, dv = accumulator for the rows
//               of split tasks (unsplit tasks were written directly by the dK/dV kernel).
// The split decision depends on the whole plan (total pairs), so balanced masks (causal)
// split only their few longest tasks while sink / global-token masks split the long ones.
#pragma once

#include <cstdint>

#include "kernels/common/block_range.cuh"
#include "kernels/params.h"
#include "kernels/common/ptx.cuh"
#include "kernels/common/split_schedule.cuh"
#include "kernels/common/tile_scheduler.cuh"

namespace flashspan::kern {

// A. Pairs of every task. Grid ceil(num_tasks / 256), 256 threads.
__global__ void __launch_bounds__(256) flex_bwd_split_count_kernel(const BwdParams p) {
  const int t = blockIdx.x * 256 + threadIdx.x;
  if (t >= p.split.num_tasks) return;
  const WorkItem task = TileScheduler::backward(p).split_task(t);
  const int kb = task.block, hkv = task.head, b = task.batch;
  const int64_t gk = int64_t(__ldg(p.view.k_block_start + b)) + kb;
  int n = 0;
  for (int h = hkv * p.group_size; h < (hkv + 1) * p.group_size; ++h) {
    const int64_t r = int64_t(p.mask_per_head ? h : 0) * p.view.num_k_blocks + gk;
    n += BlockCursor::row(p.view.k2q_partial_ptr, p.view.k2q_partial_qb, p.view.k2q_full_ptr, p.view.k2q_full_runs, r)
             .remaining();
  }
  p.split.task_iters[t] = n;
}

// B. Items of task blockIdx.x, and zeroed accumulators for a split task: one slot per split
// task, or, deterministic, one per item (its slots consecutive from task_slot). Grid
// num_tasks, 256 threads.
__global__ void __launch_bounds__(256) flex_bwd_split_items_kernel(const BwdParams p) {
  const BwdSplit& sp = p.split;
  const int t = blockIdx.x;
  int slots = 1;
  if (p.deterministic) {
    write_split_items<true>(sp, t);
    slots = sp.item_start[t + 1] - sp.item_start[t];
  } else {
    write_split_items<false>(sp, t, sp.split_first != 0);  // split-first list (launch_bwd_common.cu)
  }
  const int slot = sp.task_slot[t];
  if (slot < 0) return;
  const int64_t bk = p.view.block_k;
  // head dims are multiples of 8, slots start at multiples of 16 bytes.
  float4* dk = reinterpret_cast<float4*>(sp.dk_accum + int64_t(slot) * bk * p.head_dqk);
  float4* dv = reinterpret_cast<float4*>(sp.dv_accum + int64_t(slot) * bk * p.head_dv);
  const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t i = threadIdx.x; i < slots * bk * p.head_dqk / 4; i += blockDim.x) dk[i] = z;
  for (int64_t i = threadIdx.x; i < slots * bk * p.head_dv / 4; i += blockDim.x) dv[i] = z;
}

// C. dk / dv rows of split task blockIdx.x from its accumulators: one slot, or, deterministic,
// the sum of its items' slots in item order (each written by one item alone). Grid num_tasks,
// 256 threads.
template <class E>
__global__ void __launch_bounds__(256) flex_bwd_split_convert_kernel(const BwdParams p) {
  using Elem = typename E::Storage;
  const BwdSplit& sp = p.split;
  const int t = blockIdx.x;
  const int slot = sp.task_slot[t];
  if (slot < 0) return;
  const int slots = p.deterministic ? sp.item_start[t + 1] - sp.item_start[t] : 1;
  const WorkItem task = TileScheduler::backward(p).split_task(t);
  const int kb = task.block, hkv = task.head, b = task.batch;
  const int bk = p.view.block_k;
  const int k_start = __ldg(p.cu_seqlens_k + b), len_k = __ldg(p.cu_seqlens_k + b + 1) - k_start;
  const int key0 = kb * bk;
  const int keys_valid = min(bk, len_k - key0);
  const int64_t krow = int64_t(p.varlen ? k_start : 0) + key0;
  // Sum of the slots slot .. slot + slots - 1 at float offset i of a slot of `per` floats.
  auto sum2 = [&](const float* acc, int64_t per, int64_t i) {
    float2 x = *reinterpret_cast<const float2*>(acc + int64_t(slot) * per + i);
    for (int s = 1; s < slots; ++s) {
      const float2 y = *reinterpret_cast<const float2*>(acc + int64_t(slot + s) * per + i);
      x.x += y.x;
      x.y += y.y;
    }
    return x;
  };
  {
    Elem* dst = static_cast<Elem*>(p.dk) + int64_t(b) * p.dka.batch_stride + krow * p.dka.row_stride +
                int64_t(hkv) * p.dka.head_stride;
    const int pairs = p.head_dqk / 2;
    for (int i = threadIdx.x; i < keys_valid * pairs; i += blockDim.x) {
      const int key = i / pairs, c = 2 * (i - key * pairs);
      const float2 x = sum2(sp.dk_accum, int64_t(bk) * p.head_dqk, int64_t(key) * p.head_dqk + c);
      *reinterpret_cast<uint32_t*>(dst + int64_t(key) * p.dka.row_stride + c) =
          pack2<E>(x.x * p.scale, x.y * p.scale);
    }
  }
  {
    Elem* dst = static_cast<Elem*>(p.dv) + int64_t(b) * p.dva.batch_stride + krow * p.dva.row_stride +
                int64_t(hkv) * p.dva.head_stride;
    const int pairs = p.head_dv / 2;
    for (int i = threadIdx.x; i < keys_valid * pairs; i += blockDim.x) {
      const int key = i / pairs, c = 2 * (i - key * pairs);
      const float2 x = sum2(sp.dv_accum, int64_t(bk) * p.head_dv, int64_t(key) * p.head_dv + c);
      *reinterpret_cast<uint32_t*>(dst + int64_t(key) * p.dva.row_stride + c) = pack2<E>(x.x, x.y);
    }
  }
}

}  // namespace flashspan::kern

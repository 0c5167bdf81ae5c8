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
//     head) in descending key-block order, heads fastest or (experimental) in bands head by
//     head (TileScheduler::cell_descending, BwdParams::det_band; its dQ tiles are added in
//     descending key-block order); one slot per item, which that item alone writes; the
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
//   B. items   (kSplitRowGroups CTAs per task): the first writes the task's items {task, begin,
//               end, slot} in task order; each zeroes its rows of the split task's slots
//               (unless each item stores its own slot whole: BwdParams::det_own_slots).
//   dK/dV      (persistent, kernel_bwd_sm80.cuh / kernel_bwd_sm90.cuh): claims items with an
//               atomic counter.
//   C. convert (kSplitRowGroups CTAs per task, each a group of its rows): dk = scale *
//               accumulator, dv = accumulator for the rows of split tasks (unsplit tasks were
//               written directly by the dK/dV kernel).
// (Steps B and C had one CTA per task: a deterministic sink column cut into 32 items made its one
// CTA zero and sum 4 MB alone, 0.07 + 0.28 ms beside the dK/dV kernel's 0.33 ms on the H200,
// PERF_LOG v2.32.)
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

// Row groups of a split task's key block that steps B and C spread over CTAs (grid.y).
constexpr int kSplitRowGroups = 8;

// Rows [r0, r1) of row group g of a key block of bk rows.
__device__ __forceinline__ int2 split_row_group(int64_t bk, int g) {
  return make_int2(int(bk * g / kSplitRowGroups), int(bk * (g + 1) / kSplitRowGroups));
}

// B. Items of task blockIdx.x (written by row group 0), and zeroed accumulators for a split task,
// rows of row group blockIdx.y: one slot per split task, or, deterministic, one per item (its
// slots consecutive from task_slot). Grid (num_tasks, kSplitRowGroups), 256 threads.
__global__ void __launch_bounds__(256) flex_bwd_split_items_kernel(const BwdParams p) {
  const BwdSplit& sp = p.split;
  const int t = blockIdx.x;
  int slots = 1;
  if (p.deterministic) {
    if (blockIdx.y == 0) write_split_items<true>(sp, t);
    slots = sp.item_start[t + 1] - sp.item_start[t];
  } else if (blockIdx.y == 0) {
    write_split_items<false>(sp, t, sp.split_first != 0);  // split-first list (launch_bwd_common.cu)
  }
  const int slot = sp.task_slot[t];
  // Own slots (deterministic, BwdParams::det_own_slots): each item stores its slot whole (kernel_bwd_sm90.cuh
  // split_slot_owned), nothing to zero.
  if (slot < 0 || p.det_own_slots) return;
  const int64_t bk = p.view.block_k;
  const int2 rows = split_row_group(bk, blockIdx.y);
  const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
  // head dims are multiples of 8, slots start at multiples of 16 bytes.
  auto zero = [&](float* acc, int64_t d) {
    const int64_t per = (rows.y - rows.x) * d / 4;  // float4s of the group in one slot
    for (int64_t i = threadIdx.x; i < slots * per; i += blockDim.x) {
      const int64_t s = i / per;
      reinterpret_cast<float4*>(acc + ((slot + s) * bk + rows.x) * d)[i - s * per] = z;
    }
  };
  zero(sp.dk_accum, p.head_dqk);
  zero(sp.dv_accum, p.head_dv);
}

// C. dk / dv rows of row group blockIdx.y of split task blockIdx.x from its accumulators: one
// slot, or, deterministic, the sum of its items' slots in item order (each written by one item
// alone; the loads of four slots issued together, the additions in order). Grid (num_tasks,
// kSplitRowGroups), 256 threads.
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
  const int2 rows = split_row_group(bk, blockIdx.y);
  const int row1 = min(rows.y, keys_valid);
  if (rows.x >= row1) return;
  const int64_t krow = int64_t(p.varlen ? k_start : 0) + key0;
  // Sum of the slots slot .. slot + slots - 1 at float offset i of a slot of `per` floats, in slot
  // order (four slots' loads in flight at a time).
  auto sum4 = [&](const float* acc, int64_t per, int64_t i) {
    const float* a = acc + int64_t(slot) * per + i;
    float4 x = *reinterpret_cast<const float4*>(a);
    int s = 1;
    for (; s + 4 <= slots; s += 4) {
      float4 y[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) y[u] = *reinterpret_cast<const float4*>(a + int64_t(s + u) * per);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        x.x += y[u].x;
        x.y += y[u].y;
        x.z += y[u].z;
        x.w += y[u].w;
      }
    }
    for (; s < slots; ++s) {
      const float4 y = *reinterpret_cast<const float4*>(a + int64_t(s) * per);
      x.x += y.x;
      x.y += y.y;
      x.z += y.z;
      x.w += y.w;
    }
    return x;
  };
  // (head dims are multiples of 8: a row is whole float4s)
  auto convert = [&](const float* acc, Elem* dst, int64_t row_stride, int d, float mul) {
    const int quads = d / 4;
    for (int i = rows.x * quads + int(threadIdx.x); i < row1 * quads; i += blockDim.x) {
      const int key = i / quads, c = 4 * (i - key * quads);
      const float4 x = sum4(acc, int64_t(bk) * d, int64_t(key) * d + c);
      uint32_t* o = reinterpret_cast<uint32_t*>(dst + int64_t(key) * row_stride + c);
      o[0] = pack2<E>(x.x * mul, x.y * mul);
      o[1] = pack2<E>(x.z * mul, x.w * mul);
    }
  };
  convert(sp.dk_accum,
          static_cast<Elem*>(p.dk) + int64_t(b) * p.dka.batch_stride + krow * p.dka.row_stride +
              int64_t(hkv) * p.dka.head_stride,
          p.dka.row_stride, p.head_dqk, p.scale);
  convert(sp.dv_accum,
          static_cast<Elem*>(p.dv) + int64_t(b) * p.dva.batch_stride + krow * p.dva.row_stride +
              int64_t(hkv) * p.dva.head_stride,
          p.dva.row_stride, p.head_dv, 1.0f);
}

}  // namespace flashspan::kern

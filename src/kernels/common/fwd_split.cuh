// Split schedule of the flex forward: load balancing of long Q2K walks.
//
// Why: a forward task (query block, head, batch) walks its Q2K lists serially, and a query
// block holding a row that sees every key (Longformer global tokens, dense prefixes) walks
// all S / Bk key blocks alone while the rest of the GPU idles.
//
// Steps (on the stream, no host sync, no allocation; arrays in FwdParams::split):
//   A. count   (one thread per task): task_iters[t] = key blocks of task t's Q2K row
//               (full + partial list lengths).
//   S. scan, B. items: split_schedule.cuh with one slot per item of a split task.
//   forward    sm80 (kernel_fwd_sm80.cuh): when no task was split (hdr[kNumSplit] = 0), the
//               one-CTA-per-task kernel, as without a schedule; otherwise the persistent
//               kernel. sm90 (kernel_fwd_sm90.cuh): always its persistent kernel. A persistent
//               kernel claims items with an atomic counter; an unsplit task's item writes O,
//               LSE as always; an item of a split task writes its unnormalised fp32 O_i and
//               per-row m_i (log2 units), l_i to its slot.
//   C. combine (one CTA per task, split tasks only): per row m = max m_i,
//               l = sum l_i 2^(m_i - m), out = sum O_i 2^(m_i - m) / l,
//               LSE = (m + log2 l) ln 2; rows with no visible key (l = 0) give out 0 and
//               LSE -inf (m_i = -inf contributes weight 0, never NaN). Items are merged in
//               list order, so the result does not depend on which CTA ran which item.
// Packed GQA (p.pack = G > 1): tasks are {packed block, kv head, batch}; slots hold the
// block's packed rows, and the combine maps row r to (position, query head) as the forward
// epilogue does (params.h).
#pragma once

#include <cstdint>

#include "kernels/common/block_range.cuh"
#include "kernels/params.h"
#include "kernels/common/ptx.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/common/split_schedule.cuh"
#include "kernels/common/tile_scheduler.cuh"

namespace flashspan::kern {

// A. Key blocks of every task. Grid ceil(num_tasks / 256), 256 threads. The CSR head is the
// task head (query head, or packed: kv head = virtual mask head) when masks are per head.
__global__ void __launch_bounds__(256) flex_fwd_split_count_kernel(const FwdParams p) {
  const int t = blockIdx.x * 256 + threadIdx.x;
  if (t >= p.split.num_tasks) return;
  const Task task = load_task(p.view.tasks, t);
  const int qb = task.block, h = task.head, b = task.batch;
  const int64_t r = int64_t(p.mask_per_head ? h : 0) * p.view.num_q_blocks + __ldg(p.view.q_block_start + b) + qb;
  p.split.task_iters[t] =
      BlockCursor::row(p.view.q2k_partial_ptr, p.view.q2k_partial_kb, p.view.q2k_full_ptr, p.view.q2k_full_runs, r)
          .remaining();
}

// B. Items of task blockIdx.x. Grid num_tasks, 256 threads. kAlways = false: nothing to do
// when no task is split (sm80: the one-CTA-per-task kernel runs then and reads no item);
// kAlways = true: every call (sm90: the persistent kernel always runs the item list).
template <bool kAlways>
__global__ void __launch_bounds__(256) flex_fwd_split_items_kernel(const FwdParams p) {
  if (!kAlways && p.split.hdr[SplitSchedule::kNumSplit] == 0) return;
  write_split_items<true>(p.split, blockIdx.x);
}

// C. Rows of split task blockIdx.x from its items' slots. Grid num_tasks, 256 threads;
// block_q <= FwdSplit::kMaxBlockQ.

template <class E>
__global__ void __launch_bounds__(256) flex_fwd_split_combine_kernel(const FwdParams p) {
  using Elem = typename E::Storage;
  const FwdSplit& sp = p.split;
  const int t = blockIdx.x;
  const int slot0 = sp.task_slot[t];
  if (slot0 < 0) return;
  const int n = sp.item_start[t + 1] - sp.item_start[t];
  const Task task = load_task(p.view.tasks, t);
  const int qb = task.block, h = task.head, b = task.batch;
  const int bq = p.view.block_q;
  const int pack = p.pack, head0 = h * pack;
  const int q_start = __ldg(p.cu_seqlens_q + b), len_q = __ldg(p.cu_seqlens_q + b + 1) - q_start;
  const int row0 = qb * bq;
  const int rows_valid = min(bq, len_q * pack - row0);
  const int64_t q_row0 = p.varlen ? q_start : 0;
  __shared__ float s_m[FwdSplit::kMaxBlockQ], s_inv[FwdSplit::kMaxBlockQ];
  __shared__ int64_t s_off[FwdSplit::kMaxBlockQ];  // row's offset in O from (position 0, head head0)

  for (int row = threadIdx.x; row < rows_valid; row += blockDim.x) {
    // Row `row`: position pos of query head head0 + sub.
    const int pos = (row0 + row) / pack, sub = row0 + row - pos * pack;
    s_off[row] = int64_t(pos) * p.oa.row_stride + int64_t(sub) * p.oa.head_stride;
    const SplitRowStats st = merge_split_stats(sp.ml, slot0, n, bq, row, -INFINITY, 0.0f);
    s_m[row] = st.m_use;
    s_inv[row] = st.l > 0.0f ? 1.0f / st.l : 0.0f;
    if (p.lse != nullptr) {
      p.lse[int64_t(b) * p.lsea.batch_stride + int64_t(head0 + sub) * p.lsea.head_stride +
            (q_row0 + pos) * p.lsea.row_stride] = lse_from_stats(st.m, st.l);
    }
  }
  __syncthreads();  // s_m, s_inv, s_off

  Elem* o = static_cast<Elem*>(p.o) + int64_t(b) * p.oa.batch_stride + q_row0 * p.oa.row_stride +
            int64_t(head0) * p.oa.head_stride;
  const int pairs = p.head_dv / 2;
  for (int idx = threadIdx.x; idx < rows_valid * pairs; idx += blockDim.x) {
    const int row = idx / pairs, c = 2 * (idx - row * pairs);
    const float m_use = s_m[row];
    float2 acc = make_float2(0.0f, 0.0f);
    for (int i = 0; i < n; ++i) {
      const int64_t slot = slot0 + i;
      const float w = exp2f(sp.ml[slot * 2 * bq + row] - m_use);
      const float2 x = *reinterpret_cast<const float2*>(sp.o_accum + (slot * bq + row) * p.head_dv + c);
      acc.x += w * x.x;
      acc.y += w * x.y;
    }
    const float inv = s_inv[row];
    *reinterpret_cast<uint32_t*>(o + s_off[row] + c) = pack2<E>(acc.x * inv, acc.y * inv);
  }
}

}  // namespace flashspan::kern

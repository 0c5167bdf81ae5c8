// The forward epilogue role (arch-neutral, no mma): what a work item writes once its walk is
// done, from a warp's 16-row tile of output accumulators (kDv / 8 n8 blocks: the kernel's head
// dim; a call's Dv = p.head_dv <= kDv, a multiple of 8, and only its columns are written) and
// the tile's softmax statistics (softmax.cuh):
//   store_rows           an unsplit item: O normalised by the row sum (0 for a row without a
//                        visible key) in the input dtype, and LSE (lse_from_stats, -inf there);
//   store_split_partial  a piece of a split task: the unnormalised fp32 O, m (log2 units) and l
//                        of its rows into its workspace slot (FwdSplit, params.h) for the
//                        combine kernel (fwd_split.cuh);
//   max_logit            the signed max of the visible logits of the item's head (one float
//                        atomic per warp; rows past the sample never see a key, m = -inf).
// Register r of n8 block n of the lane holds row r0 + AccFragment::row(r) of the block and
// column AccFragment::col(n, r) (variant.cuh), as in the m16n8 and wgmma accumulators alike.
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/common/variant.cuh"
#include "kernels/params.h"

namespace flashspan::kern {

// Where the rows of a work item go: row r of the block is tensor row q_row0 + r (THD: global,
// BSHD: in sample `batch`) of query head `head`; rows >= rows_valid lie past the sample.
struct FwdRows {
  int batch, head;
  int64_t q_row0;
  int rows_valid;
};

template <class E, int kBlockQ, int kDv>
struct FwdEpilogue {
  static constexpr int kNO = kDv / 8;

  // The thread's rows of the 16-row tile at block row r0 of an unsplit item.
  __device__ __forceinline__ static void store_rows(const FwdParams& p, const FwdRows& rw, int r0, const AccFragment& f,
                                                    const float (&o)[kNO][4], const OnlineSoftmax& sm) {
    using Elem = typename E::Storage;
    Elem* ob = static_cast<Elem*>(p.o) + int64_t(rw.batch) * p.oa.batch_stride + rw.q_row0 * p.oa.row_stride +
               int64_t(rw.head) * p.oa.head_stride;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float lsum = sm.row_sum(hi);
      const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
      const int row = r0 + f.row_of_half(hi);
      if (row < rw.rows_valid) {
        Elem* orow = ob + int64_t(row) * p.oa.row_stride;
#pragma unroll
        for (int n = 0; n < kNO; ++n) {
          if (8 * n < p.head_dv) {
            *reinterpret_cast<uint32_t*>(orow + f.col(n, 0)) = pack2<E>(o[n][2 * hi] * inv, o[n][2 * hi + 1] * inv);
          }
        }
        if (p.lse != nullptr && f.q == 0) {
          p.lse[int64_t(rw.batch) * p.lsea.batch_stride + int64_t(rw.head) * p.lsea.head_stride +
                (rw.q_row0 + row) * p.lsea.row_stride] = lse_from_stats(sm.m[hi], lsum);
        }
      }
    }
  }

  // The thread's rows of the 16-row tile at block row r0 of a piece of a split task, into
  // workspace slot `slot` (o_accum [slots, kBlockQ, Dv], ml [slots, 2, kBlockQ]; Dv = p.head_dv,
  // as the workspace layout and the combine kernel have it).
  __device__ __forceinline__ static void store_split_partial(const FwdParams& p, int slot, int rows_valid, int r0,
                                                             const AccFragment& f, const float (&o)[kNO][4],
                                                             const OnlineSoftmax& sm) {
    const int dv = p.head_dv;
    float* oacc = p.split.o_accum + int64_t(slot) * kBlockQ * dv;
    float* ml = p.split.ml + int64_t(slot) * 2 * kBlockQ;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float lsum = sm.row_sum(hi);
      const int row = r0 + f.row_of_half(hi);
      if (row < rows_valid) {
        float* orow = oacc + int64_t(row) * dv;
#pragma unroll
        for (int n = 0; n < kNO; ++n) {
          if (8 * n < dv) *reinterpret_cast<float2*>(orow + f.col(n, 0)) = make_float2(o[n][2 * hi], o[n][2 * hi + 1]);
        }
        if (f.q == 0) {
          ml[row] = sm.m[hi];
          ml[kBlockQ + row] = lsum;
        }
      }
    }
  }

  // The warp's part of head `head`'s max_logit (every lane of the warp calls it).
  __device__ __forceinline__ static void max_logit(const FwdParams& p, int head, int lane, const OnlineSoftmax& sm) {
    float mx = fmaxf(sm.m[0], sm.m[1]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    if (lane == 0 && mx != -INFINITY) atomic_max_float(p.max_logit + head, mx * kLn2);
  }
};

}  // namespace flashspan::kern

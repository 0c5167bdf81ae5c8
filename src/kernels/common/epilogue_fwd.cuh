// The forward epilogue role (arch-neutral, no mma): what a work item writes once its walk is
// done, from a warp's 16-row tile of output accumulators (kDv / 8 n8 blocks: the kernel's head
// dim; a call's Dv = p.head_dv <= kDv, a multiple of 8, and only its columns are written) and
// the tile's softmax statistics (softmax.cuh):
//   store_rows           an unsplit item: O normalised by the row sum (0 for a row without a
//                        visible key) in the input dtype, and LSE (lse_from_stats, -inf there);
//                        with kSdpaOptions also SDPA's score_max / score_sum_exp and output gate
//                        (sdpa_score_mod.cuh sdpa_fwd_row_options, the sm80 SDPA epilogue's too);
//                        an FP8 E (the SDPA FP8 forward) with its Fp8Out: O's factors, the FP8
//                        store in o's format, the LSE (and score_max / score_sum_exp) of the
//                        shifted statistics, amax_s / amax_o gathered;
//   store_split_partial  a piece of a split task: the unnormalised fp32 O, m (log2 units) and l
//                        of its rows into its workspace slot (FwdSplit, params.h) for the
//                        combine kernel (fwd_split.cuh);
//   max_logit            the signed max of the visible logits of each of the item's heads (one
//                        float atomic per warp and head; rows past the sample never see a key,
//                        m = -inf).
// Packed GQA (FwdRows::pack_shift = log2 G > 0, the sm90 forward's packed rows, params.h
// FwdParams::pack): row r of the block is position r >> pack_shift (from the block's first) of
// query head head + (r & (G - 1)); the block starts at a multiple of G packed rows. pack_shift
// = 0 is the unpacked mapping. (The sm80 kernels keep their own epilogue loops:
// kernel_fwd_sm80.cuh says why.)
// Register r of n8 block n of the lane holds row r0 + AccFragment::row(r) of the block and
// column AccFragment::col(n, r) (variant.cuh), as in the m16n8 and wgmma accumulators alike.
#pragma once

#include <cstdint>

#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/common/sdpa_score_mod.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/common/variant.cuh"
#include "kernels/params.h"

namespace flashspan::kern {

// The FP8 output of the SDPA FP8 forward (params.h SdpaFp8Params; E::kBits == 8). The kernel's
// softmax ran with shift = log2 scale_s (OnlineSoftmax::update_row): its P V GEMM took
// fp8(exp2(logit - m + shift)) = fp8(p scale_s), the un-normalised probabilities p of the running
// max, quantized; l holds scale_s times the row sum. So O = acc descale_s descale_v scale_s / l
// (the row's 1 / sum folded in at the end: the flash form of P_q = fp8(P scale_s), whose
// rounding differs from quantizing the normalised P by the per-block factor -- within FP8's
// rounding error), stored as fp8_satfinite(O scale_o) in o's format (o_e5m2: a run-time choice, o
// may differ from q's format); LSE = (m - shift + log2 l) unit; the row's
// max |P| is 1 / sum = scale_s / l (its max element is exp(0) / sum). amax_o / amax_s: the
// thread's running maxima over every row and item it stored, reduced by flush() once per warp.
struct Fp8Out {
  float o_mul;    // descale_s descale_v scale_s
  float s_mul;    // scale_s
  float scale_o;
  float shift;    // log2 scale_s
  float amax_o, amax_s;
  bool o_e5m2;    // O stored as E5M2 (else E4M3)

  __device__ __forceinline__ static Fp8Out make(const SdpaFp8Params& f) {
    const float ss = fp8_factor(f, kFp8ScaleS);
    return Fp8Out{fp8_factor(f, kFp8DescaleS) * fp8_factor(f, kFp8DescaleV) * ss,
                  ss,
                  fp8_factor(f, kFp8ScaleO),
                  log2f(ss),
                  0.0f,
                  0.0f,
                  (f.o_format != 0 ? f.o_format : f.format) == Float8E5M2::kFp8Format};
  }
  // Two adjacent O elements (already times scale_o) at dst in o's format.
  __device__ __forceinline__ void store(uint8_t* dst, float x0, float x1) const {
    *reinterpret_cast<uint16_t*>(dst) = o_e5m2 ? cvt_fp8x2<Float8E5M2>(x0, x1) : cvt_fp8x2<Float8E4M3>(x0, x1);
  }
  // The warp's maxima into amax_o / amax_s (zeroed by the launcher; non-negative, so the integer
  // max of atomic_max_float): every lane calls it.
  __device__ __forceinline__ void flush(const SdpaFp8Params& f, int lane) const {
    float a = amax_o, b = amax_s;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
      b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, off));
    }
    if (lane == 0) {
      atomic_max_float(f.amax_o, a);
      atomic_max_float(f.amax_s, b);
    }
  }
};

// Where the rows of a work item go: row r of the block is tensor row q_row0 + (r >> pack_shift)
// (THD: global, BSHD: in sample `batch`) of query head head + (r & ((1 << pack_shift) - 1));
// rows >= rows_valid lie past the sample. Unpacked: pack_shift = 0, row r is tensor row
// q_row0 + r of query head `head`.
struct FwdRows {
  int batch, head;
  int64_t q_row0;
  int rows_valid;
  int pack_shift;
  int64_t o_start, lse_start;  // elements of O / the stats before (sample batch, head 0, row 0)
};

template <class E, int kBlockQ, int kDv>
struct FwdEpilogue {
  static constexpr int kNO = kDv / 8;

  // The thread's rows of the 16-row tile at block row r0 of an unsplit item; LSE in `unit`
  // (lse_from_stats: ln 2 natural, 1 base 2). kSdpaOptions (an SDPA kernel's p, rows of sample
  // rw.batch at sample positions): SDPA's epilogue options too, the score_max / score_sum_exp
  // outputs and the output gate (sdpa_score_mod.cuh sdpa_fwd_row_options). An FP8 E: q8 (Fp8Out)
  // gives O's factors and gathers the amaxes.
  template <bool kSdpaOptions = false>
  __device__ __forceinline__ static void store_rows(const FwdParams& p, const FwdRows& rw, int r0, const AccFragment& f,
                                                    const float (&o)[kNO][4], const OnlineSoftmax& sm,
                                                    float unit = kLn2, [[maybe_unused]] Fp8Out* q8 = nullptr) {
    constexpr bool kFp8 = E::kBits == 8;
    using Elem = typename E::Storage;
    Elem* ob = static_cast<Elem*>(p.o) + rw.o_start + rw.q_row0 * p.oa.row_stride + int64_t(rw.head) * p.oa.head_stride;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float lsum = sm.row_sum(hi);
      float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
      const int row = r0 + f.row_of_half(hi);
      if (row < rw.rows_valid) {
        if constexpr (kFp8) {
          if (lsum > 0.0f) q8->amax_s = fmaxf(q8->amax_s, q8->s_mul * inv);
          inv *= q8->o_mul;
        }
        const int pos = row >> rw.pack_shift, sub = row & ((1 << rw.pack_shift) - 1);
        Elem* orow = ob + int64_t(pos) * p.oa.row_stride + int64_t(sub) * p.oa.head_stride;
        [[maybe_unused]] const Elem* grow = nullptr;
        if constexpr (kSdpaOptions) {
          grow = sdpa_fwd_row_options<E>(p, rw.batch, rw.head + sub, int(rw.q_row0), pos, sm.m[hi], lsum, f.q == 0);
        } else if constexpr (kFp8) {
          // The FP8 forward's statistics outputs (score_max / score_sum_exp, run-time flags; no gate):
          // the row sum without the shift's scale_s.
          const SdpaEpilogueParams& ep = analytic_of(p).epi;
          if (ep.score_max != nullptr || ep.score_sum_exp != nullptr) {
            sdpa_fwd_row_options<E>(p, rw.batch, rw.head + sub, int(rw.q_row0), pos, sm.m[hi], lsum / q8->s_mul,
                                    f.q == 0);
          }
        }
#pragma unroll
        for (int n = 0; n < kNO; ++n) {
          if (8 * n < p.head_dv) {
            float x0 = o[n][2 * hi] * inv, x1 = o[n][2 * hi + 1] * inv;
            if constexpr (kSdpaOptions) {
              if (grow != nullptr) sdpa_gate_pair<E>(grow, f.col(n, 0), x0, x1);
            }
            if constexpr (kFp8) {
              q8->amax_o = fmaxf(q8->amax_o, fmaxf(fabsf(x0), fabsf(x1)));
              q8->store(orow + f.col(n, 0), x0 * q8->scale_o, x1 * q8->scale_o);
            } else {
              store_pair<E>(orow + f.col(n, 0), x0, x1);
            }
          }
        }
        if (p.lse != nullptr && f.q == 0) {
          const float m = kFp8 ? sm.m[hi] - q8->shift : sm.m[hi];
          p.lse[rw.lse_start + int64_t(rw.head + sub) * p.lsea.head_stride + (rw.q_row0 + pos) * p.lsea.row_stride] =
              lse_from_stats(m, lsum, unit);
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

  // The warp's part of the max_logit of the heads of its 16 rows at block row r0 (every lane
  // of the warp calls it). Unpacked: one head, one atomic. Packed (G = 1 << pack_shift): the
  // thread's row halves are heads head + (r0 + g) % G and head + (r0 + g + 8) % G (r0 a
  // multiple of 16); lanes whose rows share the heads are reduced by shuffles (the quad, and
  // for G <= 4 the lane bits of g above log2 G), then one atomic per head and row half with
  // g < G (G <= 8: the halves share the head). Rows past rows_valid count as -inf here.
  __device__ __forceinline__ static void max_logit(const FwdParams& p, const FwdRows& rw, int r0, const AccFragment& f,
                                                   int lane, const OnlineSoftmax& sm) {
    if (rw.pack_shift == 0) {
      float mx = fmaxf(sm.m[0], sm.m[1]);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      if (lane == 0 && mx != -INFINITY) atomic_max_float(p.max_logit + rw.head, mx * kLn2);
      return;
    }
    const int G = 1 << rw.pack_shift;
    float m0 = r0 + f.row_of_half(0) < rw.rows_valid ? sm.m[0] : -INFINITY;
    float m1 = r0 + f.row_of_half(1) < rw.rows_valid ? sm.m[1] : -INFINITY;
    if (G <= 8) m0 = m1 = fmaxf(m0, m1);
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, off));
      m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, off));
    }
    for (int off = 4 * G; off < 32; off <<= 1) {  // warp-uniform trip count (G <= 4)
      m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, off));
      m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, off));
    }
    if (f.q == 0 && f.g < G) {
      if (m0 != -INFINITY) atomic_max_float(p.max_logit + rw.head + ((r0 + f.g) & (G - 1)), m0 * kLn2);
      if (G > 8 && m1 != -INFINITY) atomic_max_float(p.max_logit + rw.head + ((r0 + f.g + 8) & (G - 1)), m1 * kLn2);
    }
  }
};

}  // namespace flashspan::kern

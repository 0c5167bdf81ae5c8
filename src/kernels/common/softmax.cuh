// The softmax role of the forward kernels of every family (arch-neutral, no mma): the online
// softmax (FlashAttention-2, Dao 2023, Alg. 1) on accumulator fragments, and the LSE a row's
// statistics finalize to.
//
// Fragments: a thread holds two rows of a warp's 16-row tile (hi = 0: row g, hi = 1: row
// g + 8, g = lane / 4) and, for each n8 block of columns, two columns: register r = 2 hi + e.
// That is the m16n8 C fragment of mma.sync and, per warp, a wgmma m64nN accumulator
// (HOPPER_BRIEF.md 1.3; variant.cuh, AccFragment). The four lanes of a quad hold one row, so a
// row reduction is the thread's own registers and two xor-shuffles.
//
// Statistics of a row: the running max m of its logits in log2 units (the logits are the
// scores times `scale` (> 0), which the update applies itself: scale * log2(e) for unscaled
// scores, Variant::logits, or 1 for scores already in log2 units; masked ones are -inf; m stays
// -inf while the row has seen no visible key) and the row sum l of exp2(scale s - m), kept
// thread-partial (quad_sum gives the row's). A row without any visible key uses 0 instead of m
// in the exponents, so nothing becomes NaN.
#pragma once

#include <cmath>

#include "kernels/common/ptx.cuh"

namespace flashspan::kern {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// The max of row hi of one key block's scores s (kN n8 blocks): the thread's columns, then the
// quad's (quad-uniform).
// kChains partial maxima (n8 blocks n % kChains, 1 or 4) combined at the end: dependency chains of
// kN / kChains FMNMX. 4 for the FP8 forward, whose softmax is its critical path (ncu: tensor pipe 40 %
// busy, top stall "Wait" -- fixed-latency dependencies; +4-8 % with the rescale skip, PERF_LOG v2.20);
// the 16-bit forwards measured 1-5 % slower with 4 (S=8192) and keep 1. The max is the same in any order.
template <int kChains = 1, int kN>
__device__ __forceinline__ float row_max(const float (&s)[kN][4], int hi) {
  static_assert(kChains == 1 || kChains == 4, "row_max: 1 or 4 chains");
  float mx[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) mx[c] = -INFINITY;
#pragma unroll
  for (int n = 0; n < kN; ++n) mx[n % kChains] = fmaxf(mx[n % kChains], fmaxf(s[n][2 * hi], s[n][2 * hi + 1]));
  if constexpr (kChains == 4) return quad_max(fmaxf(fmaxf(mx[0], mx[1]), fmaxf(mx[2], mx[3])));
  return quad_max(mx[0]);
}

// Row hi of s in place: p = exp2(scale s - m_exp) (m_exp finite: the row's exponent base, 0 for a
// row without a visible key, so that masked scores give 0, never NaN). Returns the thread's sum
// of its p (thread-partial, as OnlineSoftmax::l).
// The sum in kChains partial sums (n8 blocks n % kChains), added pairwise at the end: FADD chains of
// 2 kN / kChains (as row_max's chains).
template <int kChains = 1, int kN>
__device__ __forceinline__ float exp2_row(float (&s)[kN][4], int hi, float scale, float m_exp) {
  static_assert(kChains == 1 || kChains == 4, "exp2_row: 1 or 4 chains");
  float sum[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) sum[c] = 0.0f;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p = exp2_approx(fmaf(s[n][2 * hi + e], scale, -m_exp));
      s[n][2 * hi + e] = p;
      sum[n % kChains] += p;
    }
  }
  if constexpr (kChains == 4) return (sum[0] + sum[1]) + (sum[2] + sum[3]);
  return sum[0];
}

// LSE of a row from its statistics, as every forward epilogue and split combine writes it:
// (m + log2 l) * unit (ln 2: natural log; 1: base 2, SDPA's stats_use_log2), -inf for a row
// without a visible key (l = 0), NaN for a row whose logits hold a NaN (l NaN: the row max drops a
// NaN, its exponential does not), as the CPU references. __log2f (MUFU.LG2) is exact enough here: a
// positive l is >= 1 (the row's max contributes 2^0).
__device__ __forceinline__ float lse_from_stats(float m, float l, float unit) {
  return l != 0.0f ? (m + __log2f(l)) * unit : -INFINITY;
}
__device__ __forceinline__ float lse_from_stats(float m, float l) { return lse_from_stats(m, l, kLn2); }

// The row statistics of a split walk's pieces merged (the flex split schedule's combine, fwd_split.cuh;
// merge_scales below is its pairwise form, the SDPA decode combine's): row `row` of the n slots from slot0 (ml: [slots, 2, bq], m_i in log2 units then l_i) merged,
// with one more term (m_seed, l_seed): a sink's logit (log2 units) and 1, or none (-inf, 0).
//   m = max(m_i, m_seed)  (-inf when every one is),  m_use = m, or 0 when m = -inf,
//   l = sum l_i 2^(m_i - m_use) + l_seed 2^(m_seed - m_use);
// m_i = -inf (an item that saw no key of the row, l_i = 0) contributes 0, never NaN.
struct SplitRowStats {
  float m, m_use, l;
};
__device__ __forceinline__ SplitRowStats merge_split_stats(const float* ml, int64_t slot0, int n, int bq, int row,
                                                           float m_seed, float l_seed) {
  float m = m_seed;
  for (int i = 0; i < n; ++i) m = fmaxf(m, ml[(slot0 + i) * 2 * bq + row]);
  const float m_use = m == -INFINITY ? 0.0f : m;
  float l = l_seed != 0.0f ? l_seed * exp2f(m_seed - m_use) : 0.0f;
  for (int i = 0; i < n; ++i) {
    const float* mli = ml + (slot0 + i) * 2 * bq;
    l += mli[bq + row] * exp2f(mli[row] - m_use);
  }
  return SplitRowStats{m, m_use, l};
}

// Two partial results of one row, (m_a, l_a, acc_a) and (m_b, l_b, acc_b) (m in log2 units, l and
// acc unnormalised), merged: m = max(m_a, m_b), l = a l_a + b l_b, acc = a acc_a + b acc_b with
// the factors below, a = 2^(m_a - m_use), b = 2^(m_b - m_use) (m_use as in merge_split_stats: 0
// when both are -inf, so an empty side scales to 0, never NaN). The pairwise form of the merge
// above, for a combine that folds slots in as they arrive (the SDPA decode combine).
struct MergeScales {
  float m, a, b;
};
__device__ __forceinline__ MergeScales merge_scales(float m_a, float m_b) {
  const float m = fmaxf(m_a, m_b);
  const float m_use = m == -INFINITY ? 0.0f : m;
  return MergeScales{m, exp2f(m_a - m_use), exp2f(m_b - m_use)};
}

// The statistics of a thread's two rows and their online update, one key block at a time.
struct OnlineSoftmax {
  float m[2];  // running max (log2 units), quad-uniform
  float l[2];  // thread-partial running sum

  __device__ __forceinline__ void init() {
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
  }

  // Seeds one row's statistics with a sink, a logit s2 (log2 units) the row sees besides its keys
  // (SDPA's attention sinks: sink_token): m = s2 and l = 1 on the quad's first lane (l is
  // thread-partial, row_sum adds the quad), so that 2^(s2 - m) joins the row's sum and every later
  // update rescales it with the keys' terms; O gets nothing from it. Rows that must see nothing
  // (past the sample) are left unseeded (m = -inf, l = 0: O = 0, LSE = -inf). A sink s2 = -inf seeds
  // nothing either (l = 0): a row without keys then keeps the sum 0 (score_sum_exp), as the CPU
  // reference's sum of exp(-inf) = 0 and the fold's (fold_sink_row); rows with keys get the same sums.
  __device__ __forceinline__ static void seed_row(float& m, float& l, float s2, int lane) {
    m = s2;
    l = (lane & 3) == 0 && s2 != -INFINITY ? 1.0f : 0.0f;
  }

  // The sink s2 (log2 units) folded into row hi's statistics after the walk instead of seeded before
  // it (the same sums: m' = max(m, s2), l' = l 2^(m - m') + 2^(s2 - m') on the quad's first lane, the
  // row's output accumulator o (kNO n8 blocks) times 2^(m - m')), so that m keeps the scores' own
  // maximum until then (SDPA's max_logit, which leaves the sink out). A row that saw no key (m = -inf)
  // gets the seeded row's m = s2, l = 1, O = 0; s2 = -inf adds nothing (the row's sum without the term
  // exp(-inf) = 0, as the CPU reference's).
  template <int kNO>
  __device__ __forceinline__ static void fold_sink_row(float (&o)[kNO][4], int hi, float& m, float& l, float s2,
                                                       int lane) {
    if (s2 == -INFINITY) return;
    const float m_new = fmaxf(m, s2);               // finite
    const float corr = exp2_approx(m - m_new);       // m = -inf -> 0
    l = l * corr + ((lane & 3) == 0 ? exp2_approx(s2 - m_new) : 0.0f);
    m = m_new;
    rescale_row(o, hi, corr);
  }

  // Row hi of one key block: its scores in s (kN n8 blocks, logits = scale s) become
  // p = exp2(scale s - m_new); m, l (that row's statistics) updated. Returns the factor the row's
  // output accumulator must be rescaled by (0 while m was -inf). scale > 0 (the max of the
  // scores times scale is then the max of the logits, rounding being monotone); with scale = 1
  // the results are those of scores already in log2 units, bit for bit.
  // shift (the FP8 forward: log2 scale_s) scales the probabilities by 2^shift inside the
  // exponent, p = exp2(scale s - m_new + shift), so that they come out ready for the FP8
  // quantization of P (times scale_s) at no extra instruction; l then holds 2^shift times the
  // row sum (FwdEpilogue's FP8 output divides it out). m is not shifted. shift = 0: the
  // exponent is the unshifted one (x - 0 = x: the same code).
  // kChains: the dependency chains of the row max and sum (row_max, exp2_row).
  template <int kChains = 1, int kN>
  __device__ __forceinline__ static float update_row(float (&s)[kN][4], int hi, float& m, float& l,
                                                     float scale = 1.0f, float shift = 0.0f) {
    const float mx = fmaxf(m, row_max<kChains>(s, hi) * scale);
    const float m_use = mx == -INFINITY ? 0.0f : mx;
    const float corr = exp2_approx(m - m_use);  // m = -inf -> 0
    m = mx;
    l = l * corr + exp2_row<kChains>(s, hi, scale, m_use - shift);
    return corr;
  }

  // Both rows of one key block (scale, shift, kChains: as update_row); corr[hi] for rescale().
  template <int kChains = 1, int kN>
  __device__ __forceinline__ void update(float (&s)[kN][4], float (&corr)[2], float scale = 1.0f,
                                         float shift = 0.0f) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) corr[hi] = update_row<kChains>(s, hi, m[hi], l[hi], scale, shift);
  }

  // The output accumulator (kNO n8 blocks) of row hi, or of both rows, times the factors.
  template <int kNO>
  __device__ __forceinline__ static void rescale_row(float (&o)[kNO][4], int hi, float corr) {
#pragma unroll
    for (int n = 0; n < kNO; ++n) {
      o[n][2 * hi] *= corr;
      o[n][2 * hi + 1] *= corr;
    }
  }
  template <int kNO>
  __device__ __forceinline__ static void rescale(float (&o)[kNO][4], const float (&corr)[2]) {
#pragma unroll
    for (int n = 0; n < kNO; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
  }

  // The full sum of row hi (over the quad).
  __device__ __forceinline__ float row_sum(int hi) const { return quad_sum(l[hi]); }

  // Whether any row of the warp got a factor other than 1 from update (warp-uniform): when none did
  // (no row's max moved), rescale() would multiply by 1 and can be skipped as a whole -- exact, unlike
  // LazyOnlineSoftmax's threshold (the FP8 forward, whose P must stay <= scale_s).
  __device__ __forceinline__ static bool any_moved(const float (&corr)[2]) {
    return __any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f);
  }
};

// The online softmax with lazy rescaling (FlashAttention-4, Zadouri et al. 2025, "conditional
// softmax rescaling"): a row's exponent base m moves only when the block's max logit exceeds it by
// more than kThreshold (log2 units), so after a row's first blocks most updates leave m -- and the
// output accumulator -- as they are; the probabilities of such a block are at most 2^kThreshold
// (256: fp32 sums and 16-bit P have room). m_true tracks the true running max; settle() moves m to
// it at the end of the walk (l and O times 2^(m - m_true)), so the epilogue, the split partials,
// max_logit and SDPA's score_max / score_sum_exp see the statistics of the eager update.
struct LazyOnlineSoftmax : OnlineSoftmax {
  static constexpr float kThreshold = 8.0f;
  float m_true[2];

  __device__ __forceinline__ void init() {
    OnlineSoftmax::init();
    m_true[0] = m_true[1] = -INFINITY;
  }

  // Both rows of one key block (scale: as OnlineSoftmax::update_row). corr[hi] is 1 for a row whose
  // base stayed; returns whether any row of the warp moved its base (warp-uniform: the caller's
  // rescale of O can be skipped as a whole).
  template <int kN>
  __device__ __forceinline__ bool update(float (&s)[kN][4], float (&corr)[2], float scale = 1.0f) {
    bool moved = false;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float mt = fmaxf(fmaxf(m_true[hi], m[hi]), row_max(s, hi) * scale);
      m_true[hi] = mt;
      const bool move = mt > m[hi] + kThreshold;  // m = -inf: any visible key moves it
      const float m_new = move ? mt : m[hi];
      const float m_use = m_new == -INFINITY ? 0.0f : m_new;
      corr[hi] = move ? exp2_approx(m[hi] - m_use) : 1.0f;  // m = -inf -> 0
      moved |= move;
      m[hi] = m_new;
      l[hi] = l[hi] * corr[hi] + exp2_row(s, hi, scale, m_use);
    }
    return __any_sync(0xffffffffu, moved);
  }

  // The end of a walk: m to the true max, l and the output accumulator o (kNO n8 blocks) with it.
  template <int kNO>
  __device__ __forceinline__ void settle(float (&o)[kNO][4]) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const float mt = fmaxf(m_true[hi], m[hi]);
      const float f = mt == m[hi] ? 1.0f : exp2_approx(m[hi] - mt);  // m finite here
      l[hi] *= f;
      rescale_row(o, hi, f);
      m[hi] = mt;
    }
  }
};

// One key block of both rows with the output rescale of each row right after its update (the
// one-pass form of the serial schedules: m, l, acc_o of the thread's two rows).
template <int kN, int kNo>
__device__ __forceinline__ void online_softmax_step(float (&s)[kN][4], float (&m)[2], float (&l)[2],
                                                    float (&acc_o)[kNo][4], float scale = 1.0f) {
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const float corr = OnlineSoftmax::update_row(s, hi, m[hi], l[hi], scale);
    OnlineSoftmax::rescale_row(acc_o, hi, corr);
  }
}

// P (the probabilities of one key block, kN n8 blocks) as the A fragments of the P V GEMM.
// 16-bit E: k-step kk (keys 16 kk .. 16 kk + 15) = n8 blocks 2 kk, 2 kk + 1. The A fragment of
// mma.sync m16n8k16 and of wgmma's register-A form (k16) hold the same elements as the two
// accumulator blocks (HOPPER_BRIEF.md 1.3), so this is a repack, no data movement.
// FP8 E (the sm90 FP8 forward, k32 steps): the 8-bit A fragment does not match the accumulator:
// register a0 holds row g, k = 4q .. 4q + 3 (byte i = k 4q + i), a1 row g + 8, a2 / a3 the same
// rows at k = 16 + 4q + i, while the thread holds columns 8j + 2q, 8j + 2q + 1 of n8 blocks j.
// Instead of moving bytes between lanes, each thread packs its own values in register order:
// k-step kk (n8 blocks 4 kk .. 4 kk + 3) gets a0 = row g of blocks 4 kk, 4 kk + 1 (columns 2q,
// 2q + 1, 8 + 2q, 9 + 2q of the 32), a2 = row g of blocks 4 kk + 2, 4 kk + 3, a1 / a3 the same
// for row g + 8. So A's column k = 16h + 4q + i (h = k / 16, q = k % 16 / 4, i = k % 4) holds
// P's column perm(k) = 16h + 8 (i / 2) + 2q + i % 2 of the 32: in bits, k = [h q1 q0 a b]
// -> perm(k) = [h a q1 q0 b] (i = 2a + b), a bijection of 0..31. The B operand (V^T) must hold
// V's key perm(k) at its column k of every 32-key group: the FP8 forward's V^T pre-pass
// (kernels/sm90/fp8_vt_sm90.cuh, fp8_vt_key) writes it so.
template <class E, int kN>
__device__ __forceinline__ void pack_p(const float (&s)[kN][4], uint32_t (&pa)[kN * E::kBits / 32][4]) {
  if constexpr (E::kBits == 8) {
#pragma unroll
    for (int kk = 0; kk < kN / 4; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float(&x)[4] = s[4 * kk + 2 * h];
        const float(&y)[4] = s[4 * kk + 2 * h + 1];
        pa[kk][2 * h] = pack_fp8x4<E>(x[0], x[1], y[0], y[1]);
        pa[kk][2 * h + 1] = pack_fp8x4<E>(x[2], x[3], y[2], y[3]);
      }
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < kN / 2; ++kk) {
      pa[kk][0] = pack2<E>(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = pack2<E>(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = pack2<E>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = pack2<E>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  }
}

}  // namespace flashspan::kern

// The variant role of the forward kernels of every family (arch-neutral, no mma): the scores ->
// logits step between the Q K^T GEMM and the softmax (FlashInfer's attention variants put the
// score modifier and the mask behind one such step):
//   logits = mask(mod(scale * log2(e) * s))   (log2 units, masked = -inf)
// Variant<Mask, ScoreMod> composes it from two policies:
//   Mask      which scores of a key block are visible: the plan's payload (PlanPayloadMask),
//             or the analytic mask of SDPA (causal, bands, padding: AnalyticTileMask, the
//             same answer from positions, with AccFragment's (row, col) of each register).
//             load() runs before the block's scores exist (its reads overlap the GEMM),
//             apply() on them; a full block (partial = false) is never masked.
//   ScoreMod  a modifier of the scaled scores: apply() before the mask (SDPA's softcap and
//             ALiBi), apply_visible(s, partial) after it on the elements it left visible (SDPA's additive
//             bias), identity() when it changes nothing on this call. NoScoreMod (the plan
//             kernels and the pure-mask SDPA kernels), or SDPA's SdpaTileScoreMod
//             (sdpa_score_mod.cuh), whose terms depend on the key block: logits() takes it per
//             block.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/common/analytic_mask.h"
#include "kernels/common/payload_layout.h"
#include "kernels/common/ptx.cuh"

namespace flashspan::kern {

// Where a lane's accumulator registers sit in a warp's 16-row tile: register r (0..3) of n8
// block j holds row g + 8 (r / 2) and column 8 j + 2 q + r % 2 (g = lane / 4, q = lane % 4):
// the m16n8 C fragment of mma.sync and, per warp, the wgmma m64nN accumulator
// (HOPPER_BRIEF.md 1.3).
struct AccFragment {
  int g, q;

  __device__ __forceinline__ explicit AccFragment(int lane) : g(lane >> 2), q(lane & 3) {}
  // Row of register r (or of row half hi = r / 2) inside the warp's 16 rows.
  __device__ __forceinline__ int row(int r) const { return g + 8 * (r >> 1); }
  __device__ __forceinline__ int row_of_half(int hi) const { return g + 8 * hi; }
  // Column of register r of n8 block j inside the tile's columns.
  __device__ __forceinline__ int col(int j, int r) const { return 8 * j + 2 * q + (r & 1); }
};

// The plan's payload (payload_layout.h, kM16N64Frag) as the mask of a warp's 16-row tile of a
// key block of kN n8 blocks (kN % 8 == 0): one 32-bit word per 64 columns, in the lane's own
// register order, so apply() tests compile-time bit indices.
template <int kN>
struct PlanPayloadMask {
  static_assert(kN % 8 == 0, "PlanPayloadMask: whole 64-column chunks");
  static constexpr int kWords = kN / 8;
  uint32_t w[kWords];

  // The lane's words of sub-tile row mt of payload `entry` (a block_q x 64 kWords tile of the
  // view's q2k_partial_bits, passed by value like load_task's tasks) when the block is
  // partial; all-ones (never tested) otherwise.
  __device__ __forceinline__ void load(const uint32_t* q2k_partial_bits, bool partial, int entry, int block_q, int mt,
                                       int lane) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0xffffffffu;
    if (partial) {
      const uint32_t* bits = q2k_partial_bits + size_t(entry) * (block_q * 64 * kWords / 32);
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = __ldg(bits + (mt * kWords + i) * 32 + lane);
    }
  }
  // Logits of invisible pairs to -inf.
  __device__ __forceinline__ void apply(float (&s)[kN][4]) const {
#pragma unroll
    for (int j = 0; j < kN; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (!((w[j / 8] >> payload_bit_of_register(j % 8, r >> 1, r & 1)) & 1u)) s[j][r] = -INFINITY;
      }
    }
  }
};

// The analytic mask (analytic_mask.h) on the same fragment: accumulator register r of n8
// block n of m16 tile mt holds tile element (row 16 mt + g + 8 (r / 2), column c0 + 8 n +
// 2 t + r % 2), lane = 4 g + t; elements the tile mask hides become -inf.
template <int kN>
__device__ __forceinline__ void apply_tile_mask(float (&s)[kN][4], const TileMask& tm, int mt, int c0, int lane) {
  const int row = 16 * mt + (lane >> 2), col = c0 + 2 * (lane & 3);
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (!tm.visible(row + 8 * (r >> 1), col + 8 * n + (r & 1))) s[n][r] = -INFINITY;
    }
  }
}

// The analytic mask as the Mask policy of a warp's 16-row tile (m16 tile mt of the block) of a
// key block of kN n8 blocks: the block's TileMask (QueryBlockMask::tile of the key block's first
// column), applied by apply_tile_mask.
template <int kN>
struct AnalyticTileMask {
  TileMask tm;
  int mt, lane;

  __device__ __forceinline__ void apply(float (&s)[kN][4]) const { apply_tile_mask<kN>(s, tm, mt, 0, lane); }
};

// No score modifier: the scaled scores are the logits.
struct NoScoreMod {
  template <int kN>
  __device__ __forceinline__ void apply(float (&)[kN][4]) const {}
  template <int kN>
  __device__ __forceinline__ void apply_visible(float (&)[kN][4], bool) const {}
};

template <class Mask, class ScoreMod = NoScoreMod>
struct Variant {
  float scale_log2;  // softmax scale * log2(e)
  ScoreMod mod;

  // One key block's raw scores q.k (a warp's 16-row tile) to logits; `mask` was loaded for this
  // block, and masks only when the block is partial. Returns the factor the softmax multiplies
  // the logits by inside its exponent (OnlineSoftmax::update): with no score modifier and a
  // positive scale, the scale itself, and s is left unscaled (masked: -inf), so that the
  // softmax computes exp2(s * scale_log2 - m) in one FFMA (FlashAttention-2's form: the max of
  // the raw scores times a positive scale is the max of the scaled ones; saves one FMUL a score,
  // 64 a thread and key block of the sm90 forward); otherwise 1, s holding the logits.
  // A score modifier whose identity() holds on the call takes the same folded form; one with linear()
  // (ALiBi, bias) keeps s raw and returns the scale too, one with softcapped() turns s into softcap's
  // tanh and returns c2 (the logits are then the returned factor times s, as in the folded form).
  template <int kN>
  __device__ __forceinline__ float logits(float (&s)[kN][4], const Mask& mask, bool partial) const {
    return logits(s, mask, partial, mod);
  }
  // The same with the key block's own score modifier `m` (SdpaTileScoreMod: ALiBi's diagonal
  // offset and the bias's addresses are the block's).
  template <int kN>
  __device__ __forceinline__ float logits(float (&s)[kN][4], const Mask& mask, bool partial,
                                          const ScoreMod& m) const {
    if constexpr (std::is_same_v<ScoreMod, NoScoreMod>) {
      if (scale_log2 > 0.0f) {
        if (partial) mask.apply(s);
        return scale_log2;
      }
    } else {
      if (scale_log2 > 0.0f && m.identity()) {
        if (partial) mask.apply(s);
        return scale_log2;
      }
      if constexpr (requires { m.linear(); }) {
        // Terms added to the scaled scores (SDPA's ALiBi, bias), with or without softcap before them: the
        // same folded form. Without softcap the scores stay raw, the terms added in raw-score units
        // (logit2 = scale_log2 (s + term2 / scale_log2)); with softcap (SdpaTileScoreMod::softcapped) the
        // logits are c2 (t + term2 / c2), so s becomes t = tanh(scale s / c2) and the softmax's exponent
        // takes c2. Masked elements stay -inf.
        if (scale_log2 > 0.0f && (m.linear() || m.softcapped())) {
          const bool capped = m.softcapped();
          if (capped) m.mod.softcap_t(s, scale_log2);
          if (partial) mask.apply(s);
          m.template apply_raw<kN>(s, partial, capped ? m.mod.inv_c2 : rcp_approx(scale_log2));
          return capped ? m.mod.c2 : scale_log2;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) s[j][r] *= scale_log2;
    }
    m.apply(s);
    if (partial) mask.apply(s);
    m.apply_visible(s, partial);
    return 1.0f;
  }
};

}  // namespace flashspan::kern

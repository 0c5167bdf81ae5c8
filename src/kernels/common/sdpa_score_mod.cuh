// The score modifiers of SDPA (softcap, ALiBi, the additive bias) and its sinks, as the analytic-mask kernels of
// every family apply them: the ScoreMod part of the scores -> logits step (variant.cuh), run
// between the scaling and the mask, on a warp's accumulator fragments (AccFragment layout).
// Run-time flags (SdpaScoreParams, params.h) inside the one analytic instantiation of each
// kernel (the sm90 forward: its instantiation with modifiers, sdpa_fwd_kernel_sm90 with
// AnalyticModSourceSm90): the plan
// (flex) kernels never see them. Also SDPA's forward epilogue options of a row
// (sdpa_fwd_row_options, sdpa_gate_pair), which both families' epilogues share.
//
// In log2 units (the kernels' scores are scale * log2(e) * q.k): with c2 = softcap * log2(e)
// and a2 = slope_h * log2(e),
//   logit2 = c2 tanh(x2 / c2) + a2 (j - i - shift)
// which is log2(e) times the CPU reference's softcap * tanh(x / softcap) + slope (j - i - shift)
// (docs/SDPA.md). Its derivative with respect to x2 is 1 - t^2, t = tanh(x2 / c2) =
// (logit2 - a2 (j - i - shift)) / c2 (the backward recovers t from the logit it recomputes).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/philox.h"
#include "kernels/common/analytic_mask.h"
#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/common/ptx.cuh"
#include "kernels/params.h"

namespace flashspan::kern {

// The output gate's sigmoid (SdpaEpilogueParams::gate; the CPU reference's 1 / (1 + e^-x)), with
// an approximate division (x < -87: the denominator overflows to inf and the result is 0, as it
// should): the IEEE division's slow path, unrolled over every element of the forward epilogue,
// doubled the forward kernels' code.
__device__ __forceinline__ float sigmoid_fast(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }

// ALiBi slope of query head h for n = the largest power of two <= H_q (sdpa::alibi_slope).
__device__ __forceinline__ float alibi_slope_dev(int h, int n) {
  const float e = h < n ? -8.0f * float(h + 1) / float(n) : -4.0f * float(2 * (h - n) + 1) / float(n);
  return exp2f(e);
}

// SDPA's additive bias (SdpaBiasParams) on a warp's 16-row fragment: element (row g + 8 (r / 2),
// column 8 n + 2 q + r % 2) of the fragment (g = lane / 4, q = lane % 4; AccFragment) is bias element
// (b, h, i0 + row, j0 + column). Loads go through the read-only path one element at a time (any
// strides, broadcast dimensions at stride 0), only where the fragment's logit is not -inf: masked
// elements, padding rows and keys outside the sample (the kernels' masks set -inf there) are never
// read. null `p`: no bias.
struct SdpaBiasFrag {
  const char* p;   // byte address of the thread's element (row g, column 2 q), or null
  int64_t rs, cs;  // row / column strides in bytes (0: broadcast)
  int32_t dtype;   // SdpaBiasDType

  // Byte address of bias element (b, h, 0, 0), or null without a bias.
  __device__ __forceinline__ static const char* head_base(const SdpaBiasParams& bp, int b, int h) {
    if (bp.bias == nullptr) return nullptr;
    const int64_t es = bp.dtype == kSdpaBiasF32 ? 4 : 2;
    return static_cast<const char*>(bp.bias) + (int64_t(b) * bp.batch_stride + int64_t(h) * bp.head_stride) * es;
  }
  // The fragment whose element (0, 0) is bias element (b, h, i0, j0); base = head_base(bp, b, h).
  __device__ __forceinline__ static SdpaBiasFrag at(const SdpaBiasParams& bp, const char* base, int64_t i0, int64_t j0,
                                                    int lane) {
    SdpaBiasFrag f{nullptr, 0, 0, bp.dtype};
    if (base == nullptr) return f;
    const int64_t es = bp.dtype == kSdpaBiasF32 ? 4 : 2;
    f.rs = bp.row_stride * es;
    f.cs = bp.col_stride * es;
    f.p = base + (i0 + (lane >> 2)) * f.rs + (j0 + 2 * (lane & 3)) * f.cs;
    return f;
  }
  __device__ __forceinline__ static SdpaBiasFrag make(const SdpaBiasParams& bp, int b, int h, int64_t i0, int64_t j0,
                                                      int lane) {
    return at(bp, head_base(bp, b, h), i0, j0, lane);
  }
  // The fragment of the transposed scores whose element (0, 0) is bias element (b, h, i0, j0): rows
  // = keys j, columns = queries i (the sm90 backward's S^T, kernel_bwd_mods_sm90.cuh), so its rows
  // step along the bias's columns and its columns along the bias's rows; at2 / add as above.
  __device__ __forceinline__ static SdpaBiasFrag at_transposed(const SdpaBiasParams& bp, const char* base, int64_t i0,
                                                               int64_t j0, int lane) {
    SdpaBiasFrag f{nullptr, 0, 0, bp.dtype};
    if (base == nullptr) return f;
    const int64_t es = bp.dtype == kSdpaBiasF32 ? 4 : 2;
    f.rs = bp.col_stride * es;
    f.cs = bp.row_stride * es;
    f.p = base + (j0 + (lane >> 2)) * f.rs + (i0 + 2 * (lane & 3)) * f.cs;
    return f;
  }
  // Bias of fragment element (n, r) in log2 units.
  __device__ __forceinline__ float at2(int n, int r) const {
    const char* e = p + int64_t(8 * (r >> 1)) * rs + int64_t(8 * n + (r & 1)) * cs;
    float x;
    if (dtype == kSdpaBiasF32) {
      x = __ldg(reinterpret_cast<const float*>(e));
    } else {
      const unsigned short u = __ldg(reinterpret_cast<const unsigned short*>(e));
      x = dtype == kSdpaBiasBF16 ? __uint_as_float(uint32_t(u) << 16) : __half2float(__ushort_as_half(u));
    }
    return x * kLog2e;
  }
  // s += bias (log2 units) where s > -inf (masked elements stay -inf and are not read). The dtype
  // branch outside the loop and the loads of kChunk n8 blocks issued before their uses: element by
  // element (a branch on -inf, one on the dtype, the load, its use) the 64 loads of a thread's
  // (128-key) block ran one after the other (PERF_LOG v2.24: the bias forward a sixth of ALiBi's).
  // (Pairs of columns as one load: the bias 1.2x faster again, the other modifiers' calls 2-6 %
  // slower on the kernels they share with it, PERF_LOG v2.24: not taken.)
  // k: the factor of the bias in s's units (log2 units: log2(e); raw scores, as the sm90 forward's
  // folded bias-only logits take it: 1 / scale, Variant::logits).
  template <int kN>
  __device__ __forceinline__ void add(float (&s)[kN][4], float k = kLog2e) const {
    if (p == nullptr) return;
    if (dtype == kSdpaBiasF32) {
      add_as<kN>(s, [](const char* e) { return __ldg(reinterpret_cast<const float*>(e)); }, k);
    } else if (dtype == kSdpaBiasBF16) {
      add_as<kN>(s, [](const char* e) {
        return __uint_as_float(uint32_t(__ldg(reinterpret_cast<const unsigned short*>(e))) << 16);
      }, k);
    } else {
      add_as<kN>(s, [](const char* e) { return __half2float(__ldg(reinterpret_cast<const __half*>(e))); }, k);
    }
  }

  // Staged by TMA (SdpaBiasParams::chunks: a 16-bit bias; the sm90 forward, kernel_fwd_sm90.cuh): the
  // producer copies key block kb's bias tile -- the block's 128 query rows, or row 0 alone when the bias
  // is broadcast over rows (rs = 0), x the block's keys -- as boxes of 64 keys (128 bytes a row,
  // 128B-swizzled: 16-byte chunk c of tile row r at 128 r + 16 (c ^ r % 8) of its box), box b at
  // b kTmaBox (kTmaBoxBcast for the one-row boxes, so that each box starts on a 1024-byte swizzle
  // period), and the consumers read it back with ldmatrix: a thread's pairs (row g + 8 hi, columns
  // 2 q ..) of n8 block n are row g of 8 x 8 matrix (n, hi), so matrices (2 k, 0), (2 k, 1), (2 k + 1,
  // 0), (2 k + 1, 1) are one ldmatrix.x4 (lanes 8 m .. 8 m + 7 address matrix m's rows; the eight
  // rows' chunks differ in r % 8: no bank conflict), kN / 2 a block where the cp.async stage took a
  // copy (8 LDGSTS a lane, their addresses and predicates), a wait and 32 LDS a thread (PERF_LOG
  // v2.31, v2.33). Out-of-tensor rows and keys are zero-filled by the TMA unit; elements of rows or
  // keys outside the sample but inside the tensor are read and never reach an output (masked keys
  // are -inf and not added in a partial block; rows past the sample are not stored).
  // rows: the tile's row 16 mt (the warp's first row), or the tile itself when rs = 0.
  static constexpr uint32_t kTmaBox = 128u * 128u;  // a box of 128 rows x 64 keys (16-bit)
  static constexpr uint32_t kTmaBoxBcast = 1024u;   // a one-row box's slot
  template <int kN>
  __device__ __forceinline__ void add_tma(float (&s)[kN][4], uint32_t rows, int lane, bool partial,
                                          float k = kLog2e) const {
    const bool bc = rs == 0;
    if (dtype == kSdpaBiasBF16) {
      partial ? add_tma_as<kN, true, true>(s, rows, lane, bc, k) : add_tma_as<kN, false, true>(s, rows, lane, bc, k);
    } else {
      partial ? add_tma_as<kN, true, false>(s, rows, lane, bc, k) : add_tma_as<kN, false, false>(s, rows, lane, bc, k);
    }
  }
  template <int kN, bool kPartial, bool kBf>
  __device__ __forceinline__ static void add_tma_as(float (&s)[kN][4], uint32_t rows, int lane, bool bc, float k) {
    static_assert(kN % 2 == 0, "bias (TMA stage): pairs of n8 blocks");
    const int m = lane >> 3, r8 = lane & 7;
    // Matrix m of ldmatrix k: n8 block 2 k + m / 2 (chunk 2 (k % 4) + m / 2 of box k / 4), rows 8 (m % 2)
    // .. of the warp's 16, row r8 at tile row 16 mt + 8 (m % 2) + r8, whose swizzle key is r8.
    const uint32_t a = rows + (bc ? 0u : uint32_t(8 * (m & 1) + r8) * 128u);
    const uint32_t y = uint32_t(m >> 1) ^ (bc ? 0u : uint32_t(r8));  // (2 (k % 4) + m / 2) ^ r8 = 2 (k % 4) ^ y
    const uint32_t box = bc ? kTmaBoxBcast : kTmaBox;
#pragma unroll
    for (int kk = 0; kk < kN / 2; ++kk) {
      uint32_t u[4];
      ldmatrix_x4(u, a + uint32_t(kk >> 2) * box + ((uint32_t(2 * (kk & 3)) ^ y) << 4));
#pragma unroll
      for (int mm = 0; mm < 4; ++mm) {
        const int n = 2 * kk + (mm >> 1), h2 = 2 * (mm & 1);
        add_pair<kPartial>(u[mm], kBf, s[n][h2], s[n][h2 + 1], k);
      }
    }
  }
  // x0 += the pair's first element, x1 += its second (a 16-bit pair u, bf16 or fp16), times k (log2
  // units: log2(e)); kPartial: where x is not -inf (-inf stays -inf).
  template <bool kPartial>
  __device__ __forceinline__ static void add_pair(uint32_t u, bool bf, float& x0, float& x1, float k = kLog2e) {
    float v0, v1;
    if (bf) {
      v0 = __uint_as_float(u << 16);
      v1 = __uint_as_float(u & 0xffff0000u);
    } else {
      const __half2 h = *reinterpret_cast<const __half2*>(&u);
      v0 = __low2float(h);
      v1 = __high2float(h);
    }
    if constexpr (kPartial) {
      v0 = x0 != -INFINITY ? v0 : 0.0f;
      v1 = x1 != -INFINITY ? v1 : 0.0f;
    }
    x0 = fmaf(v0, k, x0);
    x1 = fmaf(v1, k, x1);
  }

  // Staged for the transposed fragment (rows = keys, columns = queries: the sm90 backward's S^T,
  // kernel_bwd_mods_sm90.cuh), a warp's kQ x 16 tile of the bias -- kQ queries from bias element
  // (i0, j0) = `p` (at(.., lane 0)), 16 keys -- copied by the warp with 16-byte cp.async and read
  // back transposed with ldmatrix.trans. Region layout: chunk (row i, keys 8 hi ..) at 16 (hi kQ + i),
  // so the 8 rows of an 8 x 8 matrix are 128 consecutive bytes (no bank conflict). Matrix (n, hi) --
  // rows 8 n .., chunk column hi -- transposed gives the thread the pair (key g + 8 hi; queries
  // 8 n + 2 q, + 1), i.e. elements (n, 2 hi), (n, 2 hi + 1) of S^T. Lane l copies chunk column l % 2 of
  // rows l / 2 + 16 m (both 16-byte halves of a row's 32-byte sector in neighbouring lanes), through
  // L2 (.cg); a bias broadcast over rows (rs = 0) copies row 0 only (lanes 0, 1, through L1: every
  // warp of the CTA reads it), and every matrix row reads it. Rows at or past rows_left, chunks at or
  // past cols_left (keys inside the sample from j0) are zero-filled without a read. The caller commits
  // the group; add_staged_transposed waits for every group of the thread.
  template <int kQ>
  __device__ __forceinline__ void stage_transposed(uint32_t region, int rows_left, int cols_left, int lane) const {
    static_assert(kQ % 16 == 0, "bias stage (transposed): whole 16-row groups");
    const int hi = lane & 1;
    const bool col_in = 8 * hi < cols_left;
    if (rs == 0) {
      if (lane < 2) cp_async_ca_16(region + uint32_t(16 * kQ * hi), p + 16 * hi, col_in && rows_left > 0);
      return;
    }
#pragma unroll
    for (int m = 0; m < kQ / 16; ++m) {
      const int i = (lane >> 1) + 16 * m;
      cp_async_16(region + uint32_t(16 * (hi * kQ + i)), p + int64_t(i) * rs + 16 * hi, col_in && i < rows_left);
    }
  }
  // s (the warp's transposed fragment of kN = kQ / 8 n8 blocks) += the bias staged by stage_transposed
  // (log2 units), where s > -inf when kPartial (as add_tma). bcast: the bias is broadcast over
  // rows (rs = 0); bf: bf16 (else fp16). kN / 2 ldmatrix.x4.trans: lanes 8 m .. 8 m + 7 address matrix
  // (n = 2 k + m / 2, hi = m % 2).
  template <int kN, bool kPartial>
  __device__ __forceinline__ static void add_staged_transposed(float (&s)[kN][4], uint32_t region, int lane, bool bcast,
                                                               bool bf) {
    static_assert(kN % 2 == 0, "bias stage (transposed): pairs of n8 blocks");
    cp_async_wait<0>();
    __syncwarp();  // the lanes read each other's chunks
    const int m = lane >> 3;
    const uint32_t a0 = region + uint32_t(16 * ((m & 1) * kN * 8 + (bcast ? 0 : 8 * (m >> 1) + (lane & 7))));
    const uint32_t step = bcast ? 0u : 16u * 16u;  // k: rows 16 k ..
#pragma unroll
    for (int k = 0; k < kN / 2; ++k) {
      uint32_t u[4];
      ldmatrix_x4_trans(u, a0 + uint32_t(k) * step);
#pragma unroll
      for (int mm = 0; mm < 4; ++mm) {
        const int n = 2 * k + (mm >> 1), h2 = 2 * (mm & 1);
        add_pair<kPartial>(u[mm], bf, s[n][h2], s[n][h2 + 1]);
      }
    }
  }

  // add's loop for one dtype, element by element (load: the element at a byte address, as float).
  template <int kN, class Load>
  __device__ __forceinline__ void add_as(float (&s)[kN][4], Load load, float k) const {
    constexpr int kChunk = kN < 4 ? kN : 4;  // n8 blocks whose loads are in flight together
    static_assert(kN % kChunk == 0, "bias: whole chunks of n8 blocks");
#pragma unroll
    for (int n0 = 0; n0 < kN; n0 += kChunk) {
      float v[kChunk][4];
#pragma unroll
      for (int n = 0; n < kChunk; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const char* e = p + int64_t(8 * (r >> 1)) * rs + int64_t(8 * (n0 + n) + (r & 1)) * cs;
          v[n][r] = s[n0 + n][r] != -INFINITY ? load(e) : 0.0f;
        }
      }
#pragma unroll
      for (int n = 0; n < kChunk; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) s[n0 + n][r] = fmaf(v[n][r], k, s[n0 + n][r]);  // -inf stays -inf
      }
    }
  }
};

// One element of a dropout mask / rng_dump of dtype code `dt` (SdpaDropoutMaskDType) as float.
__device__ __forceinline__ float sdpa_mask_elem(const void* base, int32_t dt, int64_t off) {
  switch (dt) {
    case kSdpaMaskU8: return float(__ldg(static_cast<const unsigned char*>(base) + off));
    case kSdpaMaskF32: return __ldg(static_cast<const float*>(base) + off);
    default: {
      const unsigned short u = __ldg(static_cast<const unsigned short*>(base) + off);
      return dt == kSdpaMaskBF16 ? __uint_as_float(uint32_t(u) << 16) : __half2float(__ushort_as_half(u));
    }
  }
}

// Whether the Philox dropout keeps element (b, h, i, j) (core/philox.h; the CPU reference's rule).
__device__ __forceinline__ bool sdpa_dropout_keep(const SdpaDropoutParams& dp, uint32_t bh, int64_t i, int64_t j) {
  const uint64_t seed = uint64_t(load_index(dp.seed, 0)), offset = uint64_t(load_index(dp.offset, 0));
  return dropout_keep(seed, offset, bh, uint32_t(i), uint32_t(j), dp.threshold);
}

// The caller-mask form of the dropout multipliers (SdpaDropoutParams, mode 2) of a thread's share of a
// warp's fragment of kN n8 blocks: fn(n, r, m) for element (n, r), m = mask[1|b, 1|h, i + di, j + dj] times
// the mask's scale, read only inside the sample (rows < len_q, keys < len_k; 0 outside, where P is 0 anyway),
// in the order n, then r. (di, dj) = (8 (r / 2), 8 n + r % 2) (AccFragment: rows = queries), or with
// kTransposed (rows = keys: the sm90 backward's S^T) (8 n + r % 2, 8 (r / 2)); (i, j): the query and key of
// the thread's element (0, 0).
template <int kN, bool kTransposed, class Fn>
__device__ __forceinline__ void sdpa_dropout_mask_apply(const SdpaDropoutParams& dp, int b, int h, int64_t i,
                                                        int64_t j, int64_t len_q, int64_t len_k, Fn&& fn) {
  const float sc = __ldg(dp.mask_scale);
  const int64_t es = dp.mask_dtype == kSdpaMaskU8 ? 1 : dp.mask_dtype == kSdpaMaskF32 ? 4 : 2;
  const char* base = static_cast<const char*>(dp.mask) +
                     (int64_t(b) * dp.mask_stride[0] + int64_t(h) * dp.mask_stride[1] + i * dp.mask_stride[2] +
                      j * dp.mask_stride[3]) * es;
  const int64_t rs = dp.mask_stride[2] * es, cs = dp.mask_stride[3] * es;
  const int rows = int(len_q - i), cols = int(len_k - j);  // left inside the sample from (i, j)
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int rr = kTransposed ? 8 * n + (r & 1) : 8 * (r >> 1), cc = kTransposed ? 8 * (r >> 1) : 8 * n + (r & 1);
      float m = 0.0f;
      if (rr < rows && cc < cols) m = sdpa_mask_elem(base + rr * rs + cc * cs, dp.mask_dtype, 0) * sc;
      fn(n, r, m);
    }
  }
}

// Philox's multipliers from keep bits (bit 4 n + r: element (n, r) kept): fn(n, r, scale or 0), in the
// order n, then r.
template <int kN, class Bits, class Fn>
__device__ __forceinline__ void sdpa_dropout_keep_apply(Bits bits, float sc, Fn&& fn) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) fn(n, r, (bits >> (4 * n + r)) & 1u ? sc : 0.0f);
  }
}

// The forwards' form of Philox dropout (mode 1): the dropped elements of a fragment zeroed (bit 4 n + r clear:
// element (n, r) dropped, as for sdpa_dropout_keep_apply), a select an element, and the kept ones' 1 / (1 - p)
// left to O once after the walk (sdpa_dropout_scale_o) instead of a multiply an element on the softmax path
// (PERF_LOG v2.70: the sm90 forward 9.5 % faster). The row sums keep every element either way.
template <int kN, class Bits>
__device__ __forceinline__ void sdpa_dropout_zero_dropped(Bits bits, float (&s)[kN][4]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      if (!((bits >> (4 * n + r)) & 1u)) s[n][r] = 0.0f;
    }
  }
}

// O (a thread's kN n8 blocks of it) times Philox dropout's 1 / (1 - p), after a walk whose P had its dropped
// elements zeroed only (sdpa_dropout_zero_dropped); nothing for the caller's mask (mode 2: its multipliers are
// applied to each P) or without dropout.
template <int kN>
__device__ __forceinline__ void sdpa_dropout_scale_o(const SdpaDropoutParams& dp, float (&o)[kN][4]) {
  if (dp.mode != 1) return;
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) o[n][r] *= dp.scale;
  }
}

// The Philox keep bits (SdpaDropoutParams, mode 1) of a thread's share of a warp's fragment of kN n8
// blocks: bit 4 n + r for element (n, r) = row i + 8 (r / 2), column j + 8 n + r % 2 of sample b, query head
// h (i = the fragment's row 0 + g with i % 16 < 8, j = its column 0 + 2 q with column 0 a multiple of 16:
// AccFragment). The thread's 2 x 2 elements of blocks n and n + 1 (n even) are the four words' halves of one
// call (core/philox.h dropout_philox_block: 16-bit numbers, low halves block n, high halves n + 1), in a
// loop that is not unrolled (ten rounds per call unrolled over a fragment crowd the registers of the
// kernels' main loops).
template <int kN>
__device__ __forceinline__ uint64_t sdpa_dropout_keep_bits(const SdpaDropoutParams& dp, int b, int h, int num_heads,
                                                           int64_t i, int64_t j) {
  static_assert(kN > 0 && kN <= 16 && kN % 2 == 0, "keep bits of 2 .. 16 n8 blocks, in pairs");
  const uint64_t seed = uint64_t(load_index(dp.seed, 0)), offset = uint64_t(load_index(dp.offset, 0));
  const uint32_t bh = uint32_t(b * num_heads + h), thr = dp.threshold;
  uint64_t bits = 0;
  if constexpr (kN % 4 == 0) {
    // Two independent calls an iteration: their ten-round chains interleave (one chain a warp left the schedulers
    // idle on its latency). Their 16 bits enter at the top and move down 16 an iteration (constant shifts: the
    // variable 64-bit shift by 4 n cost a dozen instructions an iteration in this loop that is not unrolled).
#pragma unroll 1
    for (int n = 0; n < kN; n += 4) {
      const Philox4 w0 = dropout_philox_block(seed, offset, bh, uint32_t(i), uint32_t(j + 8 * n));
      const Philox4 w1 = dropout_philox_block(seed, offset, bh, uint32_t(i), uint32_t(j + 8 * n + 16));
      bits = bits >> 16 | uint64_t(dropout_keep_byte(w0, thr) | dropout_keep_byte(w1, thr) << 8) << 48;
    }
    bits >>= 64 - 4 * kN;
  } else {
#pragma unroll 1
    for (int n = 0; n < kN; n += 2) {
      const Philox4 w = dropout_philox_block(seed, offset, bh, uint32_t(i), uint32_t(j + 8 * n));
      bits |= uint64_t(dropout_keep_byte(w, thr)) << (4 * n);
    }
  }
  return bits;
}

// The dropout multipliers (SdpaDropoutParams, mode != 0) of a thread's share of a warp's fragment of kN
// n8 blocks, element by element: fn(n, r, m) for element (n, r) = row i + 8 (r / 2), column j + 8 n + r % 2
// of sample b, query head h (as sdpa_dropout_keep_bits), in the order n, then r. Philox: from the keep
// bits; the mask form: sdpa_dropout_mask_apply. The two forms are separate branches, so that neither's
// state is live in the other.
template <int kN, class Fn>
__device__ __forceinline__ void sdpa_dropout_apply(const SdpaDropoutParams& dp, int b, int h, int num_heads, int64_t i,
                                                   int64_t j, int64_t len_q, int64_t len_k, Fn&& fn) {
  if (dp.mode == 1) {
    sdpa_dropout_keep_apply<kN>(sdpa_dropout_keep_bits<kN>(dp, b, h, num_heads, i, j), dp.scale, fn);
  } else {
    sdpa_dropout_mask_apply<kN, false>(dp, b, h, i, j, len_q, len_k, fn);
  }
}

// The forwards' dropout (both families: kernel_fwd_sm80.cuh AnalyticMaskSm80::dropout, kernel_fwd_sm90.cuh
// AnalyticDropSourceSm90::dropout) on P of a thread's share of a warp's fragment of kN n8 blocks (element (n, r)
// = query i + 8 (r / 2), key j + 8 n + r % 2 of sample b, query head h, as sdpa_dropout_keep_bits), after the
// online softmax step (the row sums keep every element). Philox: with o_scaled (SdpaDropoutParams::o_scaled;
// the sm90 forward always) the dropped elements zeroed (sdpa_dropout_zero_dropped) and the kept ones' 1 / (1 - p)
// left to O (sdpa_dropout_scale_o), else P times the multiplier; the caller's mask (mode 2): P times the mask's
// element times its scale, read inside the sample only (queries below rows_end, keys below len_k).
template <int kN>
__device__ __forceinline__ void sdpa_dropout_forward(const SdpaDropoutParams& dp, bool o_scaled, int b, int h,
                                                     int num_heads, int64_t i, int64_t j, int64_t rows_end,
                                                     int64_t len_k, float (&s)[kN][4]) {
  if (dp.mode == 0) return;
  if (dp.mode == 1 && o_scaled) {
    sdpa_dropout_zero_dropped<kN>(sdpa_dropout_keep_bits<kN>(dp, b, h, num_heads, i, j), s);
  } else {
    sdpa_dropout_apply<kN>(dp, b, h, num_heads, i, j, rows_end, len_k, [&](int n, int r, float m) { s[n][r] *= m; });
  }
}

// The Philox keep bits (SdpaDropoutParams, mode 1) of a thread's share of a transposed fragment of kN n8
// blocks (rows = keys, columns = queries: the sm90 backward's S^T, kernel_bwd_mods_sm90.cuh): bit 4 n + r
// for element (n, r) = key k + 8 (r / 2), query i + 8 n + r % 2 of sample b, query head h (k = the
// fragment's row 0 + g, row 0 a multiple of 16; i = its column 0 + 2 q, column 0 a multiple of 16), kept
// or not as sdpa_dropout_apply keeps element (query, key) of the untransposed fragment (its word half of
// core/philox.h), so the keep mask is the forward's bit for bit; sdpa_dropout_keep_apply makes them the
// multipliers. All 32 lanes of the warp call it (a shuffle). The call of queries {i', i' + 8} x keys
// {k', k' + 1, k' + 8, k' + 9} (i' % 16 < 8, k' % 16 < 8 even) holds, in S^T, blocks n, n + 1 (n even) of
// query parity i' % 2, rows g, g + 8 of lane (key parity 0) and of lane ^ 4 (key parity 1: row g ^ 1).
// So each lane of such a pair draws the calls of one query parity, its own key parity e = k % 2 (kN / 2
// calls a thread, as for the untransposed fragment), keeps the words of its keys and hands the other
// lane its words with one shuffle.
template <int kN>
__device__ __forceinline__ uint32_t sdpa_dropout_keep_bits_transposed(const SdpaDropoutParams& dp, int b, int h,
                                                                      int num_heads, int64_t i, int64_t k) {
  static_assert(kN > 0 && kN % 2 == 0 && kN <= 8, "keep bits of 2 .. 8 n8 blocks, in pairs");
  const uint64_t seed = uint64_t(load_index(dp.seed, 0)), offset = uint64_t(load_index(dp.offset, 0));
  const uint32_t bh = uint32_t(b * num_heads + h), thr = dp.threshold;
  const uint32_t e = uint32_t(k) & 1u;  // this lane's key parity: the query parity of the calls it draws
  const uint32_t thr16 = thr << 16;      // (core/philox.h dropout_keeps_low / _high)
  uint32_t own = 0, other = 0;
  // The next call's words into own / other: its byte (element (2 np + jj, 0) at bit 4 jj, its key + 8 at bit
  // 4 jj + 2) enters at the top and moves down 8 a call (constant shifts in this loop that is not unrolled);
  // placed at 8 np + e after the last.
  auto take = [&](const Philox4& w) {
    uint32_t bo = 0, bt = 0;
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {  // block 2 np + jj: query row i' + 8 jj, words 2 jj + key parity
      const uint32_t wo = e ? w.x[2 * jj + 1] : w.x[2 * jj], wt = e ? w.x[2 * jj] : w.x[2 * jj + 1];
      if (dropout_keeps_low(wo, thr16)) bo |= 1u << (4 * jj);
      if (dropout_keeps_high(wo, thr16)) bo |= 1u << (4 * jj + 2);
      if (dropout_keeps_low(wt, thr16)) bt |= 1u << (4 * jj);
      if (dropout_keeps_high(wt, thr16)) bt |= 1u << (4 * jj + 2);
    }
    own = own >> 8 | bo << 24;
    other = other >> 8 | bt << 24;
  };
  auto call = [&](int np) {
    return dropout_philox_block(seed, offset, bh, uint32_t(i) + 16u * uint32_t(np) + e, uint32_t(k) - e);
  };
  if constexpr (kN % 4 == 0) {
    // Two independent calls an iteration: their ten-round chains interleave (sdpa_dropout_keep_bits).
#pragma unroll 1
    for (int np = 0; np < kN / 2; np += 2) {
      const Philox4 w0 = call(np), w1 = call(np + 1);
      take(w0);
      take(w1);
    }
  } else {
#pragma unroll 1
    for (int np = 0; np < kN / 2; ++np) take(call(np));
  }
  own = own >> (32 - 4 * kN) << e;
  other = other >> (32 - 4 * kN) << e;
  return own | __shfl_xor_sync(0xffffffffu, other, 4);
}

// softcap: c2 tanh(x2 / c2) with tanh.approx.f32 (one MUFU op, FlashAttention's form; PTX ISA: relative error
// about 2^-11). Until v2.73 tanh was 1 - 2 / (2^z + 1) with ex2.approx and the reciprocal on the FMA pipe
// (11 instructions a score against 3; the loop is issue-bound, PERF_LOG v2.47): MUFU.TANH made the sm90 softcap
// forward 18 % faster and its backward 7 % (PERF_LOG v2.73), and moved the LSE by <= 1.6e-4 (softcap 30, logits
// to 16; 1e-5 at softcap 2-5) where bf16 O and gradients kept their errors against a float64 reference.
//
// The modifiers of one query head.
struct SdpaScoreMod {
  float c2, inv_c2;  // softcap * log2 e and its inverse (c2 = 0: no softcap)
  float a2;          // ALiBi slope * log2 e (0: none)

  __device__ __forceinline__ static SdpaScoreMod make(const SdpaScoreParams& sp, int h) {
    SdpaScoreMod m;
    m.c2 = sp.softcap2;
    m.inv_c2 = inv_softcap(sp.softcap2);
    m.a2 = sp.alibi_n > 0 ? alibi_slope_dev(h, sp.alibi_n) * kLog2e : 0.0f;
    return m;
  }
  // 1 / c2 (0 without softcap) by MUFU.RCP: the IEEE division took a slow-path call in every key block of the
  // sm90 forward, which forms its modifiers per block (AnalyticModSourceSm90T::score_mod).
  __device__ __forceinline__ static float inv_softcap(float c2) { return c2 != 0.0f ? rcp_approx(c2) : 0.0f; }
  __device__ __forceinline__ bool active() const { return c2 != 0.0f || a2 != 0.0f; }
  // The modifiers of the transposed fragment (rows = keys j, columns = queries i: the sm90
  // backward's S^T) for apply / softcap_t_dlogit / softcap_dprob with base = i0 + shift - j0 (the negated diagonal
  // offset of its element (0, 0): diag_base(i0 + shift, j0)): its element (row, column) has
  // j - i - shift = -(base + column - row), so ALiBi's slope changes sign and softcap is as it is.
  __device__ __forceinline__ SdpaScoreMod transposed() const { return SdpaScoreMod{c2, inv_c2, -a2}; }

  // The modified logits of a warp's 16-row fragment of kN n8 blocks, in place. base: the
  // diagonal offset j - i - shift of the fragment's element (row 0, column 0); element (row
  // g + 8 (r / 2), column 8 n + 2 q + r % 2) of the fragment is offset by column - row.
  template <int kN>
  __device__ __forceinline__ void apply(float (&s)[kN][4], int base, int lane) const {
    if (c2 != 0.0f) {
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) s[n][r] = c2 * tanh_approx(s[n][r] * inv_c2);  // c2 tanh(s / c2)
      }
    }
    add_alibi(s, base, lane);
  }
  // Softcap (c2 != 0) on the raw scores s (x2 = scale_log2 s) in t units: s becomes t = tanh(x2 / c2) plus ALiBi's
  // term over c2 (the logits are then c2 s: the sm90 backward forms P^T = exp2(c2 s - lse2) in one FFMA, where
  // scaling, softcap's two multiplies and subtracting the statistic took four instructions an element, PERF_LOG
  // v2.73), and softcap's d logit2 / d x2 = 1 - t^2 of each element into dlogit as fp16 pairs (elements (n, 0),
  // (n, 1) in dlogit[n][0], (n, 2), (n, 3) in dlogit[n][1]; relative error 2^-11 from the fp16 rounding). The
  // sm90 backward's P^T before its dP^T wait (kernel_bwd_mods_sm90.cuh): 16 registers for what z^T held 32.
  template <int kN>
  __device__ __forceinline__ void softcap_t_dlogit(float (&s)[kN][4], float scale_log2, int base, int lane,
                                                   uint32_t (&dlogit)[kN][2]) const {
    softcap_t(s, scale_log2);
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      dlogit[n][0] = pack2<Float16>(fmaf(-s[n][0], s[n][0], 1.0f), fmaf(-s[n][1], s[n][1], 1.0f));
      dlogit[n][1] = pack2<Float16>(fmaf(-s[n][2], s[n][2], 1.0f), fmaf(-s[n][3], s[n][3], 1.0f));
    }
    add_alibi_in(s, base, lane, inv_c2);
  }
  // Softcap's t = tanh(x2 / c2) of the raw scores s (x2 = scale_log2 s), in place: an FMUL and the MUFU.TANH an
  // element (the tanh units of the sm90 forward's Variant::logits and of softcap_t_dlogit).
  template <int kN>
  __device__ __forceinline__ void softcap_t(float (&s)[kN][4], float scale_log2) const {
    const float k = scale_log2 * inv_c2;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) s[n][r] = tanh_approx(s[n][r] * k);
    }
  }
  // Element (n, r)'s d logit2 / d x2 from softcap_t_dlogit's dlogit.
  template <int kN>
  __device__ __forceinline__ static float dlogit_at(const uint32_t (&dlogit)[kN][2], int n, int r) {
    const uint32_t w = dlogit[n][r >> 1];
    return __half2float(__ushort_as_half(uint16_t((r & 1) ? w >> 16 : w & 0xffffu)));
  }
  // ALiBi's term in units of `unit` (a2 unit (j - i - shift): the raw-score or tanh units of the folded logits,
  // SdpaTileScoreMod::apply_raw, softcap_t_dlogit).
  template <int kN>
  __device__ __forceinline__ void add_alibi_in(float (&s)[kN][4], int base, int lane, float unit) const {
    SdpaScoreMod{c2, inv_c2, a2 * unit}.add_alibi(s, base, lane);
  }
  // ALiBi's a2 (j - i - shift) added (a2 = 0: nothing). The offsets are formed in float from the
  // thread's element (0, 0): float(d0) + c is float(d0 + c) exactly while |d0 + c| < 2^24, so one FADD an
  // element where the int form took an IADD and an I2FP.
  template <int kN>
  __device__ __forceinline__ void add_alibi(float (&s)[kN][4], int base, int lane) const {
    if (a2 != 0.0f) {
      const float f0 = float(base + 2 * (lane & 3) - (lane >> 2));
#pragma unroll
      for (int n = 0; n < kN; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) s[n][r] = fmaf(a2, f0 + float(8 * n + (r & 1) - 8 * (r >> 1)), s[n][r]);
      }
    }
  }

  // P times d logit2 / d x2 (softcap's 1 - t^2; 1 without softcap) of the fragment's elements,
  // in place, from y = logit2 - lse2 (-inf where masked, giving 0): the dS factor the backward
  // multiplies by (dP - D). lse2[hi]: the statistic of row half hi.
  // bias: the fragment's additive bias (SdpaBiasFrag; null p: none), taken out of the logit with
  // softcap (t is the tanh of the scores before the bias).
  template <int kN>
  __device__ __forceinline__ void probs_dlogit(float (&y)[kN][4], const float (&lse2)[2], int base, int lane,
                                               const SdpaBiasFrag& bias) const {
    const int d0 = base + 2 * (lane & 3) - (lane >> 2);
#pragma unroll
    for (int n = 0; n < kN; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float pr = exp2_approx(y[n][r]);
        if (c2 != 0.0f) {
          float logit = y[n][r] + lse2[r >> 1];
          if (bias.p != nullptr && pr > 0.0f) logit -= bias.at2(n, r);
          y[n][r] = softcap_dprob(pr, logit, d0 + 8 * n + (r & 1) - 8 * (r >> 1));
        } else {
          y[n][r] = pr;
        }
      }
    }
  }
  // The softcap part of probs_dlogit (c2 != 0) for one element: pr (1 - t^2) of its probability pr,
  // from its logit before the bias (log2 units: c2 t + ALiBi's a2 off) and its diagonal offset off
  // (j - i - shift; the transposed fragment's with transposed()).
  __device__ __forceinline__ float softcap_dprob(float pr, float logit, int off) const {
    const float t = (a2 != 0.0f ? fmaf(-a2, float(off), logit) : logit) * inv_c2;
    return pr > 0.0f ? pr * fmaf(-t, t, 1.0f) : 0.0f;
  }
};

// SDPA's score modifiers on one key block of a warp's 16-row tile, as the ScoreMod policy of
// kern::Variant (variant.cuh): softcap and ALiBi before the mask (SdpaScoreMod at the tile's diagonal
// offset), the additive bias after it on the visible elements only (SdpaBiasFrag: never read where the
// mask set -inf); with a positive scale in raw-score units or, with softcap, in tanh units (linear(),
// softcapped(): the softmax's exponent takes the scale or c2), else on the scaled scores (apply). The
// sm90 forward with modifiers builds one per key block (kernel_fwd_sm90.cuh AnalyticModSourceSm90T::score_mod).
// kBias = false: no bias (its code not in the kernel: the bias's loads cost the other modifiers' calls 2-3 %
// of the shared (128, 128) forward, PERF_LOG v2.24).
template <bool kBias = true>
struct SdpaTileScoreMod {
  SdpaScoreMod mod;
  int diag;           // j - i - shift of the tile's element (0, 0) (diag_base; read by ALiBi only)
  int lane;
  SdpaBiasFrag bias;  // null p: no bias read element by element (staged: p null, rs = 0 iff broadcast over rows)
  uint32_t staged = 0;  // the warp's rows of the TMA-staged bias tile (SdpaBiasFrag::add_tma), else 0

  // No modifier at all (a call with sinks or epilogue options only): the logits are the scaled
  // scores, so Variant may fold the scale into the softmax's exponent.
  __device__ __forceinline__ bool identity() const { return !mod.active() && !has_bias(); }
  // A bias on this call: staged by TMA (staged != 0; bias.p is not formed then) or read element by element.
  __device__ __forceinline__ bool has_bias() const {
    if constexpr (kBias) {
      return bias.p != nullptr || staged != 0;
    } else {
      return false;
    }
  }
  // ALiBi and / or a bias and no softcap on this call: the logits are the scaled scores plus terms
  // that do not depend on them, so Variant::logits keeps the scores raw and folds the scale into the
  // softmax's exponent (as for identity()), and apply_raw adds those terms in raw-score units, times
  // unit = 1 / (scale log2(e)): one FFMA an element each, as in log2 units, and the FMUL by the scale
  // saved.
  __device__ __forceinline__ bool linear() const { return mod.c2 == 0.0f && (mod.a2 != 0.0f || has_bias()); }
  // Softcap on this call (with ALiBi and a bias or not): logit2 = c2 tanh(x2 / c2) + terms = c2 (t + terms / c2),
  // so Variant::logits turns the raw scores into t = tanh(s scale log2(e) / c2) (SdpaScoreMod::softcap_t: an FMUL
  // and the MUFU.TANH an element, where scaling, softcap's two multiplies and the tanh took four), adds the terms in
  // t units (apply_raw with unit = 1 / c2) and the softmax's exponent multiplies by c2 (> 0: the max of t times
  // c2 is the max of the logits). PERF_LOG v2.73.
  __device__ __forceinline__ bool softcapped() const { return mod.c2 != 0.0f; }
  // Softcap and no term after it (no ALiBi, no bias): on a full block the logits are c2 t, t = softcap_t(s).
  __device__ __forceinline__ bool softcap_only() const { return mod.c2 != 0.0f && mod.a2 == 0.0f && !has_bias(); }
  template <int kN>
  __device__ __forceinline__ void apply_raw(float (&s)[kN][4], bool partial, float unit) const {
    mod.add_alibi_in<kN>(s, diag, lane, unit);
    if constexpr (kBias) {
      const float k = kLog2e * unit;
      if (staged != 0) {
        bias.add_tma<kN>(s, staged, lane, partial, k);
      } else {
        bias.add<kN>(s, k);
      }
    }
  }
  template <int kN>
  __device__ __forceinline__ void apply(float (&s)[kN][4]) const {
    mod.apply<kN>(s, diag, lane);
  }
  template <int kN>
  __device__ __forceinline__ void apply_visible(float (&s)[kN][4], bool partial) const {
    if constexpr (kBias) {
      if (staged != 0) {
        bias.add_tma<kN>(s, staged, lane, partial);
      } else {
        bias.add<kN>(s);
      }
    }
  }
};

// SDPA's forward epilogue options (SdpaEpilogueParams) on one output row, for the forward
// epilogues of both families: row row0 + row (sample positions) of sample b, query head h, p an
// SDPA kernel's parameters (analytic_of), with the row's statistics (m: the running max in log2
// units, sink included; lsum: the quad's row sum). `writer`: the one thread of the row's quad that
// writes the statistics outputs (score_max in natural units whatever stats_use_log2 says,
// score_sum_exp). Returns the row's gate (element (row, column 0) of G), or null without a gate or
// when the row saw nothing (its O stays 0 whatever G holds, and G is not read). (row0, row) rather
// than their sum: an int64 sum formed by the caller changed the sm80 kernels' SASS.
template <class E>
__device__ __forceinline__ const typename E::Storage* sdpa_fwd_row_options(const FwdParams& p, int b, int h,
                                                                          int row0, int row, float m, float lsum,
                                                                          bool writer) {
  const SdpaEpilogueParams& ep = analytic_of(p).epi;
  // Element (row, column 0) of head h of sample b of epilogue tensor x with strides t.
  auto index = [&](int x, const TensorAddr& t) {
    return sample_start(analytic_of(p).start[x], b) + int64_t(h) * t.head_stride + int64_t(row0 + row) * t.row_stride;
  };
  if (writer) {
    if (ep.score_max != nullptr) ep.score_max[index(kSdpaScoreMax, ep.sma)] = m * kLn2;
    if (ep.score_sum_exp != nullptr) ep.score_sum_exp[index(kSdpaScoreSumExp, ep.ssa)] = lsum;
  }
  if (ep.gate == nullptr || !(lsum > 0.0f)) return nullptr;
  return static_cast<const typename E::Storage*>(ep.gate) + index(kSdpaGate, ep.ga);
}

// The output gate on columns col, col + 1 (col even) of a row: x *= sigmoid(G) with grow the row's
// gate (sdpa_fwd_row_options).
template <class E>
__device__ __forceinline__ void sdpa_gate_pair(const typename E::Storage* grow, int col, float& x0, float& x1) {
  using Elem = typename E::Storage;
  const uint32_t g2 = *reinterpret_cast<const uint32_t*>(grow + col);  // 4-byte aligned: col even
  const Elem* ge = reinterpret_cast<const Elem*>(&g2);
  x0 *= sigmoid_fast(to_float<E>(ge[0]));
  x1 *= sigmoid_fast(to_float<E>(ge[1]));
}

// j - i - shift of tile element (r0, c0) of a sample, clamped into int (a band never reaches
// the clamp on a visible element: |j - i - shift| <= S_q + S_kv < 2^31).
__device__ __forceinline__ int diag_base(int64_t c0, int64_t r0_plus_shift) {
  return int(clamp64(c0 - r0_plus_shift, -(int64_t(1) << 30), int64_t(1) << 30));
}

}  // namespace flashspan::kern

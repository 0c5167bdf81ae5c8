// Flex attention backward kernels for sm_80 and newer (mma.sync m16n8k16, cp.async, ldmatrix).
//
// Algorithm: FlashAttention-2 backward (Dao 2023, Alg. 2) over the plan's backward view
// (tile kBlockQ x kBlockK, payload rows = queries, cols = keys):
//   1. preprocess:  D_i = dO_i . O_i - dlse_i (dlse: the optional LSE gradient, as
//                   d LSE_i / d S_ij = P_ij) and lse2_i = LSE_i * log2(e) (+inf for an empty row, so
//                   exp2(s - lse2) = 0 there) into the workspace, [Hq, total_q] fp32.
//   2. dK/dV kernel: one CTA per (key block, kv head, batch) task; walks the K2Q lists of
//                   every query head of the kv group (GQA sums stay in registers), recomputing
//                   S = Q K^T, P = exp2(S*scale*log2e - lse2), dP = dO V^T, dS = P (dP - D);
//                   dV += P^T dO, dK += dS^T Q; dK scaled at the end.
//                   deterministic = false (task mode): a persistent grid runs the work items
//                   of the split schedule instead (bwd_split.cuh): long K2Q walks are cut
//                   into chunks whose dK/dV partial sums meet in fp32 accumulators.
//   3. dQ:          deterministic = false: the dK/dV kernel also forms dS K for its key block
//                   and adds it to an fp32 accumulator in the workspace (atomics), then a
//                   convert kernel writes dq = scale * accumulator.
//                   deterministic = true: a separate kernel, one CTA per (query block, query
//                   head), walks the Q2K lists in ascending key-block order with no atomics
//                   (recomputing S and dP): bitwise reproducible.
// The dK/dV kernel uses 2-D warp tiles (32x32 S/dP tiles for Bk = 128, 32-key dK/dV tiles;
// BwdTraitsSm80 has the layouts and the ldmatrix/mma counts); the deterministic dQ kernel
// 16-row warp tiles. Payload sub-tile (mt, ct) lives in lane words
// (mt * kBlockK/64 + ct) * 32 + lane (payload_layout.h); a warp applies it per m16 tile.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/analytic_mask.h"
#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/common/block_range.cuh"
#include "kernels/common/fp8_soft.h"
#include "kernels/common/grid.h"
#include "kernels/common/kv_addr.cuh"
#include "kernels/common/k2q_walk.cuh"
#include "kernels/common/sdpa_score_mod.cuh"
#include "kernels/common/seqlen_info.cuh"
#include "kernels/common/softmax.cuh"
#include "kernels/common/split_schedule.cuh"
#include "kernels/common/tile_scheduler.cuh"
#include "kernels/params.h"
#include "kernels/sm80/mask_apply_sm80.cuh"
#include "kernels/sm80/mma_sm80.cuh"
#include "kernels/sm80/tile_io_sm80.cuh"
#include "kernels/sm80/tile_sm80.h"

namespace flashspan::kern {

// ---------------------------------------------------------------------------------------
// Tile and warp layouts of the backward kernels.
//
// Why 2-D warp tiles: on sm_90 an mma.sync kernel is bound by the shared-memory port
// (128 B/clk per SM; one ldmatrix.x4 moves 512 B = 4 clk, while mma.sync peaks at about
// one m16n8k16 per 1.5 clk per SM), so the figure to minimise is ldmatrix.x4 per mma
// (below ~0.4 the tensor pipe, not the port, becomes the limit). A warp tile of
// kM m16 tiles x kN n8 blocks reads kM A fragments and kN/2 B fragments per k16 step for
// kM*kN mma: ratio (kM + kN/2) / (kM kN). The dK/dV kernel's three phases (8 warps):
//   S/dP  (S = Q K^T, dP = dO V^T; M = queries, N = keys, K = head dim):
//         kSWM x kSWN warps, warp tile kSMT m16 x kSNT n8 (32 x 32 for Bk = 128).
//   dK/dV (dV += P^T dO, dK += dS^T Q; M = keys, N = head dim, K = queries):
//         kKWM x kKWN warps, warp tile 2 m16 (32 keys) x kNK (dK) / kNV (dV) n8 blocks.
//   dQ    (atomic path, dQ += dS K; M = queries, N = head dim, K = keys):
//         kQWM x kQWN warps, warp tile kQMT m16 x kNQA n8, kQPass passes over the head dim
//         (two for Dqk = 256, so that its 32 accumulators fit next to dK/dV's).
// Per K2Q iteration and warp (ldmatrix.x4 / mma; x8 warps for the CTA):
//   tile (Bq, Bk, Dqk, Dv)   phase    1-D layout (before)     2-D layout (now)
//   (64, 128, 128, 128)      S/dP     16x64:   80 / 128        32x32:  64 / 128
//                            dK/dV    16x128:  72 / 128        32x64:  48 / 128
//                            dQ       16x64:   40 /  64        32x32:  32 /  64
//                            total            192 / 320              144 / 320  (-25%)
//   (64, 128, 64, 64)        S/dP / dK/dV / dQ   40+40+24 = 104     32+32+24 = 88 (/160)
//   (64, 64, 192, 128)       S/dP / dK/dV / dQ   60+48+28 = 136     60+36+20 = 116 (/208)
//   (64, 64, 256, 256)       S/dP / dK/dV / dQ   96+72+36 = 204     96+48+32 = 176 (/320)
// (With Bk = 64 a warp's S tile holds 512 elements: 16x32 is as good as it gets, and
// 32-column warp tiles keep apply_payload's c0 % 32 == 0.) Accumulators per thread are
// unchanged: dK + dV = Bk (Dqk + Dv) / 256 fp32, S and dP 2 x Bq Bk / 256 fp32.
template <int kBlockQ_, int kBlockK_, int kDqk_, int kDv_, bool kExact_>
struct BwdTraitsSm80 {
  static constexpr int kBlockQ = kBlockQ_, kBlockK = kBlockK_, kDqk = kDqk_, kDv = kDv_;
  // kExact: head dims equal the tile's; no k-step or column block is skipped at run time.
  static constexpr bool kExact = kExact_;
  static_assert(kBlockQ == 64 && (kBlockK == 64 || kBlockK == 128) && kDqk % 64 == 0 && kDv % 64 == 0);
  // dK/dV kernel: 8 warps.
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  // S/dP phase: warps kSWM (query rows) x kSWN (keys).
  static constexpr int kSWM = kBlockK == 128 ? 2 : 4;
  static constexpr int kSWN = kWarps / kSWM;
  static constexpr int kSMT = kBlockQ / kSWM / 16;  // m16 tiles of a warp's S tile
  static constexpr int kSNT = kBlockK / kSWN / 8;   // n8 blocks of a warp's S tile (32 keys)
  // dK/dV phase: warps kKWM (32 keys each) x kKWN (head-dim columns).
  static constexpr int kKMT = 2;
  static constexpr int kKWM = kBlockK / (16 * kKMT);
  static constexpr int kKWN = kWarps / kKWM;
  static constexpr int kNK = kDqk / kKWN / 8;  // n8 blocks of a warp's dK tile
  static constexpr int kNV = kDv / kKWN / 8;   // n8 blocks of a warp's dV tile
  // dQ phase (atomic path): warps kQWM (query rows) x kQWN (head-dim columns), kQPass passes.
  static constexpr int kQWM = 2;
  static constexpr int kQWN = kWarps / kQWM;
  static constexpr int kQMT = kBlockQ / kQWM / 16;
  static constexpr int kQPass = kDqk > 192 ? 2 : 1;
  static constexpr int kNQA = kDqk / kQPass / kQWN / 8;
  static_assert(kSWM * kSWN == kWarps && kSNT == 4 && kKWM * kKWN == kWarps && kQWM * kQWN == kWarps);
  static_assert(kNK % 2 == 0 && kNV % 2 == 0 && kNQA % 2 == 0, "B fragments serve n8 block pairs");
  static constexpr int kSmemK = kBlockK * kDqk * 2;
  static constexpr int kSmemV = kBlockK * kDv * 2;
  static constexpr int kSmemQ = kBlockQ * kDqk * 2;  // x2 (double buffered)
  static constexpr int kSmemO = kBlockQ * kDv * 2;   // dO, x2
  static constexpr int kSmemP = kBlockQ * kBlockK * 2;
  // The split schedule's claimed item {task, begin, end, slot} (int32 x 4) follows the tiles.
  static constexpr int kSmemItem = kSmemK + kSmemV + 2 * (kSmemQ + kSmemO) + 2 * kSmemP;
  static constexpr int kSmemBytes = kSmemItem + 16;
  // dQ kernel: 4 warps, warp w owns query rows 16w.. and every key column.
  static constexpr int kWarpsQ = kBlockQ / 16;
  static constexpr int kThreadsQ = kWarpsQ * 32;
  static constexpr int kNSQ = kBlockK / 8;
  static constexpr int kNQ = kDqk / 8;
  static constexpr int kSmemBytesQ = kSmemQ + kSmemO + 2 * (kSmemK + kSmemV);
};

// One k16 step of a warp tile: acc[m][n] += A(m16 tile m, k16 step kk) B(k16 step kk, n8 block n).
// A fragments: kATrans ? ldsm_a_trans address, read at(m, 16 kk) : ldsm_a address, at(kk, 16 m).
// B fragments: kBKn ? ldsm_b_kn address, at(n / 2, 16 kk) : ldsm_b_nk address, at(kk, 8 n).
// The kM A fragments are read once and serve every n8 block; each B fragment serves kM x 2 mma.
// Column pairs at or past n_valid (relative to the warp's first column) are skipped unless
// kExact (run-time head dims below the tile's).
template <int kM, int kN, bool kATrans, bool kBKn, bool kExact, class E, int kDa, int kDb>
__device__ __forceinline__ void warp_mma_k16(float (&acc)[kM][kN][4], const LdsmAddr<kDa>& a, const LdsmAddr<kDb>& b,
                                             int kk, int n_valid) {
  static_assert(kN % 2 == 0, "two n8 blocks per B fragment");
  uint32_t af[kM][4];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    if constexpr (kATrans) {
      ldmatrix_x4_trans(af[m], a.at(m, kk * 16));
    } else {
      ldmatrix_x4(af[m], a.at(kk, m * 16));
    }
  }
#pragma unroll
  for (int n = 0; n < kN; n += 2) {
    if (kExact || n * 8 < n_valid) {
      uint32_t bf[4];
      if constexpr (kBKn) {
        ldmatrix_x4_trans(bf, b.at(n / 2, kk * 16));
      } else {
        ldmatrix_x4(bf, b.at(kk, n * 8));
      }
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma_16816<E>(acc[m][n], af[m], bf[0], bf[1]);
        mma_16816<E>(acc[m][n + 1], af[m], bf[2], bf[3]);
      }
    }
  }
}

// The value, formed here once: an empty asm hides its origin, so that ptxas neither sinks
// its computation into each (predicated) use nor re-derives it there.
template <class T>
__device__ __forceinline__ T* pin(T* ptr) {
  asm("" : "+l"(ptr));
  return ptr;
}

// atomic_add_f32x2 without a result: red.global.add.v2.f32 on sm_90 (atomicAdd's float2
// form, which ptxas otherwise may emit as an ATOM with a discarded result).
__device__ __forceinline__ void red_add_f32x2(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
#else
  atomic_add_f32x2(p, x, y);
#endif
}

// d = A B + c (mma_16816 with a separate C operand).
template <class E>
__device__ __forceinline__ void mma_16816_c(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                            const float (&c)[4]) {
  if constexpr (E::kDType == DType::kBFloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
  }
}

// The first k16 step (kk = 0) of warp_mma_k16 with ldsm_a / ldsm_b_nk operands and every
// column pair present, starting from c instead of acc: acc[m][n] = A B + c[m] (every n8 block
// of m16 tile m starts from the same c[m], so no per-block copies of it are made).
template <int kM, int kN, class E, int kDa, int kDb>
__device__ __forceinline__ void warp_mma_k16_first(float (&acc)[kM][kN][4], const float (&c)[kM][4],
                                                   const LdsmAddr<kDa>& a, const LdsmAddr<kDb>& b) {
  static_assert(kN % 2 == 0, "two n8 blocks per B fragment");
  uint32_t af[kM][4];
#pragma unroll
  for (int m = 0; m < kM; ++m) ldmatrix_x4(af[m], a.at(0, m * 16));
#pragma unroll
  for (int n = 0; n < kN; n += 2) {
    uint32_t bf[4];
    ldmatrix_x4(bf, b.at(0, n * 8));
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      mma_16816_c<E>(acc[m][n], af[m], bf[0], bf[1], c[m]);
      mma_16816_c<E>(acc[m][n + 1], af[m], bf[2], bf[3], c[m]);
    }
  }
}

template <int kM, int kN>
__device__ __forceinline__ void zero_acc(float (&acc)[kM][kN][4]) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < kN; ++n) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.0f;
  }
}

// ---------------------------------------------------------------------------------------
// Mask policies of the backward kernels (the compile-time Mask role, as in the forward,
// kernel_fwd_sm80.cuh): the plan's payload (PlanPayloadMaskBwdSm80) or the analytic mask of
// SDPA (AnalyticMaskBwdSm80). Per work item:
//   typename Mask::Seqlen sl(p, b)             the sample's lengths; q_start = its first row in
//                                              the workspace (and the plan's row starts)
//   Mask::k2q(p, sl, hkv, b, kb, count, begin)  dK/dV: (query head, query block) pairs,
//                                              next(head, qb, payload), payload < 0: full
//   Mask::q2k(p, sl, hm, gq, qb)               dQ: key blocks, next(blk, partial, entry)
//   Mask::sample_ptr<Elem>(p, base, x, b), Mask::batch(b), Mask::row0(p, start)
//                                              row_ptr(sample_ptr, a, batch(b), row0 + r, h) is
//                                              row r of head h of sample b of tensor x
//   Mask::rows_store(p, x, row0, rows, rows_valid, sl)  rows of a block an output writes
//   mask = Mask::dkdv_item(sl, kb) / Mask::dq_item(sl, qb); mask.apply<kN>(p, s, payload,
//   qb, kb, mt, c0, lane): a partial block's element mask on m16 tile mt, columns c0.. of
//   the warp tile.
//   Mask::kFeatures                            SDPA's features beyond the mask in the main
//                                              loops (run-time flags): score modifiers, bias /
//                                              dBias, dropout, block_mask, H_k != H_v. false
//                                              (the plan, SDPA's mask-only instantiations): the
//                                              S -> P -> dS steps of the plan kernels.

// The plan's payload; the hooks are the code the kernels had inline (scripts/sass_diff.sh:
// these instantiations compile to the same SASS).
template <class T>
struct PlanPayloadMaskBwdSm80 {
  static constexpr bool kAnalytic = false;
  static constexpr bool kFeatures = false;  // (AnalyticMaskBwdSm80)
  static constexpr bool kDsBeforeSoftcap = false;
  using Seqlen = SeqlenInfo;

  __device__ __forceinline__ static K2QWalk k2q(const BwdParams& p, const Seqlen&, int hkv, int b, int kb, int count,
                                                int begin) {
    K2QWalk walk{&p, hkv * p.group_size, (hkv + 1) * p.group_size, b, kb, count, {}};
    walk.seek(begin);
    return walk;
  }
  __device__ __forceinline__ static BlockCursor q2k(const BwdParams& p, const Seqlen&, int hm, int gq, int /*qb*/) {
    const int64_t r = int64_t(hm) * p.view.num_q_blocks + gq;
    return BlockCursor::row(p.view.q2k_partial_ptr, p.view.q2k_partial_kb, p.view.q2k_full_ptr, p.view.q2k_full_runs,
                            r);
  }
  template <class Elem>
  __device__ __forceinline__ static Elem* sample_ptr(const BwdParams&, const void* base, int /*x*/, int /*b*/) {
    return static_cast<Elem*>(const_cast<void*>(base));
  }
  __device__ __forceinline__ static int batch(int b) { return b; }
  __device__ __forceinline__ static int row0(const BwdParams& p, int start) { return p.varlen ? start : 0; }
  __device__ __forceinline__ static int rows_store(const BwdParams&, int /*x*/, int /*row0*/, int /*rows*/,
                                                   int rows_valid, const Seqlen&) {
    return rows_valid;
  }
  __device__ __forceinline__ static PlanPayloadMaskBwdSm80 dkdv_item(const Seqlen&, int /*kb*/) { return {}; }
  __device__ __forceinline__ static PlanPayloadMaskBwdSm80 dq_item(const Seqlen&, int /*qb*/) { return {}; }
  template <int kN>
  __device__ __forceinline__ static void apply(const BwdParams& p, float (&s)[kN][4], int payload, int /*qb*/,
                                               int /*kb*/, int mt, int c0, int lane) {
    if (payload >= 0) {
      apply_payload<kN>(s, p.view.q2k_partial_bits + size_t(payload) * (size_t(T::kBlockQ) * T::kBlockK / 32), mt, c0,
                        T::kBlockK, lane);
    }
  }
};

// A partial tile's element mask for a backward work item of the analytic mask: the item's
// fixed block's terms (dK/dV: KeyBlockMask of key block kb; dQ: QueryBlockMask of query block
// qb), the tile of the other side's block from them (analytic_mask.h).
// diag(p, qb, kb, mt, c0): the diagonal offset j - i - shift of element (row 16 mt, column c0)
// of tile (qb, kb), for the score modifiers (sdpa_score_mod.cuh).
template <class T>
struct AnalyticDkdvMaskSm80 {
  KeyBlockMask block;  // lo0 = d_min + shift - key0
  template <int kN>
  __device__ __forceinline__ void apply(const BwdParams&, float (&s)[kN][4], int payload, int qb, int /*kb*/, int mt,
                                        int c0, int lane) const {
    if (payload >= 0) apply_tile_mask<kN>(s, block.tile(int64_t(qb) * T::kBlockQ), mt, c0, lane);
  }
  __device__ __forceinline__ int diag(const BwdParams& p, int qb, int /*kb*/, int mt, int c0) const {
    return diag_base(c0, int64_t(qb) * T::kBlockQ + 16 * mt + (block.lo0 - analytic_of(p).band.d_min()));
  }
};
template <class T>
struct AnalyticDqMaskSm80 {
  QueryBlockMask block;  // lo0 = d_min + row0 + shift
  template <int kN>
  __device__ __forceinline__ void apply(const BwdParams&, float (&s)[kN][4], int payload, int /*qb*/, int kb, int mt,
                                        int c0, int lane) const {
    if (payload >= 0) apply_tile_mask<kN>(s, block.tile(int64_t(kb) * T::kBlockK), mt, c0, lane);
  }
  __device__ __forceinline__ int diag(const BwdParams& p, int /*qb*/, int kb, int mt, int c0) const {
    return diag_base(int64_t(kb) * T::kBlockK + c0, 16 * mt + (block.lo0 - analytic_of(p).band.d_min()));
  }
};

// SDPA's shifted logits of a warp's fragment in the backward: logit2 - lse2 (log2 units), the
// score modifiers between the scaling and the subtraction (sdpa_score_mod.cuh); the mask
// follows.
template <int kN>
__device__ __forceinline__ void sdpa_bwd_logits(const BwdParams& p, float (&s)[kN][4], const float (&lse2)[2],
                                                const SdpaScoreMod& mod, int base, int lane) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] *= p.scale_log2;
  }
  if (mod.active()) mod.apply<kN>(s, base, lane);
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] -= lse2[i >> 1];
  }
}

// The analytic mask of SDPA: blocks and element masks from positions, lengths and tensor
// starts from the caller's device arrays (AnalyticMaskParams). kFeatures_ (sdpa_bwd_has_features,
// params.h): the score modifiers, bias / dBias, dropout, the block_mask and H_k != H_v compiled
// in (run-time flags); false: the mask alone, whose main loops are the plan kernels' between the
// mask hooks (no block_mask, one K / V head per work item). kDsBeforeSoftcap_ (with kFeatures_;
// sdpa_dbias_softcap_sm80_enabled): dBias together with softcap, its dS P (dP - D) before softcap's factor, through
// the dS workspace (dkdv_item); its own instantiation, so that the other kernels' code stays as it was (the
// features kernels' D = 128 (64, 128) loop spilled 16 B more with it compiled in, PERF_LOG v2.41).
template <class T, bool kFeatures_ = true, bool kDsBeforeSoftcap_ = false>
struct AnalyticMaskBwdSm80 {
  static constexpr bool kAnalytic = true;
  static constexpr bool kFeatures = kFeatures_;
  static constexpr bool kDsBeforeSoftcap = kDsBeforeSoftcap_;
  static_assert(kFeatures || !kDsBeforeSoftcap, "dBias with softcap is a feature");
  static_assert((1 << kBlockMaskShift) % T::kBlockQ == 0 && (1 << kBlockMaskShift) % T::kBlockK == 0,
                "block_mask: tiles must lie inside one 128 x 128 block");
  using Seqlen = AnalyticSeqlen;

  // The query heads of work-item head hkv: K's group, or V's in the dV pass (dkdv_role 2).
  __device__ __forceinline__ static int group(const BwdParams& p) {
    if constexpr (!kFeatures) return p.group_size;
    const SdpaScoreParams& sc = analytic_of(p).score;
    return sc.dkdv_role == 2 ? sc.group_v : p.group_size;
  }
  __device__ __forceinline__ static AnalyticK2QWalk k2q(const BwdParams& p, const Seqlen& sl, int hkv, int, int kb,
                                                        int count, int begin) {
    const int gx = group(p);
    AnalyticK2QWalk walk =
        masked_k2q_walk<kFeatures>(analytic_of(p), sl, hkv * gx, (hkv + 1) * gx, count, kb, T::kBlockQ, T::kBlockK);
    walk.seek(begin);
    return walk;
  }
  // hm: the query head (SDPA calls set mask_per_head); the block_mask leaves blocks out.
  __device__ __forceinline__ static BlockMaskedCursor q2k(const BwdParams& p, const Seqlen& sl, int hm, int, int qb) {
    return masked_q2k_cursor<kFeatures>(analytic_of(p), sl, hm, qb, T::kBlockQ, T::kBlockK);
  }
  template <class Elem>
  __device__ __forceinline__ static Elem* sample_ptr(const BwdParams& p, const void* base, int x, int b) {
    return static_cast<Elem*>(const_cast<void*>(base)) + sample_start(analytic_of(p).start[x], b);
  }
  __device__ __forceinline__ static int batch(int) { return 0; }
  __device__ __forceinline__ static int row0(const BwdParams&, int) { return 0; }
  __device__ __forceinline__ static int rows_store(const BwdParams& p, int x, int row0, int rows, int rows_valid,
                                                   const Seqlen&) {
    const AnalyticMaskParams& a = analytic_of(p);
    return rows_to_store(a, x, row0, rows, rows_valid + row0, x == kSdpaDQ ? a.max_q : a.max_kv);
  }
  __device__ __forceinline__ static AnalyticDkdvMaskSm80<T> dkdv_item(const Seqlen& sl, int kb) {
    return {KeyBlockMask::make(sl.mask, int64_t(kb) * T::kBlockK)};
  }
  __device__ __forceinline__ static AnalyticDqMaskSm80<T> dq_item(const Seqlen& sl, int qb) {
    return {QueryBlockMask::make(sl.mask, int64_t(qb) * T::kBlockQ)};
  }
};

// Q/dO loader of the dK/dV kernel (role: loads). A full query block (every block of the sample
// but a partial last one) loads through the thread's precomputed chunk offsets (TileRowLoader),
// one base per tile; the partial last block takes load_tile_async (row checks, zero fill).
// Both or neither row loader (the (192, 128) tile's Q rows are 24 chunks: load_tile_async's
// generic layout, which then serves dO too).
template <class T, class Elem>
struct BwdQdoLoaderSm80 {
  using LoaderQ = TileRowLoader<T::kBlockQ, T::kDqk, T::kThreads>;
  using LoaderO = TileRowLoader<T::kBlockQ, T::kDv, T::kThreads>;
  static constexpr bool kRowLoaders = LoaderQ::kApplies && LoaderO::kApplies;
  LoaderQ ldq{};
  LoaderO ldo{};
  // Row 0 of sample b's query rows (head 0) of Q and dO, [0, 1] plus the thread's chunk
  // offset, [2, 3] without. Kept in local memory (volatile: read back per tile) rather than
  // in registers, which the loop has none to spare for (ptxas would otherwise recompute them
  // from b, the strides and tid every iteration).
  volatile uintptr_t thr_src[4];

  // Mask: the backward mask policy (its sample_ptr / batch hooks address sample b).
  template <class Mask>
  __device__ __forceinline__ void init(const BwdParams& p, int b, int64_t qrow_base, int tid) {
    if constexpr (kRowLoaders) {
      ldq.init(p.qa.row_stride, T::kExact ? T::kDqk : p.head_dqk, tid);
      ldo.init(p.doa.row_stride, T::kExact ? T::kDv : p.head_dv, tid);
    }
    const void* q = Mask::template sample_ptr<const Elem>(p, p.q, kSdpaQ, b);
    const void* dout = Mask::template sample_ptr<const Elem>(p, p.dout, kSdpaDO, b);
    const int bb = Mask::batch(b);
    thr_src[2] = reinterpret_cast<uintptr_t>(row_ptr<Elem>(q, p.qa, bb, qrow_base, 0));
    thr_src[3] = reinterpret_cast<uintptr_t>(row_ptr<Elem>(dout, p.doa, bb, qrow_base, 0));
    thr_src[0] = reinterpret_cast<uintptr_t>(row_ptr<Elem>(q, p.qa, bb, qrow_base, 0) + ldq.offset());
    thr_src[1] = reinterpret_cast<uintptr_t>(row_ptr<Elem>(dout, p.doa, bb, qrow_base, 0) + ldo.offset());
  }
  // Query block qq of head hh into Q/dO buffer buf (sQ0/sO0: buffer 0).
  __device__ __forceinline__ void load(const BwdParams& p, uint32_t sQ0, uint32_t sO0, int buf, int hh, int qq,
                                       int len_q, int tid) {
    const int rows = len_q - qq * T::kBlockQ;
    // Element offset of (query block qq, head hh) from row 0 / head 0 (both non-negative).
    const int64_t oq = int64_t(uint32_t(hh)) * p.qa.head_stride + int64_t(uint32_t(qq * T::kBlockQ)) * p.qa.row_stride;
    const int64_t oo =
        int64_t(uint32_t(hh)) * p.doa.head_stride + int64_t(uint32_t(qq * T::kBlockQ)) * p.doa.row_stride;
    if constexpr (kRowLoaders) {
      if (rows >= T::kBlockQ) {
        ldq.load_full(sQ0 + buf * T::kSmemQ, reinterpret_cast<const Elem*>(thr_src[0]) + oq);
        ldo.load_full(sO0 + buf * T::kSmemO, reinterpret_cast<const Elem*>(thr_src[1]) + oo);
      } else {
        ldq.load_partial(sQ0 + buf * T::kSmemQ, reinterpret_cast<const Elem*>(thr_src[0]) + oq,
                         reinterpret_cast<const Elem*>(thr_src[2]) + oq, rows, tid);
        ldo.load_partial(sO0 + buf * T::kSmemO, reinterpret_cast<const Elem*>(thr_src[1]) + oo,
                         reinterpret_cast<const Elem*>(thr_src[3]) + oo, rows, tid);
      }
    } else {
      load_tile_async<T::kBlockQ, T::kDqk, T::kThreads>(sQ0 + buf * T::kSmemQ,
                                                        reinterpret_cast<const Elem*>(thr_src[2]) + oq,
                                                        p.qa.row_stride, rows, p.head_dqk, tid);
      load_tile_async<T::kBlockQ, T::kDv, T::kThreads>(sO0 + buf * T::kSmemO,
                                                       reinterpret_cast<const Elem*>(thr_src[3]) + oo,
                                                       p.doa.row_stride, rows, p.head_dv, tid);
    }
  }
};

// Epilogues of a dK/dV work item (__forceinline__, state by reference: the kernel compiles as
// one body, scripts/sass_diff.sh). The warp's dK/dV tile: keys km0 + 16 mi + g + 8 hi, dK
// columns dk0 + 8 n + 2 t, dV columns dv0 + 8 n + 2 t (BwdTraitsSm80).
struct DkdvTileSm80 {
  int km0, dk0, dv0, keys_valid, g, t;
};

// A piece of a split task: its dK/dV partial sums (dK unscaled) added with fp32 atomics to
// accumulator slot `slot` [block_k, D] of the split schedule (bwd_split.cuh converts them).
template <class T>
__device__ __forceinline__ void dkdv_add_split_partial_sm80(const BwdParams& p, int slot, DkdvTileSm80 wt,
                                                            const float (&acc_dk)[T::kKMT][T::kNK][4],
                                                            const float (&acc_dv)[T::kKMT][T::kNV][4]) {
  float* dka = p.split.dk_accum + int64_t(slot) * T::kBlockK * p.head_dqk;
  float* dva = p.split.dv_accum + int64_t(slot) * T::kBlockK * p.head_dv;
#pragma unroll
  for (int mi = 0; mi < T::kKMT; ++mi) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int key = wt.km0 + 16 * mi + wt.g + 8 * hi;
      if (key < wt.keys_valid) {
#pragma unroll
        for (int n = 0; n < T::kNK; ++n) {
          const int col = wt.dk0 + n * 8 + 2 * wt.t;
          if (col < p.head_dqk) {
            atomic_add_f32x2(dka + int64_t(key) * p.head_dqk + col, acc_dk[mi][n][2 * hi], acc_dk[mi][n][2 * hi + 1]);
          }
        }
#pragma unroll
        for (int n = 0; n < T::kNV; ++n) {
          const int col = wt.dv0 + n * 8 + 2 * wt.t;
          if (col < p.head_dv) {
            atomic_add_f32x2(dva + int64_t(key) * p.head_dv + col, acc_dv[mi][n][2 * hi], acc_dv[mi][n][2 * hi + 1]);
          }
        }
      }
    }
  }
}

// A whole task: dK (times the softmax scale) and dV rows of key block rows krow.. of kv head
// hkv, sample b, in the input dtype; key blocks no query sees get zeros.
template <class T, class E, class Mask>
__device__ __forceinline__ void dkdv_store_sm80(const BwdParams& p, int b, int hkv, int64_t krow, DkdvTileSm80 wt,
                                                const float (&acc_dk)[T::kKMT][T::kNK][4],
                                                const float (&acc_dv)[T::kKMT][T::kNV][4], bool store_dk = true,
                                                bool store_dv = true) {
  using Elem = typename E::Storage;
  Elem* dk = Mask::template sample_ptr<Elem>(p, p.dk, kSdpaDK, b) + int64_t(Mask::batch(b)) * p.dka.batch_stride +
             krow * p.dka.row_stride + int64_t(hkv) * p.dka.head_stride;
  Elem* dv = Mask::template sample_ptr<Elem>(p, p.dv, kSdpaDV, b) + int64_t(Mask::batch(b)) * p.dva.batch_stride +
             krow * p.dva.row_stride + int64_t(hkv) * p.dva.head_stride;
#pragma unroll
  for (int mi = 0; mi < T::kKMT; ++mi) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int key = wt.km0 + 16 * mi + wt.g + 8 * hi;
      if (key < wt.keys_valid) {
#pragma unroll
        for (int n = 0; n < T::kNK; ++n) {
          const int col = wt.dk0 + n * 8 + 2 * wt.t;
          if (store_dk && col < p.head_dqk) {
            *reinterpret_cast<uint32_t*>(dk + int64_t(key) * p.dka.row_stride + col) =
                pack2<E>(acc_dk[mi][n][2 * hi] * p.scale, acc_dk[mi][n][2 * hi + 1] * p.scale);
          }
        }
#pragma unroll
        for (int n = 0; n < T::kNV; ++n) {
          const int col = wt.dv0 + n * 8 + 2 * wt.t;
          if (store_dv && col < p.head_dv) {
            *reinterpret_cast<uint32_t*>(dv + int64_t(key) * p.dva.row_stride + col) =
                pack2<E>(acc_dv[mi][n][2 * hi], acc_dv[mi][n][2 * hi + 1]);
          }
        }
      }
    }
  }
}

// The FP8 backward's part of a dK/dV work item (params.h SdpaFp8BwdParams, sdpa_fp8_bwd_dkdv_kernel_sm80
// below): dkdv_item's F8. NoFp8BwdSm80 (every other instantiation) compiles to nothing.
struct NoFp8BwdSm80 {
  static constexpr bool kOn = false;
};
struct Fp8BwdSm80 {
  static constexpr bool kOn = true;
  const SdpaFp8BwdParams& f;
  // A scalar of the pre-pass (params.h Fp8BwdDerived).
  __device__ __forceinline__ float d(int i) const { return __ldg(f.derived + i); }
};

// The warp's maximum of a non-negative value into amax (zeroed by the pre-pass): every lane calls it.
__device__ __forceinline__ void fp8_amax_flush(float* amax, float v, int lane) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (lane == 0) atomic_max_float(amax, v);
}

// The FP8 backward's dK / dV of a whole task (dkdv_store_sm80's rows and columns): dK = acc_dk descale_dP
// descale_q, dV = acc_dv descale_s descale_dO, their amaxes, stored fp8_grad(dX scale_dX) a byte at a time
// (the outputs' strides are any the validation allows). store_dk / store_dv: H_k != H_v's passes
// (SdpaScoreParams::dkdv_role: the dK pass over the K heads stores dK only, the dV pass over the V heads dV).
template <class T>
__device__ __forceinline__ void dkdv_store_fp8_sm80(const Fp8BwdSm80& f8, int b, int hkv, int64_t krow,
                                                    DkdvTileSm80 wt, const float (&acc_dk)[T::kKMT][T::kNK][4],
                                                    const float (&acc_dv)[T::kKMT][T::kNV][4], int head_dqk,
                                                    int head_dv, int lane, bool store_dk = true,
                                                    bool store_dv = true) {
  const SdpaFp8BwdParams& f = f8.f;
  const bool e5 = f.grad_format == 2;
  const float uk = f8.d(kF8dDkUnit), uv = f8.d(kF8dDvUnit), sk = f8.d(kF8dScaleDK), sv = f8.d(kF8dScaleDV);
  uint8_t* dk = static_cast<uint8_t*>(f.dk8.data) + int64_t(b) * f.dk8.batch_stride +
                int64_t(hkv) * f.dk8.head_stride + krow * f.dk8.row_stride;
  uint8_t* dv = static_cast<uint8_t*>(f.dv8.data) + int64_t(b) * f.dv8.batch_stride +
                int64_t(hkv) * f.dv8.head_stride + krow * f.dv8.row_stride;
  float mk = 0.0f, mv = 0.0f;
#pragma unroll
  for (int mi = 0; mi < T::kKMT; ++mi) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int key = wt.km0 + 16 * mi + wt.g + 8 * hi;
      if (key < wt.keys_valid) {
#pragma unroll
        for (int n = 0; n < T::kNK; ++n) {
          const int col = wt.dk0 + n * 8 + 2 * wt.t;  // col + 1 < head_dqk too (a multiple of 16)
          if (store_dk && col < head_dqk) {
            const float x0 = acc_dk[mi][n][2 * hi] * uk, x1 = acc_dk[mi][n][2 * hi + 1] * uk;
            mk = fmaxf(mk, fmaxf(fabsf(x0), fabsf(x1)));
            uint8_t* dst = dk + int64_t(key) * f.dk8.row_stride + col;
            dst[0] = uint8_t(fp8_soft_encode(x0 * sk, e5));
            dst[1] = uint8_t(fp8_soft_encode(x1 * sk, e5));
          }
        }
#pragma unroll
        for (int n = 0; n < T::kNV; ++n) {
          const int col = wt.dv0 + n * 8 + 2 * wt.t;
          if (store_dv && col < head_dv) {
            const float x0 = acc_dv[mi][n][2 * hi] * uv, x1 = acc_dv[mi][n][2 * hi + 1] * uv;
            mv = fmaxf(mv, fmaxf(fabsf(x0), fabsf(x1)));
            uint8_t* dst = dv + int64_t(key) * f.dv8.row_stride + col;
            dst[0] = uint8_t(fp8_soft_encode(x0 * sv, e5));
            dst[1] = uint8_t(fp8_soft_encode(x1 * sv, e5));
          }
        }
      }
    }
  }
  fp8_amax_flush(f.amax[kFp8AmaxDK], mk, lane);
  fp8_amax_flush(f.amax[kFp8AmaxDV], mv, lane);
}

// ---------------------------------------------------------------------------------------
// 2. dK/dV of one work item: pairs [begin, begin + count) of key block kb of kv head hkv of
// sample b (K2QWalk order). The accumulator slot is read at the end (kept out of registers
// during the walk): -1 without a split schedule, else the claimed item's (shared memory).
// slot < 0: the item is the whole task and writes dk/dv (dk scaled; zeros when no query sees
// the block). slot >= 0: a piece of a split task; its partial sums are added (fp32 atomics,
// unscaled) to accumulator slot `slot`.
// Shared memory: the item's first loads (K, V, Q/dO[0]) are issued before the loop's first
// __syncthreads, so the caller must __syncthreads between two items of one CTA.
// Warp tiles: BwdTraitsSm80 (S/dP, dK/dV and dQ phases each have their own 2-D layout).
// F8: Fp8BwdSm80 for the FP8 backward (with the features' Mask: P from the scores without score modifiers,
// S8 = fp8_q(P scale_s) stored as dV's operand, dS = P (dS_unit dP - D), dP = attn_scale dS with its amax,
// dP8 = fp8_dO(dP scale_dP) stored as dK's and dQ's operand, the FP8 epilogue), else NoFp8BwdSm80.
template <class T, class E, class Mask = PlanPayloadMaskBwdSm80<T>, class F8 = NoFp8BwdSm80>
__device__ __forceinline__ void dkdv_item(const BwdParams& p, uint8_t* smem, int kb, int hkv, int b, int begin,
                                          int count, const F8& f8 = F8{}) {
  static_assert(!F8::kOn || Mask::kFeatures, "the FP8 backward runs the features' loop (P stored before dP)");
  using Elem = typename E::Storage;
  static_assert(E::kBits == 16, "the sm80 loaders and ldmatrix move 16-bit elements");
  const uint32_t sK = smem_u32(smem);
  const uint32_t sV = sK + T::kSmemK;
  const uint32_t sQ0 = sV + T::kSmemV;                // Q[2]
  const uint32_t sO0 = sQ0 + 2 * T::kSmemQ;           // dO[2]
  const uint32_t sP = sO0 + 2 * T::kSmemO;
  const uint32_t sdS = sP + T::kSmemP;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;

  const typename Mask::Seqlen sl(p, b);
  const int q_start = sl.q_start, len_q = sl.len_q, k_start = sl.k_start, len_k = sl.len_k;
  const int key0 = kb * T::kBlockK;
  const int keys_valid = min(T::kBlockK, len_k - key0);
  const int keys_store = Mask::rows_store(p, kSdpaDK, key0, T::kBlockK, keys_valid, sl);
  if (Mask::kAnalytic && keys_store <= 0) return;  // a ragged dK/dV's block past the sample
  const int64_t krow = int64_t(Mask::row0(p, k_start)) + key0;
  const int64_t qrow_base = Mask::row0(p, q_start);

  // K and V heads of the tiles: the work item's head, but with H_k != H_v (SDPA's two passes,
  // dkdv_role) the other tensor's head follows the walk's query head (tile_head: the one loaded).
  // The reload's state stays in local memory (volatile: read back only when a head changes),
  // out of the loop's registers: the source rows (key row krow, head 0) and the loaded head.
  int hk_tile = hkv, hv_tile = hkv;
  struct ReloadState {
    volatile uintptr_t src;
    volatile int head;
  };
  struct NoReload {};
  [[maybe_unused]] std::conditional_t<Mask::kFeatures, ReloadState, NoReload> rl;  // (plan, mask only: nothing)
  if constexpr (Mask::kFeatures) {
    rl.src = 0;
    rl.head = -1;
    const SdpaScoreParams& sc = analytic_of(p).score;
    const int h0 = hkv * Mask::group(p);  // the walk's first query head
    if (sc.dkdv_role == 1) {
      hv_tile = h0 / sc.group_v;
      rl.head = hv_tile;
      rl.src = reinterpret_cast<uintptr_t>(
          row_ptr<Elem>(Mask::template sample_ptr<const Elem>(p, p.v, kSdpaV, b), p.va, 0, krow, 0));
    }
    if (sc.dkdv_role == 2) {
      hk_tile = h0 / p.group_size;
      rl.head = hk_tile;
      rl.src = reinterpret_cast<uintptr_t>(
          row_ptr<Elem>(Mask::template sample_ptr<const Elem>(p, p.k, kSdpaK, b), p.ka, 0, krow, 0));
    }
  }
  load_tile_async<T::kBlockK, T::kDqk, T::kThreads>(
      sK, row_ptr<Elem>(Mask::template sample_ptr<const Elem>(p, p.k, kSdpaK, b), p.ka, Mask::batch(b), krow, hk_tile),
      p.ka.row_stride, keys_valid, p.head_dqk, tid);
  load_tile_async<T::kBlockK, T::kDv, T::kThreads>(
      sV, row_ptr<Elem>(Mask::template sample_ptr<const Elem>(p, p.v, kSdpaV, b), p.va, Mask::batch(b), krow, hv_tile),
      p.va.row_stride, keys_valid, p.head_dv, tid);

  auto walk = Mask::k2q(p, sl, hkv, b, kb, count, begin);
  const auto mask = Mask::dkdv_item(sl, kb);
  int h = 0, qb = 0, payload = -1;
  bool have = walk.next(h, qb, payload);
  BwdQdoLoaderSm80<T, Elem> qdo;
  qdo.template init<Mask>(p, b, qrow_base, tid);
  if (have) qdo.load(p, sQ0, sO0, 0, h, qb, len_q, tid);
  cp_async_commit();

  constexpr int kKMT = T::kKMT;
  float acc_dk[kKMT][T::kNK][4], acc_dv[kKMT][T::kNV][4];
  zero_acc(acc_dk);
  zero_acc(acc_dv);

  // S/dP warp tile: query rows sm0 .. sm0 + 16 kSMT - 1, keys sc0 .. sc0 + 8 kSNT - 1.
  const int sm0 = (warp / T::kSWN) * (16 * T::kSMT);
  const int sc0 = (warp % T::kSWN) * (8 * T::kSNT);
  // dK/dV warp tile: keys km0 .. km0 + 16 kKMT - 1; dK columns dk0 .., dV columns dv0 ..
  const int km0 = (warp / T::kKWN) * (16 * kKMT);
  const int dk0 = (warp % T::kKWN) * (8 * T::kNK), dv0 = (warp % T::kKWN) * (8 * T::kNV);
  // dQ warp tile: query rows qm0 .., columns dq0 + pass * Dqk / kQPass ..
  const int qm0 = (warp / T::kQWN) * (16 * T::kQMT);
  const int dq0 = (warp % T::kQWN) * (8 * T::kNQA);
  // Workspace index of the thread's first S/dP row (row sm0 + g of a block) relative to the
  // block's first row of head 0.
  const int stat_thr = q_start + sm0 + g;
  // Fragment addresses (tile_io.cuh, LdsmAddr); those of the Q/dO buffers and the ones used
  // once per iteration are in addr_tab below.
  const LdsmAddr<T::kDqk> bK = ldsm_b_nk<T::kDqk>(sK + sc0 * T::kDqk * 2, lane);
  const LdsmAddr<T::kDv> bV = ldsm_b_nk<T::kDv>(sV + sc0 * T::kDv * 2, lane);
  const LdsmAddr<T::kBlockK> aP = ldsm_a_trans<T::kBlockK>(sP, lane, km0 / 8);
  const LdsmAddr<T::kBlockK> adS = ldsm_a_trans<T::kBlockK>(sdS, lane, km0 / 8);
  // Shared-memory addresses used once per iteration, computed once and read back per
  // iteration from a per-thread local-memory table (one 16-byte load each; the table is
  // indexed by the run-time buffer, so it stays in local memory): the loop has no registers
  // to keep them in, and ptxas would otherwise re-derive them from tid (several integer
  // instructions per address). addr_tab[buf]: [0] aQ, [1] aO (S/dP phase), [2] bQ, [3] bO
  // (dK/dV phase) of Q/dO buffer buf; loop invariants, in both rows: [4] the P/dS store
  // offsets (ps_off), [5] aS and [6] bKq (pass 0) of the dQ phase.
  static_assert(T::kQPass == 1 || (T::kDqk / T::kQPass) % 64 == 0, "dQ passes shift bKq by whole 8-chunk groups");
  uint4 addr_tab[2][7];
#pragma unroll
  for (int bb = 0; bb < 2; ++bb) {
    addr_tab[bb][0] = ldsm_a<T::kDqk>(sQ0 + bb * T::kSmemQ + sm0 * T::kDqk * 2, lane).pack();
    addr_tab[bb][1] = ldsm_a<T::kDv>(sO0 + bb * T::kSmemO + sm0 * T::kDv * 2, lane).pack();
    addr_tab[bb][2] = ldsm_b_kn<T::kDqk>(sQ0 + bb * T::kSmemQ, lane, dk0 / 8).pack();
    addr_tab[bb][3] = ldsm_b_kn<T::kDv>(sO0 + bb * T::kSmemO, lane, dv0 / 8).pack();
    // P/dS byte offset of the thread's pair (row sm0 + g, n8 block n of the warp tile); rows
    // 16 mi + 8 hi further keep the swizzle (multiples of 8).
    uint32_t ps[4];
#pragma unroll
    for (int n = 0; n < 4; ++n) ps[n] = uint32_t(swz_offset<T::kBlockK>(sm0 + g, (sc0 >> 3) + n) + 2 * t) * 2;
    addr_tab[bb][4] = make_uint4(ps[0], ps[1], ps[2], ps[3]);
    addr_tab[bb][5] = ldsm_a<T::kBlockK>(sdS + qm0 * T::kBlockK * 2, lane).pack();
    addr_tab[bb][6] = ldsm_b_kn<T::kDqk>(sK, lane, dq0 / 8).pack();
  }
  int buf = 0;
  [[maybe_unused]] float amax_dp = 0.0f;  // FP8: the thread's max |dP|

  while (have) {
    cp_async_wait<0>();
    __syncthreads();  // Q/dO[buf] (and K, V) visible; the previous block's dK/dV and dQ phases are done
    if constexpr (Mask::kFeatures) {
      // H_k != H_v: this query head's V (dK pass) or K (dV pass) tile, when it changes; nobody
      // reads the tiles between the barrier above and the one here.
      const SdpaScoreParams& sc = analytic_of(p).score;
      if (sc.dkdv_role != 0) {
        const int need = sc.dkdv_role == 1 ? h / sc.group_v : h / p.group_size;
        if (need != rl.head) {
          rl.head = need;
          const Elem* src = reinterpret_cast<const Elem*>(rl.src);
          const int rows = min(T::kBlockK, len_k - kb * T::kBlockK);
          if (sc.dkdv_role == 1) {
            load_tile_async<T::kBlockK, T::kDv, T::kThreads>(sV, src + int64_t(need) * p.va.head_stride,
                                                             p.va.row_stride, rows, p.head_dv, tid);
          } else {
            load_tile_async<T::kBlockK, T::kDqk, T::kThreads>(sK, src + int64_t(need) * p.ka.head_stride,
                                                              p.ka.row_stride, rows, p.head_dqk, tid);
          }
          cp_async_commit();
          cp_async_wait<0>();
          __syncthreads();
        }
      }
    }
    int h_next = 0, qb_next = 0, payload_next = -1;
    const bool have_next = walk.next(h_next, qb_next, payload_next);
    if (have_next) qdo.load(p, sQ0, sO0, buf ^ 1, h_next, qb_next, len_q, tid);
    cp_async_commit();

    // ---- S/dP phase: S = Q K^T -> P, then dP = dO V^T -> dS; P and dS to smem, for the warp
    // tile. P replaces S in the same registers before the dP GEMM starts (its exp2 can issue
    // among the dP mma; no shared store sits between the two GEMMs), and the dP
    // accumulators start at -D (the first k16 step's C operand; dS = P (dP - D) = P * acc),
    // so no row statistic stays live through the dP GEMM, where registers are scarcest (dK/dV
    // sums + P + dP). The row statistics are loaded first so their latency hides behind the
    // S GEMM. Workspace row of the block's first query row (head h); rows past len_q (a partial
    // last block) get the fills.
    const int64_t ws_row = int64_t(uint32_t(h)) * p.total_q + uint32_t(qb * T::kBlockQ);
    const int q_left = len_q - qb * T::kBlockQ;  // valid rows of the block (>= 1)
    float lse2[T::kSMT][2], delta[T::kSMT][2];
    auto load_stat = [&](float (&dst)[T::kSMT][2], const float* src, float fill) {
      const float* src_thr = pin(src + (ws_row + stat_thr));
#pragma unroll
      for (int mi = 0; mi < T::kSMT; ++mi) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          const int r = 16 * mi + 8 * hi;
          dst[mi][hi] = r < q_left - sm0 - g ? __ldg(src_thr + r) : fill;
        }
      }
    };
    // P/dS shared-memory byte offset of the thread's pair (row sm0 + g + 16 mi + 8 hi, n8 block n).
    static_assert(T::kSNT == 4, "addr_tab[][4] holds four n8 blocks");
    auto ps_off = [&](int mi, int n, int hi) {
      const uint4 ps = addr_tab[buf][4];
      return (n == 0 ? ps.x : n == 1 ? ps.y : n == 2 ? ps.z : ps.w) + uint32_t((16 * mi + 8 * hi) * T::kBlockK * 2);
    };
    float s[T::kSMT][T::kSNT][4];
    load_stat(lse2, p.lse2, INFINITY);
    load_stat(delta, p.delta, 0.0f);
    zero_acc(s);
    {
      const LdsmAddr<T::kDqk> aQ = LdsmAddr<T::kDqk>::unpack(addr_tab[buf][0]);
#pragma unroll
      for (int kk = 0; kk < T::kDqk / 16; ++kk) {
        if (T::kExact || kk * 16 < p.head_dqk) {
          warp_mma_k16<T::kSMT, T::kSNT, false, false, true, E>(s, aQ, bK, kk, 0);
        }
      }
    }
    // P = exp2(S scale log2(e) - lse2), the scaling and the subtraction as one fma (the mask
    // sets -inf after it: exp2(-inf) = 0 as before; an empty row's lse2 = +inf gives -inf too).
    if constexpr (F8::kOn) {
      // FP8: P = exp2(s kF8dQkScaleLog2 - lse2) stays in s (dS's factor); S8 = fp8_q(P scale_s), an FP8 value
      // and so a bf16 one, to shared memory as dV's operand.
      const float qk = f8.d(kF8dQkScaleLog2), ss = f8.d(kF8dScaleS);
      const bool e5 = f8.f.format == 2;
#pragma unroll
      for (int mi = 0; mi < T::kSMT; ++mi) {
#pragma unroll
        for (int n = 0; n < T::kSNT; ++n) {
#pragma unroll
          for (int i = 0; i < 4; ++i) s[mi][n][i] = fmaf(s[mi][n][i], qk, -lse2[mi][i >> 1]);
        }
        mask.template apply<T::kSNT>(p, s[mi], payload, qb, kb, sm0 / 16 + mi, sc0, lane);
#pragma unroll
        for (int n = 0; n < T::kSNT; ++n) {
#pragma unroll
          for (int hi = 0; hi < 2; ++hi) {
            const float p0 = exp2_approx(s[mi][n][2 * hi]), p1 = exp2_approx(s[mi][n][2 * hi + 1]);
            s[mi][n][2 * hi] = p0;
            s[mi][n][2 * hi + 1] = p1;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + ps_off(mi, n, hi)),
                         "r"(pack2<E>(fp8_soft_round(p0 * ss, e5), fp8_soft_round(p1 * ss, e5)))
                         : "memory");
          }
        }
      }
    } else if constexpr (Mask::kFeatures) {
      // SDPA: the score modifiers, then P to shared memory now and s = P d logit / d x (the
      // factor of dS, softcap's derivative; P without softcap).
      const SdpaScoreMod mod = SdpaScoreMod::make(analytic_of(p).score, h);
      const char* bias_head = SdpaBiasFrag::head_base(analytic_of(p).bias, b, h);
#pragma unroll
      for (int mi = 0; mi < T::kSMT; ++mi) {
        const int base = mask.diag(p, qb, kb, sm0 / 16 + mi, sc0);
        sdpa_bwd_logits<T::kSNT>(p, s[mi], lse2[mi], mod, base, lane);
        mask.template apply<T::kSNT>(p, s[mi], payload, qb, kb, sm0 / 16 + mi, sc0, lane);
        // The additive bias on the visible elements (after the mask: never read where it is -inf).
        const SdpaBiasFrag bias = SdpaBiasFrag::at(analytic_of(p).bias, bias_head,
                                                   int64_t(qb) * T::kBlockQ + sm0 + 16 * mi,
                                                   int64_t(kb) * T::kBlockK + sc0, lane);
        bias.add<T::kSNT>(s[mi]);
        // dBias together with softcap (sdpa_dbias_softcap_sm80_enabled, on by default): dBias's dS is P (dP - D),
        // before softcap's factor 1 - t^2 (the bias is added after softcap), but s holds P (1 - t^2) from
        // probs_dlogit on. So the fp32 P of the sample's elements goes to the thread's own elements of the dS
        // workspace now, and the dS step multiplies it there by dP - D (the factor is never divided out: t^2 -> 1
        // for large logits). Through memory rather than registers (an fp32 P kept in registers cost 72-124 B of
        // spills, PERF_LOG v2.35); not in the dV pass, as the dS step's stores.
        if (Mask::kDsBeforeSoftcap && analytic_of(p).bias.ds != nullptr && mod.c2 != 0.0f &&
            analytic_of(p).score.dkdv_role != 2) {
          const AnalyticMaskParams& am = analytic_of(p);
          const int row = qb * T::kBlockQ + sm0 + 16 * mi + g, col = kb * T::kBlockK + sc0 + 2 * t;
          float* p_thr = am.bias.ds + ((int64_t(b) * p.num_heads_q + h) * am.max_q + row) * am.bias.ds_ld + col;
#pragma unroll
          for (int n = 0; n < T::kSNT; ++n) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
              const int rr = 8 * hi, cc = 8 * n;  // from the element (row, col)
              if (rr < len_q - row && cc < len_k - col) {
                float* dst = p_thr + int64_t(rr) * am.bias.ds_ld + cc;
                const float p0 = exp2_approx(s[mi][n][2 * hi]);
                if (cc + 1 < len_k - col) {
                  *reinterpret_cast<float2*>(dst) = make_float2(p0, exp2_approx(s[mi][n][2 * hi + 1]));
                } else {
                  *dst = p0;
                }
              }
            }
          }
        }
        const SdpaDropoutParams& dpp = analytic_of(p).dropout;
        if (dpp.mode == 0) {
#pragma unroll
          for (int n = 0; n < T::kSNT; ++n) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + ps_off(mi, n, hi)),
                           "r"(pack2<E>(exp2_approx(s[mi][n][2 * hi]), exp2_approx(s[mi][n][2 * hi + 1])))
                           : "memory");
            }
          }
        } else {
          // Dropout: dV takes P times the multiplier (pairs stored at odd r).
          float p_even = 0.0f;
          sdpa_dropout_apply<T::kSNT>(dpp, b, h, p.num_heads_q, int64_t(qb) * T::kBlockQ + sm0 + 16 * mi + g,
                                      int64_t(kb) * T::kBlockK + sc0 + 2 * t, len_q, len_k, [&](int n, int r, float m) {
                                        const float pm = exp2_approx(s[mi][n][r]) * m;
                                        if ((r & 1) == 0) {
                                          p_even = pm;
                                        } else {
                                          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + ps_off(mi, n, r >> 1)),
                                                       "r"(pack2<E>(p_even, pm))
                                                       : "memory");
                                        }
                                      });
        }
        mod.probs_dlogit<T::kSNT>(s[mi], lse2[mi], base, lane, bias);
      }
    } else {
#pragma unroll
      for (int mi = 0; mi < T::kSMT; ++mi) {
#pragma unroll
        for (int n = 0; n < T::kSNT; ++n) {
#pragma unroll
          for (int i = 0; i < 4; ++i) s[mi][n][i] = fmaf(s[mi][n][i], p.scale_log2, -lse2[mi][i >> 1]);
        }
        mask.template apply<T::kSNT>(p, s[mi], payload, qb, kb, sm0 / 16 + mi, sc0, lane);
#pragma unroll
        for (int n = 0; n < T::kSNT; ++n) {
#pragma unroll
          for (int i = 0; i < 4; ++i) s[mi][n][i] = exp2_approx(s[mi][n][i]);  // P
        }
      }
    }
    float dp[T::kSMT][T::kSNT][4];
    {
      float minus_d[T::kSMT][4];  // the C operand of the first k16 step
      // SDPA dropout: dP alone (dS = P (m dP - D) after the GEMM, D read again there).
      bool no_d = false;
      if constexpr (Mask::kFeatures) no_d = analytic_of(p).dropout.mode != 0;
      if constexpr (F8::kOn) no_d = true;  // FP8: dS - D formed after the GEMM, in true units
#pragma unroll
      for (int mi = 0; mi < T::kSMT; ++mi) {
#pragma unroll
        for (int i = 0; i < 4; ++i) minus_d[mi][i] = no_d ? 0.0f : -delta[mi][i >> 1];
      }
      const LdsmAddr<T::kDv> aO = LdsmAddr<T::kDv>::unpack(addr_tab[buf][1]);
      warp_mma_k16_first<T::kSMT, T::kSNT, E>(dp, minus_d, aO, bV);  // k16 step 0 (head_dv >= 1)
#pragma unroll
      for (int kk = 1; kk < T::kDv / 16; ++kk) {
        if (T::kExact || kk * 16 < p.head_dv) {
          warp_mma_k16<T::kSMT, T::kSNT, false, false, true, E>(dp, aO, bV, kk, 0);
        }
      }
    }
    // dBias (SDPA): the thread's element (row sm0 + g, column sc0 + 2t) of the tile in the dS workspace
    // (null: no dBias, or the dV pass), and the rows / columns left inside the sample from it.
    [[maybe_unused]] float* ds_thr = nullptr;
    [[maybe_unused]] int ds_rows = 0, ds_cols = 0;
    if constexpr (Mask::kFeatures) {
      const AnalyticMaskParams& am = analytic_of(p);
      if (am.bias.ds != nullptr && am.score.dkdv_role != 2) {
        const int row = qb * T::kBlockQ + sm0 + g, col = kb * T::kBlockK + sc0 + 2 * t;
        ds_thr = am.bias.ds + ((int64_t(b) * p.num_heads_q + h) * am.max_q + row) * am.bias.ds_ld + col;
        ds_rows = len_q - row;
        ds_cols = len_k - col;
      }
    }
    if constexpr (F8::kOn) {
      // FP8: dp holds dO . v of the raw codes; dS - D = kF8dDsUnit dp - D (D in true units, the pre-pass's).
      float dd[T::kSMT][2];
      load_stat(dd, p.delta, 0.0f);
      const float du = f8.d(kF8dDsUnit);
#pragma unroll
      for (int mi = 0; mi < T::kSMT; ++mi) {
#pragma unroll
        for (int n = 0; n < T::kSNT; ++n) {
#pragma unroll
          for (int i = 0; i < 4; ++i) dp[mi][n][i] = fmaf(du, dp[mi][n][i], -dd[mi][i >> 1]);
        }
      }
    } else if constexpr (Mask::kFeatures) {
      // SDPA dropout: dp holds dP (no -D seed); dS = P (m dP - D) with the element's multiplier m.
      const SdpaDropoutParams& dpp = analytic_of(p).dropout;
      if (dpp.mode != 0) {
        float dd[T::kSMT][2];
        load_stat(dd, p.delta, 0.0f);
#pragma unroll
        for (int mi = 0; mi < T::kSMT; ++mi) {
          sdpa_dropout_apply<T::kSNT>(dpp, b, h, p.num_heads_q, int64_t(qb) * T::kBlockQ + sm0 + 16 * mi + g,
                                      int64_t(kb) * T::kBlockK + sc0 + 2 * t, len_q, len_k, [&](int n, int r, float m) {
                                        dp[mi][n][r] = fmaf(m, dp[mi][n][r], -dd[mi][r >> 1]);
                                      });
        }
      }
    }
    [[maybe_unused]] float f8_attn = 0.0f, f8_sdp = 0.0f;
    [[maybe_unused]] bool f8_e5 = false;
    if constexpr (F8::kOn) {
      f8_attn = f8.d(kF8dAttnScale);
      f8_sdp = f8.d(kF8dScaleDP);
      f8_e5 = f8.f.do_format == 2;
    }
#pragma unroll
    for (int mi = 0; mi < T::kSMT; ++mi) {
#pragma unroll
      for (int n = 0; n < T::kSNT; ++n) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
          float ds0 = s[mi][n][2 * hi] * dp[mi][n][2 * hi];  // P (dP - D)
          float ds1 = s[mi][n][2 * hi + 1] * dp[mi][n][2 * hi + 1];
          if constexpr (F8::kOn) {
            // FP8: dP = attn_scale P (dS - D) (the gradient of the scores), its amax, and dP8 = fp8_dO(dP
            // scale_dP) as dK's and dQ's operand (the epilogues apply descale_dP).
            const float x0 = f8_attn * ds0, x1 = f8_attn * ds1;
            amax_dp = fmaxf(amax_dp, fmaxf(fabsf(x0), fabsf(x1)));
            ds0 = fp8_soft_round(x0 * f8_sdp, f8_e5);
            ds1 = fp8_soft_round(x1 * f8_sdp, f8_e5);
          }
          if constexpr (!Mask::kFeatures) {  // (SDPA's features stored P before the dP GEMM)
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sP + ps_off(mi, n, hi)),
                         "r"(pack2<E>(s[mi][n][2 * hi], s[mi][n][2 * hi + 1]))
                         : "memory");
          }
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + ps_off(mi, n, hi)), "r"(pack2<E>(ds0, ds1))
                       : "memory");
          if constexpr (Mask::kFeatures) {
            // dBias: dS = P (dP - D) of the sample's elements into the fp32 workspace (SdpaBiasParams::ds;
            // s is P here without softcap), once per element (not in the dV pass). With softcap (experimental)
            // the workspace holds the element's P from the logits step: P (dP - D) from it, dp being dP - D.
            if (ds_thr != nullptr) {
              const int rr = 16 * mi + 8 * hi, cc = 8 * n;  // from the thread's element (row sm0 + g, column sc0 + 2t)
              if (rr < ds_rows && cc < ds_cols) {
                float* dst = ds_thr + int64_t(rr) * analytic_of(p).bias.ds_ld + cc;
                const bool softcap = Mask::kDsBeforeSoftcap && analytic_of(p).score.softcap2 != 0.0f;
                if (cc + 1 < ds_cols) {
                  float2 v = make_float2(ds0, ds1);
                  if (softcap) {
                    const float2 pr = *reinterpret_cast<const float2*>(dst);
                    v = make_float2(pr.x * dp[mi][n][2 * hi], pr.y * dp[mi][n][2 * hi + 1]);
                  }
                  *reinterpret_cast<float2*>(dst) = v;
                } else {
                  *dst = softcap ? *dst * dp[mi][n][2 * hi] : ds0;
                }
              }
            }
          }
        }
      }
    }
    __syncthreads();  // P, dS complete

    // ---- dK/dV phase: dV += P^T dO, dK += dS^T Q for keys km0.. of the block.
    {
      // (Warps whose columns all lie past a run-time head dim skip a GEMM whole.)
      if (T::kExact || dv0 < p.head_dv) {
        const LdsmAddr<T::kDv> bO = LdsmAddr<T::kDv>::unpack(addr_tab[buf][3]);
#pragma unroll
        for (int kk = 0; kk < T::kBlockQ / 16; ++kk) {
          warp_mma_k16<kKMT, T::kNV, true, true, T::kExact, E>(acc_dv, aP, bO, kk, p.head_dv - dv0);
        }
      }
      if (T::kExact || dk0 < p.head_dqk) {
        const LdsmAddr<T::kDqk> bQ = LdsmAddr<T::kDqk>::unpack(addr_tab[buf][2]);
#pragma unroll
        for (int kk = 0; kk < T::kBlockQ / 16; ++kk) {
          warp_mma_k16<kKMT, T::kNK, true, true, T::kExact, E>(acc_dk, adS, bQ, kk, p.head_dqk - dk0);
        }
      }
    }
    bool add_dq = !p.deterministic;
    if constexpr (Mask::kFeatures) add_dq = add_dq && analytic_of(p).score.dkdv_role != 2;  // once per dQ
    if (add_dq) {
      // ---- dQ phase (atomic path): dQ[q] += dS K over this key block, added in fp32 to the
      // workspace accumulator.
      const LdsmAddr<T::kBlockK> aS = LdsmAddr<T::kBlockK>::unpack(addr_tab[buf][5]);
      // dq_accum row stride (a compile-time constant when exact) and the thread's element
      // (row qm0 + g, column dq0 + 2t) of the block's first row.
      const int dq_stride = T::kExact ? T::kDqk : p.head_dqk;
      float* const dq_thr = pin(p.dq_accum + (ws_row + (q_start + qm0 + g)) * dq_stride + (dq0 + 2 * t));
#pragma unroll
      for (int pass = 0; pass < T::kQPass; ++pass) {
        const int c0 = pass * (T::kDqk / T::kQPass) + dq0;
        if (T::kExact || c0 < p.head_dqk) {
          float acc_q[T::kQMT][T::kNQA][4];
          zero_acc(acc_q);
          LdsmAddr<T::kDqk> bKq = LdsmAddr<T::kDqk>::unpack(addr_tab[buf][6]);  // c0 / 8 = dq0 / 8 + 8k chunks:
#pragma unroll
          for (int j = 0; j < 4; ++j) bKq.sw[j] += uint32_t(pass * (T::kDqk / T::kQPass) * 2);  // + 16 B per chunk
#pragma unroll
          for (int kk = 0; kk < T::kBlockK / 16; ++kk) {
            warp_mma_k16<T::kQMT, T::kNQA, false, true, T::kExact, E>(acc_q, aS, bKq, kk, p.head_dqk - c0);
          }
#pragma unroll
          for (int mi = 0; mi < T::kQMT; ++mi) {
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
              const int rr = 16 * mi + 8 * hi;  // row qm0 + g + rr of the block
              if (rr < q_left - qm0 - g) {
                float* dst = dq_thr + int64_t(rr) * dq_stride;
#pragma unroll
                for (int n = 0; n < T::kNQA; ++n) {
                  const int col = c0 + n * 8 + 2 * t;
                  if (T::kExact || col < p.head_dqk) {
                    red_add_f32x2(dst + (pass * (T::kDqk / T::kQPass) + n * 8), acc_q[mi][n][2 * hi],
                                  acc_q[mi][n][2 * hi + 1]);
                  }
                }
              }
            }
          }
        }
      }
    }
    h = h_next;
    qb = qb_next;
    payload = payload_next;
    have = have_next;
    buf ^= 1;
  }
  cp_async_wait<0>();

  const DkdvTileSm80 wt{km0, dk0, dv0, keys_store, g, t};
  if constexpr (F8::kOn) {
    // FP8 (one CTA per task, no split schedule): the FP8 dK / dV (H_k != H_v: the pass's tensor), then every
    // amax of this CTA (a pass that stores nothing of a tensor adds 0 to its amax).
    const int role = analytic_of(p).score.dkdv_role;
    dkdv_store_fp8_sm80<T>(f8, b, hkv, krow, wt, acc_dk, acc_dv, p.head_dqk, p.head_dv, lane, role != 2, role != 1);
    fp8_amax_flush(f8.f.amax[kFp8AmaxDP], amax_dp, lane);
    return;
  }
  const int slot = !p.split_schedule ? -1 : reinterpret_cast<const int32_t*>(smem + T::kSmemItem)[3];
  if (slot >= 0) {
    dkdv_add_split_partial_sm80<T>(p, slot, wt, acc_dk, acc_dv);
    return;
  }
  if constexpr (Mask::kFeatures) {
    const int role = analytic_of(p).score.dkdv_role;
    dkdv_store_sm80<T, E, Mask>(p, b, hkv, krow, wt, acc_dk, acc_dv, role != 2, role != 1);
  } else {
    dkdv_store_sm80<T, E, Mask>(p, b, hkv, krow, wt, acc_dk, acc_dv);
  }
}

// dK/dV kernel. Without a split schedule (deterministic path, grid mode): one CTA per task
// (or per (key block, kv head) cell in grid mode), the whole K2Q walk, direct writes.
// With one (p.split_schedule): a persistent grid; each CTA claims items in list order with an
// atomic counter until the list is exhausted (items of long tasks come first).
template <class T, class E>
__global__ void __launch_bounds__(T::kThreads) flex_bwd_dkdv_kernel_sm80(const BwdParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  int32_t* s_item = reinterpret_cast<int32_t*>(smem + T::kSmemItem);
  for (int round = 0;; ++round) {
    int kb, hkv, b, begin = 0, count = 0x7fffffff;
    if (!p.split_schedule) {
      if (round > 0) return;
      if (p.grid_mode) {
        // Folded grid (grid.h): CTA = kv head * NKB + global key block.
        const GridCell cell = unfold_2d(blockIdx.x, int(p.view.num_k_blocks));
        const int gk = cell.x;
        hkv = cell.y;
        b = find_block_owner(p.view.k_block_start, p.batch, gk);
        kb = gk - __ldg(p.view.k_block_start + b);
      } else {
        const Task task = load_task(p.view.tasks, blockIdx.x);
        kb = task.block;
        hkv = task.head;
        b = task.batch;
      }
    } else {
      const int task_index = claim_split_item(p.split, s_item);
      if (task_index < 0) return;
      begin = s_item[1];
      count = s_item[2] - begin;
      const Task task = load_task(p.view.tasks, task_index);
      kb = task.block;
      hkv = task.head;
      b = task.batch;
    }
    dkdv_item<T, E>(p, smem, kb, hkv, b, begin, count);
  }
}

// K/V loader of the dQ kernel (role: loads): the thread's chunk offsets once; per tile one
// base offset, a full block through load_full, the sample's partial last block through
// load_partial (row checks). gk_thr/gv_thr: row 0 of the sample, kv head hkv, plus the
// thread's chunk offset.
template <class T, class Elem>
struct BwdKvLoaderSm80 {
  using KvAddr = ContiguousKv;  // the K/V address role (kv_addr.cuh)
  using LoaderK = TileRowLoader8<T::kBlockK, T::kDqk, T::kThreadsQ>;
  using LoaderV = TileRowLoader8<T::kBlockK, T::kDv, T::kThreadsQ>;
  static_assert(LoaderK::kApplies && LoaderV::kApplies);
  LoaderK ldk;
  LoaderV ldv;
  const Elem* gk_thr;
  const Elem* gv_thr;

  // Mask: the backward mask policy (its sample_ptr / batch hooks address sample b).
  template <class Mask>
  __device__ __forceinline__ void init(const BwdParams& p, int b, int64_t krow_base, int hkv, int hv, int tid) {
    ldk.init(p.ka.row_stride, T::kExact ? T::kDqk : p.head_dqk, tid);
    ldv.init(p.va.row_stride, T::kExact ? T::kDv : p.head_dv, tid);
    gk_thr = row_ptr<Elem>(Mask::template sample_ptr<const Elem>(p, p.k, kSdpaK, b), p.ka, Mask::batch(b), krow_base,
                           hkv) +
             ldk.offset();
    gv_thr = row_ptr<Elem>(Mask::template sample_ptr<const Elem>(p, p.v, kSdpaV, b), p.va, Mask::batch(b), krow_base,
                           hv) +
             ldv.offset();
  }
  // Key block kbb into K/V buffer buf (sK0/sV0: buffer 0).
  __device__ __forceinline__ void load(const BwdParams& p, uint32_t sK0, uint32_t sV0, int buf, int kbb, int len_k,
                                       int tid) const {
    const int rows = len_k - kbb * T::kBlockK;
    // Element offsets of key block kbb from row 0 (non-negative).
    const int64_t off_k = KvAddr::block_offset_nonneg<T::kBlockK>(p.ka, kbb);
    const int64_t off_v = KvAddr::block_offset_nonneg<T::kBlockK>(p.va, kbb);
    if (rows >= T::kBlockK) {
      ldk.load_full(sK0 + buf * T::kSmemK, gk_thr + off_k);
      ldv.load_full(sV0 + buf * T::kSmemV, gv_thr + off_v);
    } else {
      ldk.load_partial(sK0 + buf * T::kSmemK, gk_thr + off_k, rows, tid);
      ldv.load_partial(sV0 + buf * T::kSmemV, gv_thr + off_v, rows, tid);
    }
  }
};

// Epilogue of the dQ kernel: dQ (times the softmax scale) of the warp's rows r0 and r0 + 8
// of the block (query rows qrow.. of head h, sample b) in the input dtype, columns 8 n + 2 t.
template <class T, class E, class Mask>
__device__ __forceinline__ void dq_store_sm80(const BwdParams& p, int b, int h, int64_t qrow, int rows_valid, int r0,
                                              int t, const float (&acc)[T::kNQ][4]) {
  using Elem = typename E::Storage;
  Elem* dq = Mask::template sample_ptr<Elem>(p, p.dq, kSdpaDQ, b) + int64_t(Mask::batch(b)) * p.dqa.batch_stride +
             qrow * p.dqa.row_stride + int64_t(h) * p.dqa.head_stride;
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int row = r0 + 8 * hi;
    if (row < rows_valid) {
#pragma unroll
      for (int n = 0; n < T::kNQ; ++n) {
        const int col = n * 8 + 2 * t;
        if (col < p.head_dqk) {
          *reinterpret_cast<uint32_t*>(dq + int64_t(row) * p.dqa.row_stride + col) =
              pack2<E>(acc[n][2 * hi] * p.scale, acc[n][2 * hi + 1] * p.scale);
        }
      }
    }
  }
}

// The FP8 backward's dQ of the deterministic kernel (dq_store_sm80's rows and columns): dQ = acc descale_dP
// descale_k, its amax, stored fp8_grad(dQ scale_dQ) a byte at a time.
template <class T>
__device__ __forceinline__ void dq_store_fp8_sm80(const Fp8BwdSm80& f8, int b, int h, int64_t qrow, int rows_valid,
                                                  int r0, int t, const float (&acc)[T::kNQ][4], int head_dqk,
                                                  int lane) {
  const SdpaFp8BwdParams& f = f8.f;
  const bool e5 = f.grad_format == 2;
  const float u = f8.d(kF8dDqUnit), sc = f8.d(kF8dScaleDQ);
  uint8_t* dq = static_cast<uint8_t*>(f.dq8.data) + int64_t(b) * f.dq8.batch_stride +
                int64_t(h) * f.dq8.head_stride + qrow * f.dq8.row_stride;
  float m = 0.0f;
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int row = r0 + 8 * hi;
    if (row < rows_valid) {
#pragma unroll
      for (int n = 0; n < T::kNQ; ++n) {
        const int col = n * 8 + 2 * t;
        if (col < head_dqk) {
          const float x0 = acc[n][2 * hi] * u, x1 = acc[n][2 * hi + 1] * u;
          m = fmaxf(m, fmaxf(fabsf(x0), fabsf(x1)));
          uint8_t* dst = dq + int64_t(row) * f.dq8.row_stride + col;
          dst[0] = uint8_t(fp8_soft_encode(x0 * sc, e5));
          dst[1] = uint8_t(fp8_soft_encode(x1 * sc, e5));
        }
      }
    }
  }
  fp8_amax_flush(f.amax[kFp8AmaxDQ], m, lane);
}

// ---------------------------------------------------------------------------------------
// 3. dQ, deterministic: grid (global query block of the backward view, query head).
// One CTA of 4 warps per (query block, query head); warp w owns query rows 16w.. and every
// key of a block. The Q2K lists are walked in ascending key-block order (the order of the
// fp32 sums, fixed: bitwise reproducible); per key block, S and dP are recomputed and
// dQ += dS K is accumulated in registers.
// Per-block invariants are formed once, before the loop: row statistics (lse2, -D), the Q/dO
// fragment addresses, the K/V loaders' per-thread chunk offsets (TileRowLoader8) and the
// thread's source pointers (row 0 of the sample, head hkv); a K/V tile costs one 64-bit
// multiply-add per matrix plus the copies. The Q2K cursor reads one block ahead, so the next
// K/V tile's address never waits on a global load.
// The body of the dQ kernel for a mask policy (plan: flex_bwd_dq_kernel_sm80, the cell of
// the plan's backward view; analytic: sdpa_bwd_dq_kernel_sm80, query block qb of sample b).
// F8: Fp8BwdSm80 for the FP8 backward (sdpa_fp8_bwd_dq_kernel_sm80: dkdv_item's FP8 steps for dQ, the
// FP8 epilogue; amax_dP is the dK/dV kernel's), else NoFp8BwdSm80.
template <class T, class E, class Mask, class F8 = NoFp8BwdSm80>
__device__ __forceinline__ void dq_kernel_sm80(const BwdParams& p, const F8& f8 = F8{}) {
  static_assert(!F8::kOn || Mask::kFeatures, "the FP8 backward runs the features' loop");
  using Elem = typename E::Storage;
  static_assert(E::kBits == 16, "the sm80 loaders and ldmatrix move 16-bit elements");
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t sQ = smem_u32(smem);
  const uint32_t sO = sQ + T::kSmemQ;
  const uint32_t sK0 = sO + T::kSmemO;               // K[2]
  const uint32_t sV0 = sK0 + 2 * T::kSmemK;          // V[2]
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2;

  int gq, h, b, qb;
  if constexpr (Mask::kAnalytic) {
    // The SDPA forward's cell order (tile_scheduler.cuh AnalyticGrid: the last query block first,
    // heads fastest; under a causal band the longest walks start first).
    const WorkItem w = AnalyticGrid{analytic_of(p).num_q_blocks, p.num_heads_q, p.batch}.next(0);  // cell blockIdx.x
    gq = 0;  // (the plan's global query block; unused by the analytic mask)
    h = w.head;
    b = w.batch;
    qb = w.block;
  } else {
    // Folded grid (grid.h): CTA = query head * NQB + global query block.
    const GridCell cell = unfold_2d(blockIdx.x, int(p.view.num_q_blocks));
    gq = cell.x;
    h = cell.y;
    b = find_block_owner(p.view.q_block_start, p.batch, gq);
    qb = gq - __ldg(p.view.q_block_start + b);
  }
  const int hkv = h / p.group_size;
  const int hm = p.mask_per_head ? h : 0;
  const typename Mask::Seqlen sl(p, b);
  const int q_start = sl.q_start, len_q = sl.len_q, k_start = sl.k_start, len_k = sl.len_k;
  const int row0 = qb * T::kBlockQ;
  const int rows_valid = min(T::kBlockQ, len_q - row0);
  const int rows_store = Mask::rows_store(p, kSdpaDQ, row0, T::kBlockQ, rows_valid, sl);
  if (Mask::kAnalytic && rows_store <= 0) return;  // a ragged dQ's block past the sample
  const int64_t qrow = int64_t(Mask::row0(p, q_start)) + row0;
  const int64_t krow_base = Mask::row0(p, k_start);

  // Q2K cursor (BlockCursor order: partial entries, then full runs) with its next key block
  // read one step ahead (nb = kNone past the end; ne = its payload index, -1 for a full block).
  constexpr int kNone = 0x7fffffff;
  auto cur = Mask::q2k(p, sl, hm, gq, qb);
  const auto mask = Mask::dq_item(sl, qb);
  int nb = kNone, ne = -1;
  auto peek = [&]() {
    int blk = 0, entry = 0;
    bool partial = false;
    if (cur.next(blk, partial, entry)) {
      nb = blk;
      ne = partial ? entry : -1;
    } else {
      nb = kNone;
    }
  };
  peek();
  // Next key block and its payload index (-1 for a full block).
  auto next_block = [&](int& kbb, int& payload) -> bool {
    if (nb == kNone) return false;
    kbb = nb;
    payload = ne;
    peek();
    return true;
  };

  BwdKvLoaderSm80<T, Elem> kv;
  const int hv = v_head<Mask::kFeatures>(p, h, hkv);  // V's head: K's, but for SDPA with H_k != H_v
  kv.template init<Mask>(p, b, krow_base, hkv, hv, tid);

  load_tile_async<T::kBlockQ, T::kDqk, T::kThreadsQ>(
      sQ, row_ptr<Elem>(Mask::template sample_ptr<const Elem>(p, p.q, kSdpaQ, b), p.qa, Mask::batch(b), qrow, h),
      p.qa.row_stride, rows_valid, p.head_dqk, tid);
  load_tile_async<T::kBlockQ, T::kDv, T::kThreadsQ>(
      sO, row_ptr<Elem>(Mask::template sample_ptr<const Elem>(p, p.dout, kSdpaDO, b), p.doa, Mask::batch(b), qrow, h),
      p.doa.row_stride, rows_valid, p.head_dv, tid);
  int kb = 0, payload = -1;
  bool have = next_block(kb, payload);
  if (have) kv.load(p, sK0, sV0, 0, kb, len_k, tid);
  cp_async_commit();

  // Row statistics of the thread's rows 16 warp + g (+ 8): lse2 (+inf for rows past len_q:
  // P = 0) and -D (the C operand of dP's first k16 step: dP - D directly).
  float lse2[2], minus_d[1][4];
  [[maybe_unused]] float d_row[2] = {0.0f, 0.0f};  // FP8: D in true units, subtracted after the GEMM
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int rr = row0 + warp * 16 + g + 8 * hi;
    const bool ok = rr < len_q;
    const int64_t ws = int64_t(h) * p.total_q + q_start + rr;
    lse2[hi] = ok ? __ldg(p.lse2 + ws) : INFINITY;
    minus_d[0][2 * hi] = minus_d[0][2 * hi + 1] = ok ? -__ldg(p.delta + ws) : -0.0f;
    if constexpr (F8::kOn) {
      d_row[hi] = -minus_d[0][2 * hi];
      minus_d[0][2 * hi] = minus_d[0][2 * hi + 1] = 0.0f;
    }
  }
  float acc[T::kNQ][4];
#pragma unroll
  for (int n = 0; n < T::kNQ; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  // Fragment addresses, computed once and read back per iteration from a per-thread
  // local-memory table (indexed by the run-time buffer, so it stays in local memory; one
  // 16-byte load each): ptxas would otherwise re-derive them from tid every iteration.
  // addr_tab[buf]: [0] bK (S), [1] bV (dP), [2] bKq (dQ) of K/V buffer buf; [3] aQ (S) and
  // [4] aO (dP), in both rows.
  uint4 addr_tab[2][5];
#pragma unroll
  for (int bb = 0; bb < 2; ++bb) {
    addr_tab[bb][0] = ldsm_b_nk<T::kDqk>(sK0 + bb * T::kSmemK, lane).pack();
    addr_tab[bb][1] = ldsm_b_nk<T::kDv>(sV0 + bb * T::kSmemV, lane).pack();
    addr_tab[bb][2] = ldsm_b_kn<T::kDqk>(sK0 + bb * T::kSmemK, lane).pack();
    addr_tab[bb][3] = ldsm_a<T::kDqk>(sQ + warp * 16 * T::kDqk * 2, lane).pack();
    addr_tab[bb][4] = ldsm_a<T::kDv>(sO + warp * 16 * T::kDv * 2, lane).pack();
  }
  int buf = 0;

  while (have) {
    cp_async_wait<0>();
    __syncthreads();  // K/V[buf] visible; everyone is done with K/V[buf ^ 1]
    int kb_next = 0, payload_next = -1;
    const bool have_next = next_block(kb_next, payload_next);
    if (have_next) kv.load(p, sK0, sV0, buf ^ 1, kb_next, len_k, tid);
    cp_async_commit();
    const LdsmAddr<T::kDqk> bK = LdsmAddr<T::kDqk>::unpack(addr_tab[buf][0]);
    const LdsmAddr<T::kDv> bV = LdsmAddr<T::kDv>::unpack(addr_tab[buf][1]);

    float s[T::kNSQ][4];
#pragma unroll
    for (int n = 0; n < T::kNSQ; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    warp_mma_a_bnk<T::kDqk / 16, T::kNSQ, T::kExact, E>(s, LdsmAddr<T::kDqk>::unpack(addr_tab[buf][3]), bK,
                                                            p.head_dqk);
    // P = exp2(S scale log2(e) - lse2), scaling and subtraction as one fma; the mask sets
    // -inf after it (exp2(-inf) = 0; an empty row's lse2 = +inf gives -inf too).
    if constexpr (F8::kOn) {
      // FP8 (dkdv_item's steps): P = exp2(s kF8dQkScaleLog2 - lse2), no score modifier.
      const float qk = f8.d(kF8dQkScaleLog2);
#pragma unroll
      for (int n = 0; n < T::kNSQ; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[n][i] = fmaf(s[n][i], qk, -lse2[i >> 1]);
      }
      mask.template apply<T::kNSQ>(p, s, payload, qb, kb, warp, 0, lane);
#pragma unroll
      for (int n = 0; n < T::kNSQ; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[n][i] = exp2_approx(s[n][i]);
      }
    } else if constexpr (Mask::kFeatures) {
      // SDPA: the score modifiers, the mask, then s = P d logit / d x (softcap's derivative)
      // before the dP GEMM.
      const SdpaScoreMod mod = SdpaScoreMod::make(analytic_of(p).score, h);  // (per block: not held across)
      const int base = mask.diag(p, qb, kb, warp, 0);
      sdpa_bwd_logits<T::kNSQ>(p, s, lse2, mod, base, lane);
      mask.template apply<T::kNSQ>(p, s, payload, qb, kb, warp, 0, lane);
      // The additive bias on the visible elements (after the mask: never read where it is -inf).
      const SdpaBiasFrag bias = SdpaBiasFrag::make(analytic_of(p).bias, b, h, int64_t(row0) + warp * 16,
                                                   int64_t(kb) * T::kBlockK, lane);
      bias.add<T::kNSQ>(s);
      mod.probs_dlogit<T::kNSQ>(s, lse2, base, lane, bias);
    } else {
#pragma unroll
      for (int n = 0; n < T::kNSQ; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[n][i] = fmaf(s[n][i], p.scale_log2, -lse2[i >> 1]);
      }
      mask.template apply<T::kNSQ>(p, s, payload, qb, kb, warp, 0, lane);
    }
    // dP - D: k16 step 0 seeded with -D (head_dv >= 1), the rest accumulated.
    float dp[1][T::kNSQ][4];
    const LdsmAddr<T::kDv> aO = LdsmAddr<T::kDv>::unpack(addr_tab[buf][4]);
    warp_mma_k16_first<1, T::kNSQ, E>(dp, minus_d, aO, bV);
#pragma unroll
    for (int kk = 1; kk < T::kDv / 16; ++kk) {
      if (T::kExact || kk * 16 < p.head_dv) {
        warp_mma_k16<1, T::kNSQ, false, false, true, E>(dp, aO, bV, kk, 0);
      }
    }
    if constexpr (F8::kOn) {
      // FP8: dp holds dO . v of the raw codes (no -D seed); dS - D = kF8dDsUnit dp - D.
      const float du = f8.d(kF8dDsUnit);
#pragma unroll
      for (int n = 0; n < T::kNSQ; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) dp[0][n][i] = fmaf(du, dp[0][n][i], -d_row[i >> 1]);
      }
    } else if constexpr (Mask::kFeatures) {
      // SDPA dropout: dP - D becomes m dP - D = m (dP - D) + (m - 1) D with the element's multiplier m
      // (D = -minus_d, the row's).
      const SdpaDropoutParams& dpp = analytic_of(p).dropout;
      if (dpp.mode != 0) {
        sdpa_dropout_apply<T::kNSQ>(dpp, b, h, p.num_heads_q, int64_t(row0) + warp * 16 + g,
                                    int64_t(kb) * T::kBlockK + 2 * (lane & 3), len_q, len_k,
                                    [&](int n, int r, float m) {
                                      dp[0][n][r] = fmaf(m, dp[0][n][r], (1.0f - m) * minus_d[0][r]);
                                    });
      }
    }
    [[maybe_unused]] float f8_attn = 0.0f, f8_sdp = 0.0f;
    [[maybe_unused]] bool f8_e5 = false;
    if constexpr (F8::kOn) {
      f8_attn = f8.d(kF8dAttnScale);
      f8_sdp = f8.d(kF8dScaleDP);
      f8_e5 = f8.f.do_format == 2;
    }
#pragma unroll
    for (int n = 0; n < T::kNSQ; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (F8::kOn) {
          // FP8: dP = attn_scale P (dS - D), dP8 = fp8_dO(dP scale_dP) as dQ's operand.
          s[n][i] = fp8_soft_round(f8_attn * (s[n][i] * dp[0][n][i]) * f8_sdp, f8_e5);
        } else if constexpr (Mask::kFeatures) {
          s[n][i] *= dp[0][n][i];  // dS = P d logit / d x (dP - D)
        } else {
          s[n][i] = exp2_approx(s[n][i]) * dp[0][n][i];  // dS = P (dP - D)
        }
      }
    }
    // dQ += dS K: dS (registers, 16-bit) is the A operand, K[key][d] the B operand.
    const LdsmAddr<T::kDqk> bKq = LdsmAddr<T::kDqk>::unpack(addr_tab[buf][2]);
#pragma unroll
    for (int kk = 0; kk < T::kBlockK / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack2<E>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<E>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<E>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<E>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int n = 0; n < T::kNQ; n += 2) {
        if (T::kExact || n * 8 < p.head_dqk) {
          uint32_t bb[4];
          ldmatrix_x4_trans(bb, bKq.at(n / 2, kk * 16));
          mma_16816<E>(acc[n], a, bb[0], bb[1]);
          mma_16816<E>(acc[n + 1], a, bb[2], bb[3]);
        }
      }
    }
    kb = kb_next;  // the analytic mask's tile of the next block (the plan's reads only payload)
    payload = payload_next;
    have = have_next;
    buf ^= 1;
  }
  cp_async_wait<0>();

  if constexpr (F8::kOn) {
    dq_store_fp8_sm80<T>(f8, b, h, qrow, rows_store, warp * 16 + g, lane & 3, acc, p.head_dqk, lane);
    return;
  }
  dq_store_sm80<T, E, Mask>(p, b, h, qrow, rows_store, warp * 16 + g, lane & 3, acc);
}

template <class T, class E>
__global__ void __launch_bounds__(T::kThreadsQ) flex_bwd_dq_kernel_sm80(const BwdParams p) {
  dq_kernel_sm80<T, E, PlanPayloadMaskBwdSm80<T>>(p);
}

// ---------------------------------------------------------------------------------------
// SDPA (analytic mask): dK/dV, one CTA per (key block, kv head) of every sample padded to
// S_kv keys, in the order of the sm90 SDPA backward's cells (tile_scheduler.cuh
// AnalyticBwdGrid: without a band heads slowest, else key blocks ascending, heads
// fastest: the longest walks first) over the work items' heads (K's, or V's in the dV pass of
// H_k != H_v: AnalyticMaskBwdSm80::group). Blocks past a sample's length write the padded
// keys' zeros (padded dK/dV) or exit (ragged). The dQ kernel (deterministic), one CTA per
// (query block, query head) of every sample padded to S_q rows (AnalyticGrid's order).
// kFeatures, kDsBeforeSoftcap: AnalyticMaskBwdSm80's (the dQ kernel stores no dS: it needs no kDsBeforeSoftcap).
template <class T, class E, bool kFeatures, bool kDsBeforeSoftcap = false>
__global__ void __launch_bounds__(T::kThreads) sdpa_bwd_dkdv_kernel_sm80(const SdpaBwdParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  using Mask = AnalyticMaskBwdSm80<T, kFeatures, kDsBeforeSoftcap>;
  const AnalyticMaskParams& a = p.analytic;
  const AnalyticBwdGrid grid{a.num_k_blocks, p.num_heads_q / Mask::group(p), p.batch,
                             sdpa_bwd_grid_heads_slowest(a.band.has_left, a.band.has_right)};
  const WorkItem w = grid.next(0);  // cell blockIdx.x (one CTA per cell)
  dkdv_item<T, E, Mask>(p, smem, w.block, w.head, w.batch, 0, 0x7fffffff);
}

// The FP8 backward's dK/dV kernel (params.h SdpaFp8BwdParams; launch_sdpa_fp8_bwd_sm80.cu): the SDPA dK/dV
// kernel's cells on the bf16 copies, with the features' loop and Fp8BwdSm80 (dQ through the atomic path).
template <class T>
__global__ void __launch_bounds__(T::kThreads) sdpa_fp8_bwd_dkdv_kernel_sm80(const SdpaFp8BwdParams p) {
  extern __shared__ __align__(128) uint8_t smem[];
  using Mask = AnalyticMaskBwdSm80<T, true>;
  const AnalyticMaskParams& a = p.analytic;
  const AnalyticBwdGrid grid{a.num_k_blocks, p.num_heads_q / Mask::group(p), p.batch,
                             sdpa_bwd_grid_heads_slowest(a.band.has_left, a.band.has_right)};
  const WorkItem w = grid.next(0);
  dkdv_item<T, BFloat16, Mask, Fp8BwdSm80>(p, smem, w.block, w.head, w.batch, 0, 0x7fffffff, Fp8BwdSm80{p});
}

// The FP8 backward's deterministic dQ kernel (the SDPA dQ kernel's cells, Fp8BwdSm80).
template <class T>
__global__ void __launch_bounds__(T::kThreadsQ) sdpa_fp8_bwd_dq_kernel_sm80(const SdpaFp8BwdParams p) {
  dq_kernel_sm80<T, BFloat16, AnalyticMaskBwdSm80<T, true>, Fp8BwdSm80>(p, Fp8BwdSm80{p});
}

template <class T, class E, bool kFeatures>
__global__ void __launch_bounds__(T::kThreadsQ) sdpa_bwd_dq_kernel_sm80(const SdpaBwdParams p) {
  dq_kernel_sm80<T, E, AnalyticMaskBwdSm80<T, kFeatures>>(p);
}

// ---------------------------------------------------------------------------------------
// The backward instantiations of a tile (host): fn(BwdTraitsSm80<...>{}) for the call's head
// dims, so the plan and the SDPA launchers instantiate the same table. Head dims equal to the
// tile's run the branch-free (exact) variant; the (192, 128) and (256, 256) tiles serve only
// those dims.
template <class Fn>
void with_bwd_traits_sm80(const sm80::TileSm80& tile, int dqk, int dv, Fn&& fn) {
  const bool exact = dqk == tile.dqk_tile && dv == tile.dv_tile;
  if (tile.dqk_tile == 64) {
    if (exact) {
      fn(BwdTraitsSm80<64, 128, 64, 64, true>{});
    } else {
      fn(BwdTraitsSm80<64, 128, 64, 64, false>{});
    }
  } else if (tile.dqk_tile == 128) {
    if (exact) {
      fn(BwdTraitsSm80<64, 128, 128, 128, true>{});
    } else {
      fn(BwdTraitsSm80<64, 128, 128, 128, false>{});
    }
  } else if (tile.dqk_tile == 192) {
    fn(BwdTraitsSm80<64, 64, 192, 128, true>{});
  } else {
    fn(BwdTraitsSm80<64, 64, 256, 256, true>{});
  }
}

}  // namespace flashspan::kern

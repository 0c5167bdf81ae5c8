// The FP8 SDPA backward on the sm90 backward kernel (cuDNN's sdpa_fp8_backward; params.h SdpaFp8BwdParams,
// the formulas in docs/SDPA.md "FP8 SDPA"): the key-split consumers of kernel_bwd_sm90.cuh (producer, dQ
// writer, dQ order warp, the S^T / dP^T / dV / dQ / dK wgmma, the schedule, deterministic or not) on the
// bf16 copies of the FP8 codes that the FP8 backward's pre-pass writes (kernels/common/fp8_prepass.h,
// shared with the sm80 FP8 backward), with the mask source Fp8SourceBwdSm90.
//
// Why bf16 wgmma on the codes is exact: every E4M3 / E5M2 value is a bf16 value and the product of two
// bf16 values is exact in fp32, so the GEMMs form the products an FP8 GEMM forms (both accumulate in
// fp32). The FP8 graph's roundings sit where the consumer holds fp32 values, in the source's hooks:
//   logits      P^T = exp2(S^T kF8dQkScaleLog2 - lse2) (masked: 0)                 (under the dP^T GEMM)
//   grads_fp8   dP^T = attn_scale P^T (kF8dDsUnit dP^T - D)   (D in true units: the pre-pass's)
//               amax_dP over it; then dP8 = fp8_dO(dP^T scale_dP) as dK's and dQ's operand (the dS^T
//               registers) and S8 = fp8_q(P^T scale_s) as dV's operand (the P^T registers), both
//               rounded by the sm_89+ cvt (.rn.satfinite, the host rule of core/fp8_conv.h) and exact
//               in bf16.
// The descales multiply the fp32 sums after the kernel: every work item adds its dK / dV into a zeroed
// fp32 slot of its own (the H_k != H_v path's slots, forced here: next_item), which
// sdpa_fp8_bwd_dkdv_store_kernel_sm90 reads once, times kF8dDkUnit / kF8dDvUnit, with the amaxes and the
// FP8 stores (any strides, a byte at a time); dQ's tiles likewise by sdpa_fp8_bwd_dq_store_kernel_sm90
// (kF8dDqUnit). amax_dP: each consumer thread's running maximum (Src::kFp8: the consumer's amax_dp),
// flushed by warp maxima and one atomic a warp when the consumer ends.
// Takes what sdpa_fp8_bwd_refusal takes (H_k = H_v, head dims multiples of 16 up to 128, the causal
// mask, deterministic or not) on the (64, 64) / (128, 128) kernels (head dims past the call's: the tensor
// maps' zero fill).
#pragma once

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/sm90/kernel_bwd_mods_sm90.cuh"
#include "kernels/sm90/kernel_bwd_sm90.cuh"

namespace flashspan::kern90 {

// (Device code of sm_90a only: the FP8 cvt needs sm_89, the body sm_90a; other targets' kernels trap.)
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The FP8 parameters of a kernel launched with SdpaFp8BwdParams (sdpa_fp8_bwd_kernel_sm90's only caller).
__device__ __forceinline__ const SdpaFp8BwdParams& fp8_bwd_of(const BwdParams& p) {
  return static_cast<const SdpaFp8BwdParams&>(p);
}
__device__ __forceinline__ float fp8_bwd_derived(const BwdParams& p, int i) { return __ldg(fp8_bwd_of(p).derived + i); }

// (x, y) rounded to E4M3 (e5m2 false) or E5M2, nearest even, satfinite (NaN stays NaN): the two FP8 codes,
// x's in the low byte (ptx.cuh cvt_fp8x2, sm_89+).
__device__ __forceinline__ uint32_t fp8x2_codes(float x, float y, bool e5m2) {
  return e5m2 ? kern::cvt_fp8x2<Float8E5M2>(x, y) : kern::cvt_fp8x2<Float8E4M3>(x, y);
}

// The warp's maximum of a non-negative v into *amax (zeroed by the pre-pass): every lane calls it.
__device__ __forceinline__ void fp8_warp_amax(float* amax, float v, int lane) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (lane == 0) kern::atomic_max_float(amax, v);
}

// x0, x1 (true units) -> amax m, and their codes fp8_grad(x scale) at dst[0], dst[1] (bytes: any strides): the
// FP8 backward's dQ / dK / dV stores.
__device__ __forceinline__ void fp8_bwd_store2_sm90(uint8_t* dst, float x0, float x1, float scale, bool e5m2,
                                                    float& m) {
  m = fmaxf(m, fmaxf(fabsf(x0), fabsf(x1)));
  const uint32_t c = fp8x2_codes(x0 * scale, x1 * scale, e5m2);
  dst[0] = uint8_t(c & 0xffu);
  dst[1] = uint8_t(c >> 8);
}

// (x, y) rounded to the format, as floats (fp8x2_codes, then the codes widened exactly through f16x2).
__device__ __forceinline__ void fp8x2_round(float& x, float& y, bool e5m2) {
  const uint16_t h = uint16_t(fp8x2_codes(x, y, e5m2));
  uint32_t w;
  if (e5m2) {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(w) : "h"(h));
  } else {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(w) : "h"(h));
  }
  x = __half2float(__ushort_as_half(uint16_t(w & 0xffffu)));
  y = __half2float(__ushort_as_half(uint16_t(w >> 16)));
}

// The FP8 backward's mask source: the analytic source (the causal mask; items, walks, dQ order), every
// item's dK / dV into its slot, and the FP8 steps of the consumer (Src::kFp8: logits, grads_fp8,
// flush_amax). kFormats: bit 0 q's format E5M2 (S8's; else E4M3), bit 1 dO's (dP8's), fixed per
// instantiation so that each rounding is one cvt pair (run-time formats predicated both forms). kStore
// (experimental, not yet run on a GPU): no slots; the consumer stores each item's dK / dV as FP8 codes itself
// (store_dkdv: H_k = H_v, so an item is its cell's whole task), with no slot clearing, atomics or store pass.
template <int kBk, int kFormats, bool kStore = false>
struct Fp8SourceBwdSm90 : AnalyticModSourceBwdSm90<kBk, false, false, false> {
  using Base = AnalyticModSourceBwdSm90<kBk, false, false, false>;
  using Seqlen = typename Base::Seqlen;
  static constexpr bool kFp8 = true, kFp8Store = kStore;
  static constexpr int kBlockQ = Base::kBlockQ, kBlockK = kBk;

  // The analytic source's item, with its slot (AnalyticBwdGrid::slot of its cell) whatever the heads:
  // the dK / dV epilogue adds the fp32 sums there (kernel_bwd_sm90.cuh dkdv_epilogue_sm90, it.slot >= 0).
  __device__ __forceinline__ static BwdItem next_item(const BwdParams& p, uint32_t item_it, int x) {
    BwdItem it = Base::next_item(p, item_it, x);
    if (!kStore && it.kb >= 0) it.slot = int(Base::grid(p).slot(it.kb, it.hkv, it.b));
    return it;
  }

  // kStore: the item's dK = dk kF8dDkUnit and dV = dv kF8dDvUnit (the thread's rows key_thr (+8) below keys_valid,
  // columns 8 n + 2 qd (+1) below the call's head dims) as fp8_grad(dX scale_dX) codes, a byte at a time (any
  // strides), their amaxes by warp maxima (every lane calls it).
  template <int kN>
  __device__ __forceinline__ static void store_dkdv(const BwdParams& p, const BwdItem& it, int keys_valid,
                                                    int64_t krow, int key_thr, int lane, const float (&dk)[kN][4],
                                                    const float (&dv)[kN][4]) {
    const SdpaFp8BwdParams& f = fp8_bwd_of(p);
    const bool e5 = f.grad_format == 2;
    const float uk = fp8_bwd_derived(p, kF8dDkUnit), uv = fp8_bwd_derived(p, kF8dDvUnit);
    const float sk = fp8_bwd_derived(p, kF8dScaleDK), sv = fp8_bwd_derived(p, kF8dScaleDV);
    const int qd = lane & 3;
    uint8_t* dkp = static_cast<uint8_t*>(f.dk8.data) + int64_t(it.b) * f.dk8.batch_stride +
                   int64_t(it.hkv) * f.dk8.head_stride + krow * f.dk8.row_stride;
    uint8_t* dvp = static_cast<uint8_t*>(f.dv8.data) + int64_t(it.b) * f.dv8.batch_stride +
                   int64_t(it.hkv) * f.dv8.head_stride + krow * f.dv8.row_stride;
    float mk = 0.0f, mv = 0.0f;
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
      const int key = key_thr + 8 * hi;
      if (key < keys_valid) {
#pragma unroll
        for (int n = 0; n < kN; ++n) {
          const int col = 8 * n + 2 * qd;
          if (col < p.head_dqk) {
            fp8_bwd_store2_sm90(dkp + int64_t(key) * f.dk8.row_stride + col, dk[n][2 * hi] * uk,
                                dk[n][2 * hi + 1] * uk, sk, e5, mk);
          }
          if (col < p.head_dv) {
            fp8_bwd_store2_sm90(dvp + int64_t(key) * f.dv8.row_stride + col, dv[n][2 * hi] * uv,
                                dv[n][2 * hi + 1] * uv, sv, e5, mv);
          }
        }
      }
    }
    fp8_warp_amax(f.amax[kFp8AmaxDK], mk, lane);
    fp8_warp_amax(f.amax[kFp8AmaxDV], mv, lane);
  }

  // S^T (the raw codes' sums) -> P^T = exp2(S^T kF8dQkScaleLog2 - lse2[query]), masked elements 0.
  template <int kNQ>
  __device__ __forceinline__ static void logits(const BwdParams& p, const BwdItem& it, const Seqlen& sl, int4 info,
                                                int key_thr, const float* lse2, int lane, uint32_t,
                                                float (&s)[kNQ][4], uint32_t (&)[kNQ][2]) {
    const float qk = fp8_bwd_derived(p, kF8dQkScaleLog2);
    const int qd = lane & 3;
#pragma unroll
    for (int j = 0; j < kNQ; ++j) {
      const float2 l2 = *reinterpret_cast<const float2*>(lse2 + 8 * j + 2 * qd);
#pragma unroll
      for (int r = 0; r < 4; ++r) s[j][r] = fmaf(s[j][r], qk, (r & 1) ? -l2.y : -l2.x);
    }
    Base::template mask_partial<kNQ>(it, sl, info, key_thr, lane, s);
#pragma unroll
    for (int j = 0; j < kNQ; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) s[j][r] = kern::exp2_approx(s[j][r]);
    }
  }

  // P^T (s) and dP^T (dp, the raw codes' sums) -> S8 = fp8_q(P^T scale_s) (s) and dP8 = fp8_dO(dP^T
  // scale_dP) (dp), with dP^T = attn_scale P^T (kF8dDsUnit dp - D[query]) and its amax into amax.
  // Pairs (r, r + 1) of an n8 block are one cvt each (the A fragments' pairs).
  template <int kNQ>
  __device__ __forceinline__ static void grads_fp8(const BwdParams& p, const float* delta, int lane,
                                                   float (&s)[kNQ][4], float (&dp)[kNQ][4], float& amax) {
    const float du = fp8_bwd_derived(p, kF8dDsUnit), attn = fp8_bwd_derived(p, kF8dAttnScale);
    const float sdp = fp8_bwd_derived(p, kF8dScaleDP), ss = fp8_bwd_derived(p, kF8dScaleS);
    constexpr bool e5q = (kFormats & 1) != 0, e5do = (kFormats & 2) != 0;
    const int qd = lane & 3;
#pragma unroll
    for (int j = 0; j < kNQ; ++j) {
      const float2 dd = *reinterpret_cast<const float2*>(delta + 8 * j + 2 * qd);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float x0 = attn * s[j][2 * h] * fmaf(du, dp[j][2 * h], -dd.x);
        float x1 = attn * s[j][2 * h + 1] * fmaf(du, dp[j][2 * h + 1], -dd.y);
        amax = fmaxf(amax, fmaxf(fabsf(x0), fabsf(x1)));
        x0 *= sdp;
        x1 *= sdp;
        fp8x2_round(x0, x1, e5do);
        dp[j][2 * h] = x0;
        dp[j][2 * h + 1] = x1;
        float p0 = s[j][2 * h] * ss, p1 = s[j][2 * h + 1] * ss;
        fp8x2_round(p0, p1, e5q);
        s[j][2 * h] = p0;
        s[j][2 * h + 1] = p1;
      }
    }
  }

  // The consumer thread's amax_dP: the warp's maximum, one atomic a warp (every lane calls it).
  __device__ __forceinline__ static void flush_amax(const BwdParams& p, float amax, int lane) {
    fp8_warp_amax(fp8_bwd_of(p).amax[kFp8AmaxDP], amax, lane);
  }
};

#endif  // __CUDA_ARCH__ && __CUDA_ARCH_FEAT_SM90_ALL

// The kFormats of a call: bit 0 q's format E5M2, bit 1 dO's.
inline constexpr int fp8_bwd_formats(int format, int do_format) { return (format == 2 ? 1 : 0) | (do_format == 2 ? 2 : 0); }

// The FP8 backward's main kernel: the (64, 64) or (128, 128) key-split kernel (kD) on bf16 copies, with
// Fp8SourceBwdSm90 of the call's formats (kFormats = fp8_bwd_formats); p: SdpaFp8BwdParams (the hooks read
// its FP8 part).
template <int kD, int kFormats, bool kStore = false>
__global__ void __launch_bounds__(BwdSm90Layout<kD>::kThreads, 1)
    sdpa_fp8_bwd_kernel_sm90(const __grid_constant__ SdpaFp8BwdParams p, const __grid_constant__ CUtensorMap tm_q,
                             const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                             const __grid_constant__ CUtensorMap tm_do) {
  static_assert(kD == 64 || kD == 128, "the FP8 backward: head dims (64, 64) and (128, 128)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  bwd_sm90_body<kD, BFloat16, kD, Fp8SourceBwdSm90<BwdSm90Layout<kD>::kBlockK, kFormats, kStore>>(p, &tm_q, &tm_k,
                                                                                                   &tm_v, &tm_do);
#else
  __trap();
#endif
}

// dQ of the FP8 backward from the kernel's dq_accum tiles (sdpa_bwd_dq_convert_kernel_sm90's rows and
// tiles: every sample padded to S_q, tile (query head, b num_q_blocks + pos / 64), dq_tile_offset_sm90):
// dQ = acc kF8dDqUnit, its amax, stored fp8_grad(dQ scale_dQ). One warp per (row, head), grid-stride.
template <int kD>
__global__ void __launch_bounds__(256) sdpa_fp8_bwd_dq_store_kernel_sm90(const SdpaFp8BwdParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBq = BwdSm90Layout<kD>::kBlockQ;
  const AnalyticMaskParams& a = p.analytic;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float unit = __ldg(p.derived + kF8dDqUnit), sc = __ldg(p.derived + kF8dScaleDQ);
  const bool e5 = p.grad_format == 2;
  float m = 0.0f;
  const int64_t units = int64_t(p.num_heads_q) * p.total_q;
  for (int64_t w = int64_t(blockIdx.x) * 8 + warp; w < units; w += int64_t(gridDim.x) * 8) {
    const int64_t h = w / p.total_q, t = w - h * p.total_q;
    const int b = int(t / a.max_q);
    const int64_t pos = t - int64_t(b) * a.max_q;
    const float* src = p.dq_accum + (h * p.view.num_q_blocks + int64_t(b) * a.num_q_blocks + pos / kBq) * (kBq * kD);
    const int rr = int(pos % kBq);
    uint8_t* dst = static_cast<uint8_t*>(p.dq8.data) + int64_t(b) * p.dq8.batch_stride + h * p.dq8.head_stride +
                   pos * p.dq8.row_stride;
#pragma unroll
    for (int d = 2 * lane; d < kD; d += 64) {
      if (d < p.head_dqk) {
        const float2 x = *reinterpret_cast<const float2*>(src + dq_tile_offset_sm90<kD>(rr, d));
        fp8_bwd_store2_sm90(dst + d, x.x * unit, x.y * unit, sc, e5, m);
      }
    }
  }
  fp8_warp_amax(p.amax[kFp8AmaxDQ], m, lane);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

// dK and dV of the FP8 backward from the work items' slots (Fp8SourceBwdSm90::next_item: every item's fp32
// sums, [bk, kD] each, bk = p.view.block_k, in its slot, AnalyticBwdGrid::slot): the rows of K head hk are the
// sum of the slots of item heads hk r .. hk r + r - 1 (r = group_size / item_group), those of V head hv of
// hv r' .. (r' = group_v / item_group), added in that order (the first slot, then the others: a fixed order,
// as sdpa_bwd_dkdv_sum_kernel_sm90's; H_k = H_v: r = r' = 1, an item is its cell's whole task); dK = sum kF8dDkUnit, dV = sum kF8dDvUnit, their
// amaxes, stored fp8_grad(dX scale_dX) at each row below S_kv (0 past a sample: the slots hold 0 there) and the
// call's head_dqk / head_dv columns. One warp per (key row, head) of dK, then of dV, grid-stride over the
// B S_kv (H_k + H_v) units. (H_k != H_v too: PERF_LOG v2.40.)
template <int kD>
__global__ void __launch_bounds__(256) sdpa_fp8_bwd_dkdv_store_kernel_sm90(const SdpaFp8BwdParams p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const AnalyticMaskParams& a = p.analytic;
  const kern::AnalyticBwdGrid grid = AnalyticItemsBwdSm90::grid(p);
  const int g = AnalyticItemsBwdSm90::item_group(p);
  const int heads_k = p.num_heads_q / p.group_size;
  const int bk = p.view.block_k;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool e5 = p.grad_format == 2;
  const float uk = __ldg(p.derived + kF8dDkUnit), uv = __ldg(p.derived + kF8dDvUnit);
  const float sk = __ldg(p.derived + kF8dScaleDK), sv = __ldg(p.derived + kF8dScaleDV);
  float mk = 0.0f, mv = 0.0f;
  const int64_t rows = int64_t(p.batch) * a.max_kv;
  const int64_t units = rows * (heads_k + p.num_heads_q / a.score.group_v);
  for (int64_t w = int64_t(blockIdx.x) * 8 + warp; w < units; w += int64_t(gridDim.x) * 8) {
    const DkdvSlotUnit un = DkdvSlotUnit::of(p, w, rows, heads_k, bk, g);
    const bool is_v = un.is_v;
    const float* accum = is_v ? p.split.dv_accum : p.split.dk_accum;
    const SdpaFp8Tensor& o = is_v ? p.dv8 : p.dk8;
    uint8_t* dst = static_cast<uint8_t*>(o.data) + int64_t(un.b) * o.batch_stride + int64_t(un.h) * o.head_stride +
                   int64_t(un.s) * o.row_stride;
    const int cols = is_v ? p.head_dv : p.head_dqk;
    const float unit = is_v ? uv : uk, sc = is_v ? sv : sk;
    float& m = is_v ? mv : mk;
    for (int c = 2 * lane; c < cols; c += 64) {
      // The first slot, then the others added in order (H_k = H_v: the one slot as it is, -0 included).
      float2 x = un.at(accum, grid, un.h * un.ratio, bk, kD, c);
      for (int u = un.h * un.ratio + 1; u < (un.h + 1) * un.ratio; ++u) {
        const float2 y = un.at(accum, grid, u, bk, kD, c);
        x.x += y.x;
        x.y += y.y;
      }
      fp8_bwd_store2_sm90(dst + c, x.x * unit, x.y * unit, sc, e5, m);
    }
  }
  fp8_warp_amax(p.amax[kFp8AmaxDK], mk, lane);
  fp8_warp_amax(p.amax[kFp8AmaxDV], mv, lane);
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

}  // namespace flashspan::kern90

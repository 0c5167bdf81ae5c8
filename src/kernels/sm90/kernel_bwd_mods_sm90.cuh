// The sm90 SDPA backward with score modifiers (issue 24): softcap with its derivative, ALiBi and the
// additive bias (with dBias) in the key-split consumer's scores -> P^T, dS^T step, on the kernel of
// kernel_bwd_sm90.cuh (producer, dQ writer, dQ order warp, the rest of the consumer, the dK / dV
// epilogue and the dQ convert unchanged) with the mask source AnalyticModSourceBwdSm90: one more
// instantiation per head-dim kernel ((64, 64), (128, 128): a call's head dims up to 128) and dtype,
// in its own units (sdpa_bwd_mods_sm90_d{64,128}.cu), so that the pure-mask kernel
// (sdpa_bwd_kernel_sm90) keeps its code. Sinks (dSink) and the output gate (dgate, dO * sigmoid(G))
// change nothing in the main loop (P takes the forward's LSE, sink included; the main kernel reads
// the preprocess's gated dO): the launcher runs them around whichever kernel the call needs
// (launch_bwd_sm90.cu launch_sdpa_bwd_sm90; bwd_prepost.cuh, launch_bwd_common.h).
//
// The math is the sm80 SDPA backward's (kernel_bwd_sm80.cuh, AnalyticMaskBwdSm80 with kFeatures),
// from its one home, sdpa_score_mod.cuh (SdpaScoreMod, SdpaBiasFrag). Per step, on the thread's S^T
// accumulator (rows = keys j, columns = queries i; log2 units):
//   P^T  = exp2(softcap / ALiBi (S^T scale log2 e) - lse2[i] + bias)   (masked: 0)   (logits, under dP^T)
//   dS^T = P^T (1 - t^2) (dP^T - D[i])                                             (grads)
// (the bias read on visible elements only; t = tanh(x / softcap), 1 - t^2 kept from logits as fp16
// pairs, 1 without softcap); with dBias, dS = P (dP - D) of the sample's elements into the fp32
// workspace [B, H_q, S_q, ds_ld] (SdpaBiasParams::ds, zeroed by the launcher, each element written
// once; or, SdpaBiasParams::ds_form, added into an accumulator of dBias's shape, or stored into dBias), with
// softcap before its factor 1 - t^2, since the bias is added after softcap (dBias with softcap and
// dropout is refused by the C layer); launch_sdpa_bwd_dbias (launch_bwd_common.h) then sums the
// workspace over dBias's broadcast dimensions (or converts the accumulator). S^T is a fragment of the
// transposed problem (scores of keys against queries): its bias is SdpaBiasFrag::at_transposed, its
// ALiBi the negated offsets (SdpaScoreMod::transposed, base i0 + shift - j0).
//
// Registers: the consumers have 232 (setmaxnreg), and the pure-mask (128, 128) consumer already
// peaks at 228 live (S^T, dP^T, dK, dV: 192 of them). P^T is formed under the dP^T GEMM as in the
// pure-mask consumer (v2.24; before, z^T was, and the exp2 waited for dP^T); softcap's factor (fp16 pairs)
// waits across the wait in registers at (64, 64) and in the warp's region of shared memory at (128, 128),
// where its 16 registers spilled (kStash, PERF_LOG v2.74); the bias's addresses are live only there (the
// sm80 kernels read it twice: added to the logits, then taken out of them for softcap's t), and the element
// mask is tested from the tile mask (4 ints) instead of the payload-word form the consumer builds (8 words).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/common/sdpa_score_mod.cuh"
#include "kernels/sm90/kernel_bwd_sm90.cuh"

namespace flashspan::kern90 {

#if defined(__CUDA_ARCH__)  // (the sources of kernel_bwd_sm90.cuh are device code only)

// A step's Philox keep bits (SdpaDropoutParams mode 1; 0 otherwise) on the key-split consumer of tile
// kBlockQ x kBlockK: bit 4 j + r for element (j, r) of the thread's S^T (sdpa_dropout_keep_bits_transposed,
// the forward's keep mask bit for bit); info = {query head, query block, ...}, key_thr: the thread's first
// key of the block. All 32 lanes of the warp call it. The step_keep of both dropout sources below.
template <int kNQ, int kBlockQ, int kBlockK>
__device__ __forceinline__ uint32_t sdpa_bwd_step_keep(const BwdParams& p, const BwdItem& it, int4 info, int key_thr,
                                                       int lane) {
  const SdpaDropoutParams& dr = kern::analytic_of(p).dropout;
  if (dr.mode != 1) return 0;
  return kern::sdpa_dropout_keep_bits_transposed<kNQ>(dr, it.b, info.x, p.num_heads_q,
                                                      int64_t(info.y) * kBlockQ + 2 * (lane & 3),
                                                      int64_t(it.kb) * kBlockK + key_thr);
}

// SDPA with score modifiers: the analytic source (AnalyticSourceBwdSm90: items, walks, dQ order,
// stores) plus the consumer's modifier hooks (Src::kMods in bwd_consumer):
//   logits<kNQ>(p, it, sl, info, key_thr, lse2, lane, region, s, dlogit)  S^T -> P^T, softcap's 1 - t^2 (before
//                                                                  the dP^T wait)
//   grads<kNQ>(p, it, sl, info, key_thr, lse2, delta, lane, keep, region, dlogit, s, dp)  P^T, dP^T -> P^T m, dS^T
// (each forms what it needs of the step's modifiers, step_mods, from the parameters -- grads only with
// dropout, kProbsEarly false --: held across the dP^T wait, they spilled the (128, 128) consumer).
// kDropout_ (Src::kDropout; the instantiation of sdpa_bwd_mods_kernel_sm90<..., true>): dropout too, in
// grads, with
//   step_keep<kNQ>(p, it, info, key_thr, lane)                     the Philox keep bits (before the
//                                                                  step's GEMMs)
// An instantiation of its own, so that the modifiers' kernel keeps its code: dropout's code in it
// added spill instructions to the (128, 128) consumer (2 to 7 in the variants tried, some on paths that
// calls without dropout take too). kSoftcap: the calls with softcap (sdpa_bwd_sm90_run.cuh picks it for
// them only: without dropout its logits work in tanh units, which need c2 != 0; its 1 - t^2 carried from
// logits to grads in registers, or in the warp's region of shared memory: kStash); false: the calls without
// softcap, on an instantiation of their own (v2.24: ALiBi's backward 0.82x as fast on the softcap-capable kernel,
// and one kernel branching between the two spilled 300 bytes).
template <int kBk, bool kDropout_ = false, bool kSoftcap = true, bool kStaged = false, bool kStash = false>
struct AnalyticModSourceBwdSm90 : AnalyticSourceBwdSm90<kBk> {
  static_assert(kBk == 128, "the score modifiers run on the key-split consumers (head dims up to 128)");
  static_assert(!kStaged || (!kDropout_ && !kSoftcap), "the staged bias: its own kernel, without softcap or dropout");
  static_assert(!kStash || (kSoftcap && !kDropout_ && !kStaged), "the stash: the softcap kernel's 1 - t^2");
  using Base = AnalyticSourceBwdSm90<kBk>;
  using Seqlen = typename Base::Seqlen;
  static constexpr bool kMods = true, kDropout = kDropout_;
  // P^T formed by logits, under the dP^T GEMM (v2.24); with dropout, z^T there and P^T after the wait
  // in grads (the dropout kernel's consumer spilled 340 bytes with P^T early: the keep bits, the
  // caller mask's reads and the bias's addresses across the wait).
  static constexpr bool kProbsEarly = !kDropout_;
  static constexpr int kBlockQ = Base::kBlockQ, kBlockK = kBk;
  // kStaged: a 16-bit bias of whole 16-byte row chunks (SdpaBiasParams::chunks) staged by the consumer
  // warps (stage_bias; the consumer issues it a step ahead), read transposed from shared memory in
  // logits: its element loads after the S^T GEMM left their latency in the consumer's path (the bias
  // backward 2.05x the plain one, PERF_LOG v2.27; staged 1.37x, v2.28). An instantiation of its own
  // for the calls with such a bias and without softcap (the launcher's pick): in the kernels the other
  // modifiers' calls run on, its code made ALiBi's backward 1.14x and softcap's 1.50x the plain one
  // (were 1.01x, 1.38x). Bias calls with softcap or dropout keep the element loads.
  static constexpr bool kStageBias = kStaged;
  // The copies of a step's bias tile of the warp whose keys are key_w .. key_w + 15 of the block (64 c
  // + 16 w) into its region, as one cp.async group (SdpaBiasFrag::stage_transposed).
  __device__ __forceinline__ static void stage_bias(const BwdParams& p, const BwdItem& it, const Seqlen& sl, int4 info,
                                                    int key_w, int lane, uint32_t region) {
    const SdpaBiasParams& bp = kern::analytic_of(p).bias;
    const int i0 = info.y * kBlockQ, j0 = it.kb * kBlockK + key_w;
    const kern::SdpaBiasFrag f =
        kern::SdpaBiasFrag::at(bp, kern::SdpaBiasFrag::head_base(bp, it.b, info.x), i0, j0, 0);
    f.stage_transposed<kBlockQ>(region, sl.len_q - i0, sl.len_k - j0, lane);
    kern::cp_async_commit();
  }

  // kStash: softcap's 1 - t^2 of the thread's elements (softcap_t_dlogit's fp16 pairs) from logits to grads through
  // the warp's region of shared memory (the staged bias's, which this instantiation does not stage; kBytesBias at
  // launch), 128-bit stores and loads, lane-contiguous (conflict-free), i * 512 + 16 lane. The (128, 128) kernel's:
  // kept in the consumer's registers across the dP^T wait, ptxas spilled them, 16 STL and 32 LDL.S16 a step (ncu,
  // PERF_LOG v2.73), and the stash made its backward 7 % faster (v2.74); the (64, 64) kernel does not spill them,
  // and its stash ran 1 % slower: registers there.
  template <int kNQ>
  __device__ __forceinline__ static void stash_dlogit(uint32_t region, int lane, const uint32_t (&dl)[kNQ][2]) {
    static_assert(kNQ % 2 == 0 && (kNQ / 2) * 512 <= kBlockQ * 16 * 2,  // BwdSm90Layout::kBiasWarpBytes
                  "the stash: kNQ / 2 lines of 512 B in the warp's region");
#pragma unroll
    for (int i = 0; i < kNQ / 2; ++i) {
      asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(region + 512 * i + 16 * lane),
                   "r"(dl[2 * i][0]), "r"(dl[2 * i][1]), "r"(dl[2 * i + 1][0]), "r"(dl[2 * i + 1][1]));
    }
  }
  template <int kNQ>
  __device__ __forceinline__ static void unstash_dlogit(uint32_t region, int lane, uint32_t (&dl)[kNQ][2]) {
#pragma unroll
    for (int i = 0; i < kNQ / 2; ++i) {
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(dl[2 * i][0]), "=r"(dl[2 * i][1]), "=r"(dl[2 * i + 1][0]), "=r"(dl[2 * i + 1][1])
                   : "r"(region + 512 * i + 16 * lane));
    }
  }

  // A partial step's element mask on S^T (the tile mask of (qb, kb), analytic_mask.h: masked elements -inf);
  // a full step (info.z < 0) has none and skips the tests (only they sit in the branch, as in the pure-mask
  // consumer's P). Also the FP8 source's (kernel_bwd_fp8_sm90.cuh).
  template <int kNQ>
  __device__ __forceinline__ static void mask_partial(const BwdItem& it, const Seqlen& sl, int4 info, int key_thr,
                                                      int lane, float (&s)[kNQ][4]) {
    if (info.z < 0) return;
    const int qd = lane & 3;
    const kern::TileMask tm = kern::TileMask::make(sl.mask, int64_t(info.y) * kBlockQ, int64_t(it.kb) * kBlockK);
#pragma unroll
    for (int j = 0; j < kNQ; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (!tm.visible(8 * j + 2 * qd + (r & 1), key_thr + 8 * (r >> 1))) s[j][r] = -INFINITY;
      }
    }
  }

  // The step's modifiers on warp w of consumer warpgroup c (keys j0 = kb kBlockK + 64 c + 16 w ..,
  // the step's queries i0 = qb kBlockQ ..): the query head's softcap and slope for the transposed
  // fragment, its diagonal base i0 + shift - j0, its bias (transposed; null p: none).
  struct StepMods {
    kern::SdpaScoreMod mod;
    int diag;
    kern::SdpaBiasFrag bias;
  };

  // info = {query head h, query block qb, ...} of the step; key_thr: the thread's first key of
  // the block (64 c + 16 w + g).
  __device__ __forceinline__ static StepMods step_mods(const BwdParams& p, const BwdItem& it, const Seqlen& sl,
                                                       int4 info, int key_thr, int lane) {
    const AnalyticMaskParams& a = kern::analytic_of(p);
    const int64_t i0 = int64_t(info.y) * kBlockQ, j0 = int64_t(it.kb) * kBlockK + (key_thr - (lane >> 2));
    return StepMods{kern::SdpaScoreMod::make(a.score, info.x).transposed(), kern::diag_base(i0 + sl.mask.shift, j0),
                    kern::SdpaBiasFrag::at_transposed(a.bias, kern::SdpaBiasFrag::head_base(a.bias, it.b, info.x), i0,
                                                      j0, lane)};
  }

  // S^T (the raw scores) -> P^T = exp2(logit2 - lse2[query] + bias) (masked: 0), before the dP^T
  // wait, as the pure-mask consumer's P^T: scaled, softcap and ALiBi (softcap's 1 - t^2 into dlogit, or the
  // warp's region with kStash: SdpaScoreMod::softcap_t_dlogit; not written without softcap), the statistic
  // subtracted, the element mask, the bias on visible elements. The element mask is tested from the step's
  // tile mask (4 ints), not from the consumer's payload-word form of it (analytic_step_mask: 8 words). (Until
  // v2.24 this hook gave z^T and the exp2 ran after the dP^T wait, its MUFU work exposed: ALiBi's backward
  // 0.7x, softcap's 0.6x the pure-mask kernel's.)
  // region: the warp's region of shared memory (BwdSm90Layout::kBiasStage), which holds the step's bias
  // (kStageBias; else element loads) or receives softcap's 1 - t^2 (kStash).
  template <int kNQ>
  __device__ __forceinline__ static void logits(const BwdParams& p, const BwdItem& it, const Seqlen& sl, int4 info,
                                                int key_thr, const float* lse2, int lane, uint32_t region,
                                                float (&s)[kNQ][4], uint32_t (&dlogit)[kNQ][2]) {
    const StepMods m = step_mods(p, it, sl, info, key_thr, lane);
    const int qd = lane & 3;
    if constexpr (kProbsEarly && kSoftcap) {
      // Softcap (this instantiation runs the calls with it, sdpa_bwd_sm90_run.cuh): s in t units, the logits
      // c2 s, minus the statistic in one FFMA.
      m.mod.softcap_t_dlogit<kNQ>(s, p.scale_log2, m.diag, lane, dlogit);
      if constexpr (kStash) stash_dlogit<kNQ>(region, lane, dlogit);
#pragma unroll
      for (int j = 0; j < kNQ; ++j) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse2 + 8 * j + 2 * qd);
#pragma unroll
        for (int r = 0; r < 4; ++r) s[j][r] = fmaf(s[j][r], m.mod.c2, (r & 1) ? -l2.y : -l2.x);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kNQ; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) s[j][r] *= p.scale_log2;
      }
      if constexpr (!kProbsEarly) {
        m.mod.apply<kNQ>(s, m.diag, lane);
      } else {
        m.mod.add_alibi<kNQ>(s, m.diag, lane);
      }
#pragma unroll
      for (int j = 0; j < kNQ; ++j) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse2 + 8 * j + 2 * qd);
#pragma unroll
        for (int r = 0; r < 4; ++r) s[j][r] -= (r & 1) ? l2.y : l2.x;
      }
    }
    mask_partial<kNQ>(it, sl, info, key_thr, lane, s);
    if constexpr (!kProbsEarly) return;  // dropout: z^T (P^T after the dP^T wait, in grads)
    // The exp2 in each branch: after the branches' join, ptxas placed it behind the consumer's dP^T
    // wait (the exposed MUFU work this hook moved under the GEMM).
    auto exp2_all = [&] {
#pragma unroll
      for (int j = 0; j < kNQ; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) s[j][r] = kern::exp2_approx(s[j][r]);
      }
    };
    if constexpr (kStageBias) {
      const SdpaBiasParams& bp = kern::analytic_of(p).bias;
      const bool bcast = bp.row_stride == 0, bf = bp.dtype == kSdpaBiasBF16;
      if (info.z >= 0) {
        kern::SdpaBiasFrag::add_staged_transposed<kNQ, true>(s, region, lane, bcast, bf);
      } else {
        kern::SdpaBiasFrag::add_staged_transposed<kNQ, false>(s, region, lane, bcast, bf);
      }
      exp2_all();
    } else if (m.bias.p != nullptr) {
      m.bias.add(s);
      exp2_all();
    } else {
      exp2_all();
    }
  }

  // The step's Philox keep bits (sdpa_bwd_step_keep), drawn before the step's GEMMs are issued, while only
  // dK and dV are live (drawn in grads, beside S^T, dP^T, dK and dV, the ten Philox rounds spilled the
  // (128, 128) consumer).
  template <int kNQ>
  __device__ __forceinline__ static uint32_t step_keep(const BwdParams& p, const BwdItem& it, int4 info, int key_thr,
                                                       int lane) {
    return sdpa_bwd_step_keep<kNQ, kBlockQ, kBlockK>(p, it, info, key_thr, lane);
  }

  // P^T (s, logits') and dP^T (dp) -> P^T m (s) and dS^T = P^T d logit / d x (m dP^T - D[query]) (dp;
  // softcap's 1 - t^2 from logits' dlogit or its stash in the warp's region), in place, with m the element's
  // dropout multiplier (kDropout, SdpaDropoutParams; else 1): so dV takes P m, and dS is the sm80 kernels' and
  // the CPU reference's P (m dP - D). Philox: m from the step's keep bits (step_keep); the caller's mask: read
  // element by element (sdpa_dropout_mask_apply on the transposed fragment). With dBias, dS where ds_form puts
  // it (store_ds): without dropout before softcap's factor (dBias with softcap: the logits' gradient), with
  // dropout after the loop (there softcap's factor is formed per element, so dBias with softcap and
  // dropout is refused by the C layer).
  template <int kNQ>
  __device__ __forceinline__ static void grads(const BwdParams& p, const BwdItem& it, const Seqlen& sl, int4 info,
                                               int key_thr, const float* lse2, const float* delta, int lane,
                                               uint32_t keep, uint32_t region, uint32_t (&dlogit)[kNQ][2],
                                               float (&s)[kNQ][4], float (&dp)[kNQ][4]) {
    const int qd = lane & 3;
    if constexpr (kProbsEarly) {
      // s holds P^T (no dropout: m = 1). dp = P (dP - D), the gradient of the logits (dBias's dS), stored
      // with dBias; then times softcap's 1 - t^2, the gradient of the scores x (the bias is added after
      // softcap, docs/SDPA.md).
#pragma unroll
      for (int j = 0; j < kNQ; ++j) {
        const float2 dd = *reinterpret_cast<const float2*>(delta + 8 * j + 2 * qd);
#pragma unroll
        for (int r = 0; r < 4; ++r) dp[j][r] = s[j][r] * (dp[j][r] - ((r & 1) ? dd.y : dd.x));
      }
      store_ds<kNQ>(p, it, sl, info, key_thr, lane, dp);
      if (kSoftcap && kern::analytic_of(p).score.softcap2 != 0.0f) {
        if constexpr (kStash) unstash_dlogit<kNQ>(region, lane, dlogit);
#pragma unroll
        for (int j = 0; j < kNQ; ++j) {
#pragma unroll
          for (int r = 0; r < 4; ++r) dp[j][r] *= kern::SdpaScoreMod::dlogit_at<kNQ>(dlogit, j, r);
        }
      }
    } else {
      // Dropout: s holds z^T; P^T = exp2(z^T + bias), softcap's 1 - t^2 from z^T.
      const StepMods m = step_mods(p, it, sl, info, key_thr, lane);
      const int d0 = m.diag + 2 * qd - (lane >> 2);  // the offset of the thread's element (0, 0)
      auto elem = [&](int j, int r, float mult) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse2 + 8 * j + 2 * qd);
        const float2 dd = *reinterpret_cast<const float2*>(delta + 8 * j + 2 * qd);
        const float z = s[j][r];
        const float pr = kern::exp2_approx(m.bias.p != nullptr && z != -INFINITY ? z + m.bias.at2(j, r) : z);
        const int off = d0 + 8 * j + (r & 1) - 8 * (r >> 1);  // ALiBi's offset (transposed)
        const float f = m.mod.c2 != 0.0f ? m.mod.softcap_dprob(pr, z + ((r & 1) ? l2.y : l2.x), off) : pr;
        s[j][r] = pr * mult;
        dp[j][r] = f * (mult * dp[j][r] - ((r & 1) ? dd.y : dd.x));
      };
      const SdpaDropoutParams& dr = kern::analytic_of(p).dropout;
      if (dr.mode == 1) {
        kern::sdpa_dropout_keep_apply<kNQ>(keep, dr.scale, elem);
      } else if (dr.mode == 2) {
        // The caller's mask: its element (query i0 + 8 j + 2 qd + r % 2, key j0 + key_thr + 8 (r / 2)).
        kern::sdpa_dropout_mask_apply<kNQ, true>(dr, it.b, info.x, int64_t(info.y) * kBlockQ + 2 * qd,
                                                 int64_t(it.kb) * kBlockK + key_thr, sl.len_q, sl.len_k, elem);
      } else {
#pragma unroll
        for (int j = 0; j < kNQ; ++j) {
#pragma unroll
          for (int r = 0; r < 4; ++r) elem(j, r, 1.0f);
        }
      }
      store_ds<kNQ>(p, it, sl, info, key_thr, lane, dp);  // (dBias with softcap and dropout: refused)
    }
  }

  // With dBias: the step's dS = P (m dP - D) of the sample's elements (query i0 + 8 j + 2 qd + r % 2, key j0 + g +
  // 8 (r / 2)) where params.h SdpaBiasParams::ds_form puts it: stored in the workspace (scalar stores, 8
  // consecutive keys a quad column of a warp; bwd_prepost.cuh dbias_ds_row), added into the accumulator of dBias's
  // shape, or stored into dBias itself (its dtype and strides). An accumulator whose queries are broadcast
  // ((., ., 1, S_kv)) takes the sum of the thread's queries and then of the quad's (lanes 4 g .. 4 g + 3 hold
  // one key's queries): one addition a key per warp and step.
  template <int kNQ>
  __device__ __forceinline__ static void store_ds(const BwdParams& p, const BwdItem& it, const Seqlen& sl, int4 info,
                                                  int key_thr, int lane, const float (&dp)[kNQ][4]) {
    const SdpaBiasParams& bp = kern::analytic_of(p).bias;
    if (bp.dbias == nullptr) return;
    const int i = info.y * kBlockQ + 2 * (lane & 3), jk = it.kb * kBlockK + key_thr;
    const int rows = sl.len_q - i, keys = sl.len_k - jk;  // left inside the sample from the thread's element (0, 0)
    if (bp.ds_form == kDbiasDsDirect) {  // (keys contiguous: sdpa_dbias_ds_form)
      const int64_t off = kern::dbias_offset(bp, it.b, info.x, i, jk), ld = bp.dbias_stride[2];
      if (bp.dbias_dtype == kSdpaBiasF32) {
        store_direct<kNQ>(static_cast<float*>(bp.dbias) + off, ld, rows, keys, dp);
      } else if (bp.dbias_dtype == kSdpaBiasBF16) {
        store_direct<kNQ>(static_cast<__nv_bfloat16*>(bp.dbias) + off, ld, rows, keys, dp);
      } else {
        store_direct<kNQ>(static_cast<__half*>(bp.dbias) + off, ld, rows, keys, dp);
      }
      return;
    }
    const bool red = bp.ds_form == kDbiasDsAccumulate;
    float* ds = kern::dbias_ds_row(bp, p.num_heads_q, kern::analytic_of(p).max_q, it.b, info.x, i) + jk;
    if (red && bp.dbias_size[2] == 1) {
#pragma unroll
      for (int hk = 0; hk < 2; ++hk) {
        float v = 0.0f;
#pragma unroll
        for (int j = 0; j < kNQ; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (8 * j + e < rows) v += dp[j][2 * hk + e];
          }
        }
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if ((lane & 3) == 0 && 8 * hk < keys) atomicAdd(ds + 8 * hk, v);
      }
      return;
    }
    const int64_t ld = red ? bp.dbias_size[3] : bp.ds_ld;
    for_each_ds<kNQ>(rows, keys, dp, [&](int qq, int kk, float v) {
      float* dst = ds + int64_t(qq) * ld + kk;
      if (red) {
        atomicAdd(dst, v);
      } else {
        *dst = v;
      }
    });
  }

  // The thread's elements of the step's dS inside the sample: f(qq, kk, dS) for each query qq = 8 j + r % 2 and key
  // kk = 8 (r / 2) from the thread's element (0, 0) below `rows` queries and `keys` keys (store_ds's every form).
  template <int kNQ, class F>
  __device__ __forceinline__ static void for_each_ds(int rows, int keys, const float (&dp)[kNQ][4], F&& f) {
#pragma unroll
    for (int j = 0; j < kNQ; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int qq = 8 * j + (r & 1), kk = 8 * (r >> 1);
        if (qq < rows && kk < keys) f(qq, kk, dp[j][r]);
      }
    }
  }

  // The direct form's stores: the thread's elements of dBias (row pointer at the thread's element (0, 0), row
  // stride ld elements, keys contiguous), rounded to dBias's dtype T.
  template <int kNQ, class T>
  __device__ __forceinline__ static void store_direct(T* row, int64_t ld, int rows, int keys,
                                                      const float (&dp)[kNQ][4]) {
    for_each_ds<kNQ>(rows, keys, dp, [&](int qq, int kk, float v) {
      if constexpr (std::is_same_v<T, float>) {
        row[qq * ld + kk] = v;
      } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        row[qq * ld + kk] = __float2bfloat16_rn(v);
      } else {
        row[qq * ld + kk] = __float2half_rn(v);
      }
    });
  }
};

// SDPA with Philox dropout and nothing else in the main loop (no softcap, ALiBi, bias, caller mask: the
// common training call): the analytic source with the pure-mask consumer's P^T (formed under the dP^T
// GEMM, payload-word element mask), and after the dP^T wait P^T m, dS^T = P^T (m dP^T - D[query])
// (drop_grads), m the element's multiplier from the step's keep bits (sdpa_bwd_step_keep: 1 / (1 - p)
// or 0). The modifiers' dropout kernel (AnalyticModSourceBwdSm90<..., true>) forms z^T under the dP^T GEMM
// and P^T after the wait (its other modifiers' state spilled otherwise) and keeps every modifier's
// run-time test; the calls it takes here do not need them (the dropout backward 1.93x -> 1.39x the plain one,
// PERF_LOG v2.72). The keep bits are drawn before the step's GEMMs, as in the modifiers' kernel.
template <int kBk>
struct AnalyticDropSourceBwdSm90 : AnalyticSourceBwdSm90<kBk> {
  static_assert(kBk == 128, "dropout runs on the key-split consumers (head dims up to 128)");
  using Base = AnalyticSourceBwdSm90<kBk>;
  static constexpr bool kDropout = true;
  static constexpr int kBlockQ = Base::kBlockQ, kBlockK = kBk;

  template <int kNQ>
  __device__ __forceinline__ static uint32_t step_keep(const BwdParams& p, const BwdItem& it, int4 info, int key_thr,
                                                       int lane) {
    return sdpa_bwd_step_keep<kNQ, kBlockQ, kBlockK>(p, it, info, key_thr, lane);
  }

  // P^T (s) and dP^T (dp) -> P^T m (s) and dS^T = P^T (m dP^T - D[query]) (dp), in place (the modifiers'
  // grads without them: the sm80 kernels' and the CPU reference's P (m dP - D)).
  template <int kNQ>
  __device__ __forceinline__ static void drop_grads(const BwdParams& p, const float* delta, int lane, uint32_t keep,
                                                    float (&s)[kNQ][4], float (&dp)[kNQ][4]) {
    const int qd = lane & 3;
    kern::sdpa_dropout_keep_apply<kNQ>(keep, kern::analytic_of(p).dropout.scale, [&](int j, int r, float mult) {
      const float2 dd = *reinterpret_cast<const float2*>(delta + 8 * j + 2 * qd);
      dp[j][r] = s[j][r] * (mult * dp[j][r] - ((r & 1) ? dd.y : dd.x));
      s[j][r] *= mult;
    });
  }
};

#endif  // __CUDA_ARCH__

// The one rule of AnalyticModSourceBwdSm90's kStash (the kernel's instantiation and the launcher's shared
// memory, sdpa_bwd_sm90_run.cuh): the (128, 128) softcap kernel keeps its 1 - t^2 in the warps' regions.
constexpr bool sdpa_bwd_stash_dlogit(int kD, bool kDropout, bool kSoftcap, bool kStaged) {
  return kD == 128 && kSoftcap && !kDropout && !kStaged;
}

// The SDPA backward with score modifiers (AnalyticModSourceBwdSm90): softcap, ALiBi, the additive
// bias and dBias as run-time flags of an instantiation per dtype, kernel head dims kD (64 or 128,
// Dqk = Dv = kD; a call's head dims up to kD, multiples of 8) and kSoftcap (false: calls without
// softcap, which the launcher runs there), deterministic or not at run time. kDropout: the
// instantiation with dropout besides (Philox or the caller's mask; kSoftcap true), the same dtypes,
// head dims and run-time flags. kStaged: the instantiation for calls with a bias of whole chunks and
// without softcap (kSoftcap false), which stages it (AnalyticModSourceBwdSm90::kStageBias).
template <int kD, class E, bool kDropout = false, bool kSoftcap = true, bool kStaged = false>
__global__ void __launch_bounds__(BwdSm90Layout<kD>::kThreads, 1)
    sdpa_bwd_mods_kernel_sm90(const __grid_constant__ SdpaBwdParams p, const __grid_constant__ CUtensorMap tm_q,
                              const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                              const __grid_constant__ CUtensorMap tm_do) {
  static_assert(kD == 64 || kD == 128, "the modifiers' kernels: head dims (64, 64) and (128, 128)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool kStash = sdpa_bwd_stash_dlogit(kD, kDropout, kSoftcap, kStaged);
  bwd_sm90_body<kD, E, kD, AnalyticModSourceBwdSm90<BwdSm90Layout<kD>::kBlockK, kDropout, kSoftcap, kStaged, kStash>>(
      p, &tm_q, &tm_k, &tm_v, &tm_do);
#else
  __trap();
#endif
}

// The SDPA backward with Philox dropout and no score modifiers (AnalyticDropSourceBwdSm90): head dims (64, 64)
// and (128, 128) as the modifiers' kernels.
template <int kD, class E>
__global__ void __launch_bounds__(BwdSm90Layout<kD>::kThreads, 1)
    sdpa_bwd_drop_kernel_sm90(const __grid_constant__ SdpaBwdParams p, const __grid_constant__ CUtensorMap tm_q,
                              const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v,
                              const __grid_constant__ CUtensorMap tm_do) {
  static_assert(kD == 64 || kD == 128, "the dropout kernels: head dims (64, 64) and (128, 128)");
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  bwd_sm90_body<kD, E, kD, AnalyticDropSourceBwdSm90<BwdSm90Layout<kD>::kBlockK>>(p, &tm_q, &tm_k, &tm_v, &tm_do);
#else
  __trap();
#endif
}

}  // namespace flashspan::kern90

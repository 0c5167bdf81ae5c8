// The host side of one sm90 SDPA backward kernel head dim (kernel_bwd_sm90.cuh
// sdpa_bwd_kernel_sm90 and sdpa_bwd_dq_convert_kernel_sm90), included by the instantiation units
// sdpa_bwd_sm90_d{64,128,192,256}.cu: fp16 / bf16, 4 kernels a unit; with score modifiers
// (kernel_bwd_mods_sm90.cuh sdpa_bwd_mods_kernel_sm90) by sdpa_bwd_mods_sm90_d{64,128}.cu, and with
// dropout besides (sdpa_bwd_mods_kernel_sm90<..., true>) by sdpa_bwd_drop_sm90_d{64,128}.cu.
#pragma once

#include <algorithm>
#include <atomic>

#include "core/error.h"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm90/kernel_bwd_mods_sm90.cuh"
#include "kernels/sm90/kernel_bwd_sm90.cuh"
#include "kernels/sm90/launch_sm90.h"
#include "kernels/sm90/sdpa_bwd_sm90_run.h"

namespace flashspan::sm90 {

namespace bwd_detail {
// The SDPA backward kernel of a unit (only the chosen ones are instantiated): with dropout (kDropout: the
// modifiers' sdpa_bwd_mods_kernel_sm90<..., true> or the Philox-only sdpa_bwd_drop_kernel_sm90), with score modifiers (kMods:
// sdpa_bwd_mods_kernel_sm90, the softcap-capable one or, for calls without softcap, the one without),
// (kD, kDv) = (64, 64) or (128, 128) for both, or the pure-mask one.
// Form (kMods): 0 without softcap, 1 with softcap, 2 a staged bias without softcap (kStaged: a 16-bit
// bias of whole chunks, SdpaBiasParams::chunks).
// Form (kDropout): 0 the modifiers' dropout kernel, 1 the Philox-only dropout kernel (launch_sm90.h
// sdpa_bwd_dropout_philox_kernel: Philox calls without modifiers).
// Order (the pure-mask (128, 128) kernel): bwd_gemm_order_128's (the kernel's kOrder): 0, 4 or, experimental,
// 12, 20, 28, 36, 44.
// kernel_order: the pure-mask kernel's kOrder (count_bwd_order_launch), untouched for the others.
template <int kD, class E, int kDv, bool kWideTile, bool kMods, bool kDropout>
auto sdpa_kernel(int form, int order, int& kernel_order) {
  (void)order;
  (void)kernel_order;
  if constexpr (kDropout) {
    static_assert(kMods && kD == kDv && kD <= 128 && !kWideTile, "the dropout kernels: (64, 64) and (128, 128)");
    return form == 1 ? kern90::sdpa_bwd_drop_kernel_sm90<kD, E> : kern90::sdpa_bwd_mods_kernel_sm90<kD, E, true>;
  } else if constexpr (kMods) {
    static_assert(kD == kDv && kD <= 128 && !kWideTile, "the modifiers' kernels: (64, 64) and (128, 128)");
    if (form == 2) return kern90::sdpa_bwd_mods_kernel_sm90<kD, E, false, false, true>;
    return form == 1 ? kern90::sdpa_bwd_mods_kernel_sm90<kD, E, false, true>
                     : kern90::sdpa_bwd_mods_kernel_sm90<kD, E, false, false>;
  } else {
    (void)form;
    auto kernel = kern90::sdpa_bwd_kernel_sm90<kD, E, kDv, kWideTile>;
    kernel_order = 0;
    if constexpr (kern90::kHasBwdOrder240<kD, kDv, kWideTile>) {
      kern90::for_bwd_order240(order, [&](auto o) {
        kernel = kern90::sdpa_bwd_kernel_sm90<kD, E, kDv, kWideTile, o.value>;
        kernel_order = o.value;
      });
    }
    return kernel;
  }
}
}  // namespace bwd_detail

// The persistent grid over the AnalyticBwdGrid's B * ceil(S_kv / kBlockK) * max(H_k, H_v) cells (one
// CTA per SM; tile_sm90.h sdpa_bwd_item_heads_sm90), then dq = scale * dq_accum.
template <int kD, int kDv, bool kWideTile, bool kMods, bool kDropout>
void run_sdpa_bwd_sm90(const SdpaBwdParams& p, DType dtype, const CUtensorMap& mq, const CUtensorMap& mk,
                       const CUtensorMap& mv, const CUtensorMap& mdo, cudaStream_t s) {
  using L = kern90::BwdSm90Layout<kD, kDv, kWideTile>;
  with_element_type(dtype, "sdpa backward (sm90)", [&](auto e) {
    using E = decltype(e);
    const int item_heads = sdpa_bwd_item_heads_sm90(p.num_heads_q, p.group_size, p.analytic.score.group_v);
    const int64_t items = int64_t(p.analytic.num_k_blocks) * item_heads * p.batch;
    if (items > 0) {
      const AnalyticMaskParams& am = p.analytic;
      const bool softcap = am.score.softcap2 != 0.0f;
      const bool staged = kMods && !kDropout && !softcap && am.bias.bias != nullptr && am.bias.chunks != 0;
      const int form = kDropout ? (sdpa_bwd_dropout_philox_kernel(am) ? 1 : 0) : staged ? 2 : softcap ? 1 : 0;
      // The pure-mask (128, 128) kernel's register split and GEMM order (bwd_gemm_order_128), in its slot of the
      // caches below, which the other kernels index by form.
      const int order = !kMods && kern90::kHasBwdOrder240<kD, kDv, kWideTile> ? bwd_gemm_order_128(bwd_gemm_order()) : 0;
      const int slot = kMods ? form : bwd_gemm_order_slot(order);
      int kernel_order = -1;  // (a pure-mask kernel's kOrder: counted below)
      auto kernel = bwd_detail::sdpa_kernel<kD, E, kDv, kWideTile, kMods, kDropout>(form, order, kernel_order);
      // The staged bias's kernel stages it after the rest (BwdSm90Layout::kBiasStage), where the (128, 128) softcap
      // kernel (form 1 without dropout) keeps its 1 - t^2 (kernel_bwd_mods_sm90.cuh AnalyticModSourceBwdSm90's kStash).
      static_assert(!kMods || L::kBytesBias <= 232448, "sdpa backward (sm90): the bias stage does not fit");
      const bool regions = staged || (kMods && kern90::sdpa_bwd_stash_dlogit(kD, kDropout, softcap, false));
      const int smem = regions ? L::kBytesBias : L::kBytes;
      static_assert(kBwdGemmOrderSlots >= 3, "sdpa backward (sm90): a slot for each form");
      static std::atomic<uint64_t> smem_set[kBwdGemmOrderSlots] = {};
      ensure_smem_limit(kernel, smem, smem_set[slot], "sdpa backward (sm90): cudaFuncSetAttribute");
      static std::atomic<int> ctas_cache[kBwdGemmOrderSlots][64];
      const int ctas = persistent_ctas(kernel, L::kThreads, smem, ctas_cache[slot], "sdpa backward (sm90)");
      const unsigned grid = unsigned(std::min<int64_t>(ctas, items));
      kernel<<<grid, L::kThreads, smem, s>>>(p, mq, mk, mv, mdo);
      check_launch("sdpa backward (sm90)");
      if (kernel_order >= 0 && !L::kColSplit && !L::kT3) count_bwd_order_launch(kernel_order);
    }
    if (p.total_q > 0) {
      kern90::sdpa_bwd_dq_convert_kernel_sm90<kD, E, kDv>
          <<<grid_stride_1d(int64_t(p.num_heads_q) * p.total_q, 8), 256, 0, s>>>(p);
      check_launch("sdpa backward dQ convert (sm90)");
    }
  });
}

#define FLASHSPAN_SM90_SDPA_BWD_INSTANTIATE(DQK, DV, WIDE)                                                          \
  template void run_sdpa_bwd_sm90<DQK, DV, WIDE, false, false>(const SdpaBwdParams&, DType, const CUtensorMap&,      \
                                                               const CUtensorMap&, const CUtensorMap&,               \
                                                               const CUtensorMap&, cudaStream_t);
// The score modifiers' kernels of head dims (D, D), D = 64 or 128 (sdpa_bwd_mods_sm90_d{64,128}.cu).
#define FLASHSPAN_SM90_SDPA_BWD_MODS_INSTANTIATE(D)                                                                 \
  template void run_sdpa_bwd_sm90<D, D, false, true, false>(const SdpaBwdParams&, DType, const CUtensorMap&,        \
                                                            const CUtensorMap&, const CUtensorMap&,                  \
                                                            const CUtensorMap&, cudaStream_t);
// The dropout kernels (with score modifiers; Philox-only) of head dims (D, D), D = 64 or 128
// (sdpa_bwd_drop_sm90_d{64,128}.cu).
#define FLASHSPAN_SM90_SDPA_BWD_DROP_INSTANTIATE(D)                                                                 \
  template void run_sdpa_bwd_sm90<D, D, false, true, true>(const SdpaBwdParams&, DType, const CUtensorMap&,         \
                                                           const CUtensorMap&, const CUtensorMap&,                   \
                                                           const CUtensorMap&, cudaStream_t);

}  // namespace flashspan::sm90

// The host side of one sm90 forward kernel head-dim pair (kernel_fwd_sm90.cuh), included by the
// instantiation units fwd_sm90_d{64,128,192,256}.cu (one unit per kernel head dims, so that the
// CI's two cores compile them side by side): the persistent launch, with the split schedule of
// long walks when the caller gave a workspace (count, scan, item list, the persistent kernel,
// the combine of split tasks: the arch-neutral kernels of fwd_split.cuh through
// kernels/common/fwd_launch.h); fp16 / bf16, max_logit off / on, and the consumer schedule; the
// SDPA kernels (analytic mask), 16-bit and FP8.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "core/error.h"
#include "kernels/common/fwd_launch.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm90/fwd_sm90_run.h"
#include "kernels/sm90/kernel_fwd_sm90.cuh"
#include "kernels/sm90/launch_sm90.h"

namespace flashspan::sm90 {

namespace fwd_detail {

// The persistent grid: one CTA per SM (the kernel's 384 threads fill an SM's register file;
// launch_util.h, persistent_ctas), capped by SplitSchedule::kMaxCtas.
template <int kDqk, int kDv, class E, bool kMaxLogit, bool kOverlap>
void run(const FwdParams& p, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
         cudaStream_t stream) {
  using L = kern90::FwdSm90Layout<kDqk, kDv>;
  auto kernel = kern90::flex_fwd_kernel_sm90<kDqk, kDv, E, kMaxLogit, kOverlap>;
  static std::atomic<uint64_t> smem_set{0};
  ensure_smem_limit(kernel, L::kBytes, smem_set, "sm90 forward: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  static std::atomic<int> ctas_cache[64];
  const int ctas = persistent_ctas(kernel, kern90::kThreads, L::kBytes, ctas_cache, "sm90 forward: persistent grid");
  if (p.split_schedule) {
    FwdParams ps = p;
    ps.split.num_ctas = ctas;
    launch_fwd_split_schedule(ps, true, stream);
    kernel<<<unsigned(ctas), kern90::kThreads, L::kBytes, stream>>>(ps, mq, mk, mv);
    check_launch("flex forward (sm90)");
    launch_fwd_split_combine(ps, E::kDType, stream);
    return;
  }
  const int64_t items = p.grid_mode ? p.view.num_q_blocks * (p.num_heads_q / p.pack) : p.view.num_tasks;
  const unsigned grid = unsigned(std::min<int64_t>(ctas, items));
  kernel<<<grid, kern90::kThreads, L::kBytes, stream>>>(p, mq, mk, mv);
  check_launch("flex forward (sm90)");
}


template <int kDqk, int kDv, class E, bool kMaxLogit>
void run_o(const FwdParams& p, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
           cudaStream_t s) {
  if (fwd_overlap_sm90()) {
    run<kDqk, kDv, E, kMaxLogit, true>(p, mq, mk, mv, s);
  } else {
    run<kDqk, kDv, E, kMaxLogit, false>(p, mq, mk, mv, s);
  }
}

// The SDPA kernel of a unit: its mask source with score modifiers and dropout (kDropout), with score
// modifiers (kMods: the one with the bias's code or, for calls without a bias, the one without) or
// without (only the chosen ones are instantiated).
template <int kDqk, int kDv, class E, bool kOverlap, bool kMods, bool kDropout>
auto sdpa_kernel(bool bias) {
  if constexpr (kDropout) {
    static_assert(kMods, "the dropout kernels are the modifiers' with dropout");
    (void)bias;
    return kern90::sdpa_fwd_kernel_sm90<kDqk, kDv, E, kOverlap, kern90::AnalyticDropSourceSm90>;
  } else if constexpr (kMods) {
    return bias ? kern90::sdpa_fwd_kernel_sm90<kDqk, kDv, E, kOverlap, kern90::AnalyticModSourceSm90>
                : kern90::sdpa_fwd_kernel_sm90<kDqk, kDv, E, kOverlap, kern90::AnalyticModNoBiasSourceSm90>;
  } else {
    (void)bias;
    return kern90::sdpa_fwd_kernel_sm90<kDqk, kDv, E, kOverlap, kern90::AnalyticSourceSm90>;
  }
}

}  // namespace fwd_detail

template <int kDqk, int kDv>
void run_fwd_sm90(const FwdParams& p, DType dtype, const CUtensorMap& mq, const CUtensorMap& mk, const CUtensorMap& mv,
                  cudaStream_t s) {
  const bool ml = p.max_logit != nullptr;
  with_element_type(dtype, "flex forward (sm90)", [&](auto e) {
    using E = decltype(e);
    ml ? fwd_detail::run_o<kDqk, kDv, E, true>(p, mq, mk, mv, s) : fwd_detail::run_o<kDqk, kDv, E, false>(p, mq, mk, mv, s);
  });
}

template <int kDqk, int kDv>
int fwd_smem_bytes_of() {
  return kern90::FwdSm90Layout<kDqk, kDv>::kBytes;
}

template <int kDqk, int kDv>
int fwd_binary_version_of() {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kern90::flex_fwd_kernel_sm90<kDqk, kDv, BFloat16, false, false>) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return attr.binaryVersion;
}

// SDPA (analytic mask, kernel_fwd_sm90.cuh sdpa_fwd_kernel_sm90): the persistent grid over the
// AnalyticGrid's B * ceil(S_q / 128) * H_q cells; no split schedule. The consumer schedule is
// the plan kernels' default, overlapped with ping-pong, for both (64, 64) and (128, 128)
// (PERF_LOG v2.0; FLASHSPAN_SM90_OVERLAP does not switch it); max_logit tested at run time. 2 kernels (fp16, bf16)
// a unit: the pure-mask kernels (sdpa_fwd_kernel_sm90 with AnalyticSourceSm90), or with kMods the ones
// with score modifiers, sinks and the epilogue options (with AnalyticModSourceSm90, and for calls
// without a bias AnalyticModNoBiasSourceSm90: 4 kernels), or with kDropout too those with dropout
// besides (with AnalyticDropSourceSm90), each in its own unit.
template <int kDqk, int kDv, bool kMods, bool kDropout>
void run_sdpa_fwd_sm90(const SdpaFwdParams& p, DType dtype, const CUtensorMap& mq, const CUtensorMap& mk,
                       const CUtensorMap& mv, const CUtensorMap& mbias, cudaStream_t s) {
  using L = kern90::FwdSm90Layout<kDqk, kDv>;
  constexpr bool kOverlap = true;
  with_element_type(dtype, "sdpa forward (sm90)", [&](auto e) {
    using E = decltype(e);
    const int bias = p.analytic.bias.bias != nullptr ? 1 : 0;
    auto kernel = fwd_detail::sdpa_kernel<kDqk, kDv, E, kOverlap, kMods, kDropout>(bias == 1);
    // The bias kernels stage the bias after the rest (FwdSm90Layout::kBiasStage); the dropout kernel
    // is one for calls with and without a bias, so it always has the stage (one size per kernel).
    const int smem = bias == 1 || kDropout ? L::kBytesBias : L::kBytes;
    static_assert(!kMods || L::kBytesBias <= 232448, "sdpa forward (sm90): the bias stage does not fit");
    static std::atomic<uint64_t> smem_set[2] = {0, 0};
    ensure_smem_limit(kernel, smem, smem_set[bias], "sdpa forward (sm90): cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    static std::atomic<int> ctas_cache[2][64];
    const int ctas = persistent_ctas(kernel, kern90::kThreads, smem, ctas_cache[bias], "sdpa forward (sm90): persistent grid");
    const int64_t items = int64_t(p.analytic.num_q_blocks) * p.num_heads_q * p.batch;
    const unsigned grid = unsigned(std::min<int64_t>(ctas, items));
    kernel<<<grid, kern90::kThreads, smem, s>>>(p, mq, mk, mv, mbias);
    check_launch("sdpa forward (sm90)");
  });
}

// The SDPA forward over paged K/V caches (kernel_fwd_sm90.cuh sdpa_fwd_paged_kernel_sm90, and for calls with a bias
// sdpa_fwd_paged_bias_kernel_sm90, experimental, (128, 128) only: kBias): the persistent grid over the AnalyticGrid's
// cells as run_sdpa_fwd_sm90's, the layout without the bias stage, or with it for the bias kernel. 2 kernels a
// unit (fp16, bf16), 4 in the (128, 128) unit.
template <int kDqk, int kDv, bool kBias>
void run_sdpa_fwd_paged_sm90_of(const SdpaPagedFwdSm90Params& p, DType dtype, const CUtensorMap& mq,
                                const CUtensorMap& mk, const CUtensorMap& mv, const CUtensorMap& mbias,
                                cudaStream_t s) {
  using L = kern90::FwdSm90Layout<kDqk, kDv>;
  constexpr int kSmem = kBias ? L::kBytesBias : L::kBytes;
  static_assert(kSmem <= 232448, "sdpa paged forward (sm90): the bias stage does not fit");
  with_element_type(dtype, "sdpa paged forward (sm90)", [&](auto e) {
    using E = decltype(e);
    static std::atomic<uint64_t> smem_set{0};
    static std::atomic<int> ctas_cache[64];
    auto go = [&](auto kernel, auto... bias_map) {
      ensure_smem_limit(kernel, kSmem, smem_set,
                        "sdpa paged forward (sm90): cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      const int ctas =
          persistent_ctas(kernel, kern90::kThreads, kSmem, ctas_cache, "sdpa paged forward (sm90): persistent grid");
      const int64_t items = int64_t(p.analytic.num_q_blocks) * p.num_heads_q * p.batch;
      kernel<<<unsigned(std::min<int64_t>(ctas, items)), kern90::kThreads, kSmem, s>>>(p, mq, mk, mv, bias_map...);
    };
    if constexpr (kBias) {
      go(kern90::sdpa_fwd_paged_bias_kernel_sm90<kDqk, kDv, E>, mbias);
    } else {
      (void)mbias;
      go(kern90::sdpa_fwd_paged_kernel_sm90<kDqk, kDv, E>);
    }
    check_launch("sdpa paged forward (sm90)");
  });
}

template <int kDqk, int kDv>
void run_sdpa_fwd_paged_sm90(const SdpaPagedFwdSm90Params& p, DType dtype, const CUtensorMap& mq,
                             const CUtensorMap& mk, const CUtensorMap& mv, const CUtensorMap& mbias, cudaStream_t s) {
  if constexpr (kDqk == 128 && kDv == 128) {
    if (p.analytic.bias.bias != nullptr) {
      run_sdpa_fwd_paged_sm90_of<kDqk, kDv, true>(p, dtype, mq, mk, mv, mbias, s);
      return;
    }
  } else {
    // (launch_sdpa_fwd_paged_sm90 runs every call with a bias on the (128, 128) bias kernel.)
    FS_CHECK(p.analytic.bias.bias == nullptr, Status::kInternal,
             "sdpa paged forward (sm90): a bias reached a kernel without the bias");
  }
  run_sdpa_fwd_paged_sm90_of<kDqk, kDv, false>(p, dtype, mq, mk, mv, mbias, s);
}

// The SDPA FP8 forward (kernel_fwd_sm90.cuh sdpa_fp8_fwd_kernel_sm90, experimental): p as
// launch_sdpa_fp8_fwd_sm90 completes it (the V^T pre-pass has run on the stream; mvt its map);
// the persistent grid over the AnalyticGrid's cells as run_sdpa_fwd_sm90's. 2 kernels a unit
// (E4M3, E5M2: the wgmma and cvt forms are the format's), from the format code.
template <int kDqk, int kDv>
void run_sdpa_fp8_fwd_sm90(const SdpaFp8FwdParams& p, const CUtensorMap& mq, const CUtensorMap& mk,
                           const CUtensorMap& mvt, cudaStream_t s) {
  using L = kern90::FwdSm90Layout<kDqk, kDv, 1>;
  with_fp8_type(p.fp8.format, "sdpa fp8 forward (sm90)", [&](auto e) {
    using E = decltype(e);
    auto kernel = kern90::sdpa_fp8_fwd_kernel_sm90<kDqk, kDv, E>;
    static std::atomic<uint64_t> smem_set{0};
    ensure_smem_limit(kernel, L::kBytes, smem_set, "sdpa fp8 forward (sm90): cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    static std::atomic<int> ctas_cache[64];
    const int ctas = persistent_ctas(kernel, kern90::kThreads, L::kBytes, ctas_cache, "sdpa fp8 forward (sm90): persistent grid");
    const int64_t items = int64_t(p.analytic.num_q_blocks) * p.num_heads_q * p.batch;
    kernel<<<unsigned(std::min<int64_t>(ctas, items)), kern90::kThreads, L::kBytes, s>>>(p, mq, mk, mvt);
    check_launch("sdpa fp8 forward (sm90)");
  });
}

#define FLASHSPAN_SM90_SDPA_FWD_PAGED_INSTANTIATE(D)                                                               \
  template void run_sdpa_fwd_paged_sm90<D, D>(const SdpaPagedFwdSm90Params&, DType, const CUtensorMap&,           \
                                              const CUtensorMap&, const CUtensorMap&, const CUtensorMap&,          \
                                              cudaStream_t);

#define FLASHSPAN_SM90_SDPA_FP8_FWD_INSTANTIATE(D)                                                                 \
  template void run_sdpa_fp8_fwd_sm90<D, D>(const SdpaFp8FwdParams&, const CUtensorMap&, const CUtensorMap&,       \
                                            const CUtensorMap&, cudaStream_t);

#define FLASHSPAN_SM90_SDPA_FWD_INSTANTIATE(DQK, DV, MODS)                                                         \
  template void run_sdpa_fwd_sm90<DQK, DV, MODS, false>(const SdpaFwdParams&, DType, const CUtensorMap&,           \
                                                        const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, \
                                                        cudaStream_t);
// The kernels with score modifiers and dropout of head dims (D, D), D = 64 or 128 (sdpa_fwd_drop_sm90_d{64,128}.cu).
#define FLASHSPAN_SM90_SDPA_FWD_DROP_INSTANTIATE(D)                                                                \
  template void run_sdpa_fwd_sm90<D, D, true, true>(const SdpaFwdParams&, DType, const CUtensorMap&,               \
                                                    const CUtensorMap&, const CUtensorMap&, const CUtensorMap&,     \
                                                    cudaStream_t);

#define FLASHSPAN_SM90_FWD_INSTANTIATE(DQK, DV)                                                                    \
  template void run_fwd_sm90<DQK, DV>(const FwdParams&, DType, const CUtensorMap&, const CUtensorMap&,             \
                                      const CUtensorMap&, cudaStream_t);                                           \
  template int fwd_smem_bytes_of<DQK, DV>();                                                                       \
  template int fwd_binary_version_of<DQK, DV>();

}  // namespace flashspan::sm90

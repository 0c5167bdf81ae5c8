// Instantiations and launch of the sm80 SDPA forward (analytic mask, kernel_fwd_sm80.cuh
// sdpa_fwd_kernel_sm80): the forward tiles of the flex kernels (with_fwd_traits_sm80, no
// decode tile) x {fp16, bf16} x {mask only, features} (max_logit tested at run time, no split
// schedule): 24 kernels. A call without the main loop's features (params.h
// sdpa_fwd_has_features) runs the mask-only kernel, whose loop is the flex kernel's (the
// features instantiation's carries every feature's code as run-time flags: 5x the loop's
// instructions, the scale not folded into the softmax's exponent).
#include <atomic>

#include "core/env_switch.h"
#include "kernels/common/grid.h"
#include "kernels/sm80/kernel_fwd_sm80.cuh"
#include "kernels/common/fwd_launch.h"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::sm80 {
namespace {

std::atomic<int> g_features_override{-1};
std::atomic<int64_t> g_fwd_mask_only_launches{0};

template <class T, class E, bool kFeatures>
void run_sdpa_fwd(const SdpaFwdParams& p_in, cudaStream_t stream) {
  static_assert(T::kSmemBytes == fwd_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
  if constexpr (!kFeatures) g_fwd_mask_only_launches.fetch_add(1, std::memory_order_relaxed);
  SdpaFwdParams p = p_in;
  p.analytic.num_q_blocks = (p.analytic.max_q + T::kBlockQ - 1) / T::kBlockQ;
  if (p.analytic.num_q_blocks == 0 || p.batch == 0) return;
  auto kernel = kern::sdpa_fwd_kernel_sm80<T, E, kFeatures>;
  static std::atomic<uint64_t> smem_set{0};
  ensure_smem_limit(kernel, T::kSmemBytes, smem_set, "sdpa forward: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  // Cells (query block, query head, sample), the kernel's order (AnalyticGrid).
  const unsigned grid = grid_2d_folded(int64_t(p.batch) * p.analytic.num_q_blocks, p.num_heads_q, "sdpa forward");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
  check_launch("sdpa forward (sm80)");
}

}  // namespace

void set_sdpa_sm80_features_forced(int on) {
  g_features_override.store(on < 0 ? -1 : (on ? 1 : 0), std::memory_order_relaxed);
}

bool sdpa_sm80_features_forced() {
  const int o = g_features_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  return env_flag_on("FLASHSPAN_SDPA_SM80_FEATURES");
}

int64_t sdpa_fwd_mask_only_launches() { return g_fwd_mask_only_launches.load(std::memory_order_relaxed); }

void launch_sdpa_fwd_sm80(const SdpaFwdParams& p, const TileSm80& tile, DType dtype, cudaStream_t stream) {
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  launch_sdpa_fwd_rng_dump(p, stream);
  const bool features = sdpa_fwd_has_features(p) || sdpa_sm80_features_forced();
  kern::with_fwd_traits_sm80<false>(tile, p.head_dqk, p.head_dv, [&](auto t) {
    with_element_type(dtype, "sdpa forward (sm80)", [&](auto e) {
      if (features) {
        run_sdpa_fwd<decltype(t), decltype(e), true>(p, stream);
      } else {
        run_sdpa_fwd<decltype(t), decltype(e), false>(p, stream);
      }
    });
  });
}

}  // namespace flashspan::sm80

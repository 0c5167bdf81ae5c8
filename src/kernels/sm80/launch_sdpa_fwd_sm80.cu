// Instantiations and launch of the sm80 SDPA forward (analytic mask, kernel_fwd_sm80.cuh
// sdpa_fwd_kernel_sm80): the forward tiles of the flex kernels (with_fwd_traits_sm80, no
// decode tile) x {fp16, bf16}, one kernel each (max_logit tested at run time, no split
// schedule): 12 kernels.
#include "kernels/common/grid.h"
#include "kernels/sm80/kernel_fwd_sm80.cuh"
#include "kernels/common/fwd_launch.h"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::sm80 {
namespace {

template <class T, class E>
void run_sdpa_fwd(const SdpaFwdParams& p_in, cudaStream_t stream) {
  static_assert(T::kSmemBytes == fwd_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
  SdpaFwdParams p = p_in;
  p.analytic.num_q_blocks = (p.analytic.max_q + T::kBlockQ - 1) / T::kBlockQ;
  if (p.analytic.num_q_blocks == 0 || p.batch == 0) return;
  auto kernel = kern::sdpa_fwd_kernel_sm80<T, E>;
  static std::atomic<uint64_t> smem_set{0};
  ensure_smem_limit(kernel, T::kSmemBytes, smem_set, "sdpa forward: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  // (query block of a sample, query head) folded into x (grid.h); cell x = b * nqb + qb.
  const unsigned grid = grid_2d_folded(int64_t(p.batch) * p.analytic.num_q_blocks, p.num_heads_q, "sdpa forward");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
  check_launch("sdpa forward (sm80)");
}

}  // namespace

void launch_sdpa_fwd_sm80(const SdpaFwdParams& p, const TileSm80& tile, DType dtype, cudaStream_t stream) {
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  kern::with_fwd_traits_sm80<false>(tile, p.head_dqk, p.head_dv, [&](auto t) {
    with_element_type(dtype, "sdpa forward (sm80)", [&](auto e) { run_sdpa_fwd<decltype(t), decltype(e)>(p, stream); });
  });
}

}  // namespace flashspan::sm80

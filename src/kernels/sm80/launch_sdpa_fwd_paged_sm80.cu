// Instantiations and launch of the sm80 SDPA forward over paged K/V caches (analytic mask,
// PagedKv gathers: kernel_fwd_sm80.cuh sdpa_fwd_paged_kernel_sm80): the forward tiles of the
// flex kernels (with_fwd_traits_sm80, no decode tile) x {fp16, bf16}, 12 kernels, in a unit of
// their own so that the unpaged SDPA forward (launch_sdpa_fwd_sm80.cu) is compiled as before.
#include "kernels/common/grid.h"
#include "kernels/sm80/kernel_fwd_sm80.cuh"
#include "kernels/common/fwd_launch.h"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::sm80 {
namespace {

template <class T, class E>
void run_sdpa_fwd_paged(const SdpaPagedFwdParams& p_in, cudaStream_t stream) {
  static_assert(T::kSmemBytes == fwd_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
  SdpaPagedFwdParams p = p_in;
  p.analytic.num_q_blocks = (p.analytic.max_q + T::kBlockQ - 1) / T::kBlockQ;
  if (p.analytic.num_q_blocks == 0 || p.batch == 0) return;
  auto kernel = kern::sdpa_fwd_paged_kernel_sm80<T, E>;
  static std::atomic<uint64_t> smem_set{0};
  ensure_smem_limit(kernel, T::kSmemBytes, smem_set,
                    "sdpa paged forward: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  // (query block of a sample, query head) folded into x (grid.h); cell x = b * nqb + qb.
  const unsigned grid =
      grid_2d_folded(int64_t(p.batch) * p.analytic.num_q_blocks, p.num_heads_q, "sdpa paged forward");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
  check_launch("sdpa paged forward (sm80)");
}

}  // namespace

void launch_sdpa_fwd_paged_sm80(const SdpaPagedFwdParams& p, const TileSm80& tile, DType dtype, cudaStream_t stream) {
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  launch_sdpa_fwd_rng_dump(p, stream);  // dropout's keep mask (experimental with paged K/V: sdpa_support.cpp)
  kern::with_fwd_traits_sm80<false>(tile, p.head_dqk, p.head_dv, [&](auto t) {
    with_element_type(dtype, "sdpa paged forward (sm80)",
                      [&](auto e) { run_sdpa_fwd_paged<decltype(t), decltype(e)>(p, stream); });
  });
}

}  // namespace flashspan::sm80

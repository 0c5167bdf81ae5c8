// Instantiations and launch of the sm80 SDPA backward (analytic mask, kernel_bwd_sm80.cuh):
// preprocess (D, lse2), dK/dV (sdpa_bwd_dkdv_kernel_sm80; it also adds dS K into the fp32 dQ
// accumulator when not deterministic), then the dQ convert or, deterministic, the ordered
// dQ kernel (sdpa_bwd_dq_kernel_sm80); with dBias, the dS workspace cleared first and summed
// into dBias last, dSink after the preprocess (launch_bwd_common.h, both families' launchers).
// The backward tiles of the flex kernels (with_bwd_traits_sm80) x {fp16, bf16} x {mask only,
// features}: 48 main kernels. A call without the main loops' features (params.h
// sdpa_bwd_has_features) runs the mask-only kernels, whose loops are the flex kernels' (the
// features instantiation's carry every feature's code as run-time flags: the dK/dV loop 6x the
// instructions, P's exp2 twice, the P store before the dP GEMM); dBias together with softcap a third
// dK/dV kernel of the features (kDsBeforeSoftcap): 24 more.
// No split schedule: one CTA per (key block, kv head) of every sample, in AnalyticBwdGrid's order.
#include <atomic>

#include "kernels/common/bwd_prepost.cuh"
#include "kernels/common/grid.h"
#include "kernels/common/launch_bwd_common.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm80/kernel_bwd_sm80.cuh"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::sm80 {
namespace {

std::atomic<int64_t> g_bwd_mask_only_launches{0};

template <class T, class E, bool kFeatures>
void run_sdpa_bwd(const SdpaBwdParams& p_in, cudaStream_t stream) {
  static_assert(T::kSmemBytes == bwd_dkdv_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
  static_assert(T::kSmemBytesQ == bwd_dq_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
  if constexpr (!kFeatures) g_bwd_mask_only_launches.fetch_add(1, std::memory_order_relaxed);
  SdpaBwdParams p = p_in;
  p.analytic.num_q_blocks = (p.analytic.max_q + T::kBlockQ - 1) / T::kBlockQ;
  p.analytic.num_k_blocks = (p.analytic.max_kv + T::kBlockK - 1) / T::kBlockK;
  auto dkdv = kern::sdpa_bwd_dkdv_kernel_sm80<T, E, kFeatures>;
  auto dq = kern::sdpa_bwd_dq_kernel_sm80<T, E, kFeatures>;
  static std::atomic<uint64_t> dkdv_set{0}, dq_set{0}, dkdv_ds_set{0};
  // dBias together with softcap (check_dbias_with_softcap let it through): the dK/dV kernel that
  // stores dBias's dS before softcap's factor (kernel_bwd_sm80.cuh AnalyticMaskBwdSm80 kDsBeforeSoftcap), an
  // instantiation of its own so that the features kernels' code stays as it was.
  bool ds_before_softcap = false;
  if constexpr (kFeatures) {
    ds_before_softcap = p.analytic.bias.ds != nullptr && p.analytic.score.softcap2 != 0.0f;
    if (ds_before_softcap) dkdv = kern::sdpa_bwd_dkdv_kernel_sm80<T, E, true, true>;
  }
  ensure_smem_limit(dkdv, T::kSmemBytes, ds_before_softcap ? dkdv_ds_set : dkdv_set,
                    "sdpa backward dK/dV: cudaFuncSetAttribute");
  if (p.deterministic) ensure_smem_limit(dq, T::kSmemBytesQ, dq_set, "sdpa backward dQ: cudaFuncSetAttribute");
  if (p.analytic.num_k_blocks > 0) {
    // Cells (key block, kv head, sample), the kernel's order (AnalyticBwdGrid). H_k != H_v
    // (features only): a dK pass over the K heads and a dV pass over the V heads
    // (SdpaScoreParams::dkdv_role).
    const bool two = p.group_size != p.analytic.score.group_v;
    for (int role = two ? 1 : 0; role <= (two ? 2 : 0); ++role) {
      SdpaBwdParams pr = p;
      pr.analytic.score.dkdv_role = role;
      const int heads = p.num_heads_q / (role == 2 ? p.analytic.score.group_v : p.group_size);
      const unsigned grid = grid_2d_folded(int64_t(p.batch) * p.analytic.num_k_blocks, heads, "sdpa backward dK/dV");
      dkdv<<<grid, T::kThreads, T::kSmemBytes, stream>>>(pr);
      check_launch("sdpa backward dK/dV (sm80)");
    }
  }
  if (p.total_q == 0) return;
  if (!p.deterministic) {
    // One warp per (query row, head), grid-stride (bwd_prepost.cuh).
    kern::sdpa_bwd_dq_convert_kernel<E><<<grid_stride_1d(int64_t(p.num_heads_q) * p.total_q, 8), 256, 0, stream>>>(p);
    check_launch("sdpa backward dQ convert (sm80)");
  } else {
    // Cells (query block, query head, sample), the kernel's order (AnalyticGrid).
    dq<<<grid_2d_folded(int64_t(p.batch) * p.analytic.num_q_blocks, p.num_heads_q, "sdpa backward dQ"), T::kThreadsQ,
         T::kSmemBytesQ, stream>>>(p);
    check_launch("sdpa backward dQ (sm80)");
  }
}

}  // namespace

int64_t sdpa_bwd_mask_only_launches() { return g_bwd_mask_only_launches.load(std::memory_order_relaxed); }

void launch_sdpa_bwd_sm80(const SdpaBwdParams& p, const TileSm80& tile, DType dtype, cudaStream_t stream) {
  // dBias's dS in the workspace only (the other forms are the sm90 backward's kernel's: dispatch's
  // sdpa_dbias_ds_form), checked before anything is written.
  FS_CHECK(p.analytic.bias.ds_form == kDbiasDsWorkspace, Status::kInternal,
           "sdpa backward (sm80): a dBias form other than the workspace reached the sm80 launcher");
  // dBias with softcap (sdpa_dispatch.cu check_dbias_with_softcap lets it through with
  // sdpa_dbias_softcap_sm80_enabled, on unless FLASHSPAN_SDPA_DBIAS_SOFTCAP=0): the dK/dV kernel's dS holds
  // softcap's factor, so its kDsBeforeSoftcap instantiation (run_sdpa_bwd) stores P in the dS workspace at the logits
  // step and P (dP - D) over it at the dS step (kernel_bwd_sm80.cuh). Such a call has the bias: the features kernels
  // (sdpa_bwd_has_features).
  if (p.total_q > 0) {
    if (!p.deterministic) {
      check_cuda(cudaMemsetAsync(p.dq_accum, 0,
                                 sizeof(float) * size_t(p.num_heads_q) * size_t(p.total_q) * size_t(p.head_dqk), stream),
                 "sdpa backward: clearing the dQ accumulator");
    }
    // head_dv / 8 lanes per (query row, head), grid-stride (bwd_prepost.cuh).
    launch_sdpa_bwd_preprocess(p, dtype, stream, "sdpa backward preprocess (sm80)");
  }
  // dBias: the dK/dV kernel stores dS of the samples' visited elements into the zeroed workspace.
  launch_sdpa_bwd_ds_clear(p, stream);
  launch_sdpa_bwd_dsink(p, stream);
  // Output gate: the dK/dV and dQ kernels read the preprocess's dO * sigmoid(G) as their dO.
  const SdpaBwdParams pk = sdpa_bwd_main_params(p);
  const bool features = sdpa_bwd_has_features(pk) || sdpa_sm80_features_forced();
  kern::with_bwd_traits_sm80(tile, p.head_dqk, p.head_dv, [&](auto t) {
    with_element_type(dtype, "sdpa backward (sm80)", [&](auto e) {
      if (features) {
        run_sdpa_bwd<decltype(t), decltype(e), true>(pk, stream);
      } else {
        run_sdpa_bwd<decltype(t), decltype(e), false>(pk, stream);
      }
    });
  });
  launch_sdpa_bwd_dbias(p, stream);
}

}  // namespace flashspan::sm80

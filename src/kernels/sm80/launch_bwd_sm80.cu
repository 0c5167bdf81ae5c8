// Instantiations and launch of the sm80 flex backward kernels (preprocess, dK/dV, dQ):
// head-dim tiles {64, 128, (192,128), 256} x {fp16, bf16}.
//
// dQ: deterministic = false accumulates dS K in fp32 with atomics inside the dK/dV kernel
// (5 GEMMs in all); deterministic = true runs the separate ordered dQ kernel (7 GEMMs).
// dK/dV: deterministic = false with a task list runs the split schedule (bwd_split.cuh)
// and a persistent dK/dV grid; otherwise one CTA per task (or grid cell), as before.
#include <algorithm>

#include "kernels/common/grid.h"
#include "kernels/common/launch_bwd_common.h"
#include "kernels/sm80/kernel_bwd_sm80.cuh"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::sm80 {
namespace {

// Split schedule + persistent dK/dV + conversion of the split tasks' rows.
template <class T, class E>
void run_dkdv_split(const BwdParams& p_in, cudaStream_t stream) {
  auto dkdv = kern::flex_bwd_dkdv_kernel_sm80<T, E>;
  static std::atomic<int> ctas_cache[64];
  BwdParams p = p_in;
  p.split.num_ctas = persistent_ctas(dkdv, T::kThreads, T::kSmemBytes, ctas_cache, "flex backward dK/dV");
  launch_bwd_split_schedule(p, stream);
  dkdv<<<grid_1d(p.split.num_ctas, "flex backward dK/dV, persistent"), T::kThreads, T::kSmemBytes, stream>>>(p);
  check_launch("flex backward dK/dV, persistent (sm80)");
  launch_bwd_split_convert(p, E::kDType, stream);
}

template <class T, class E>
void run_bwd(const BwdParams& p, const BwdLaunchSm80& cfg, cudaStream_t stream) {
  static_assert(T::kSmemBytes == bwd_dkdv_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
  static_assert(T::kSmemBytesQ == bwd_dq_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
  auto dkdv = kern::flex_bwd_dkdv_kernel_sm80<T, E>;
  auto dq = kern::flex_bwd_dq_kernel_sm80<T, E>;
  static std::atomic<uint64_t> dkdv_set{0}, dq_set{0};
  ensure_smem_limit(dkdv, T::kSmemBytes, dkdv_set, "flex backward dK/dV: cudaFuncSetAttribute");
  if (p.deterministic) ensure_smem_limit(dq, T::kSmemBytesQ, dq_set, "flex backward dQ: cudaFuncSetAttribute");
  if (p.split_schedule) {
    run_dkdv_split<T, E>(p, stream);
  } else if (cfg.num_bwd_tasks > 0) {
    // Grid mode: (key block, kv head) folded into x (grid.h); task mode: one CTA per task.
    const unsigned grid =
        p.grid_mode ? grid_2d_folded(p.view.num_k_blocks, p.num_heads_q / p.group_size, "flex backward dK/dV (grid mode)")
                    : grid_1d(cfg.num_bwd_tasks, "flex backward dK/dV (tasks)");
    dkdv<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
    check_launch("flex backward dK/dV (sm80)");
  }
  if (!p.deterministic) {
    launch_bwd_dq_convert(p, E::kDType, cfg.total_q, stream);
  } else if (cfg.num_q_blocks > 0) {
    // (query block, query head) folded into x (grid.h).
    dq<<<grid_2d_folded(cfg.num_q_blocks, p.num_heads_q, "flex backward dQ"), T::kThreadsQ, T::kSmemBytesQ,
         stream>>>(p);
    check_launch("flex backward dQ (sm80)");
  }
}

template <class T>
void run_bwd_dtype(const BwdParams& p, DType dtype, const BwdLaunchSm80& cfg, cudaStream_t stream) {
  with_element_type(dtype, "flex backward (sm80)", [&](auto e) { run_bwd<T, decltype(e)>(p, cfg, stream); });
}

}  // namespace

void launch_bwd_sm80(const BwdParams& p, const TileSm80& tile, DType dtype, const BwdLaunchSm80& cfg,
                     cudaStream_t stream) {
  launch_bwd_preprocess(p, dtype, cfg.total_q, stream);
  kern::with_bwd_traits_sm80(tile, p.head_dqk, p.head_dv,
                             [&](auto t) { run_bwd_dtype<decltype(t)>(p, dtype, cfg, stream); });
}

}  // namespace flashspan::sm80

// Instantiations and launch of the sm80 flex forward kernel: head-dim tiles
// {64, 128, (192,128), 256} x {fp16, bf16} x {max_logit off, on}, plus branch-free variants
// of the 64 and 128 tiles for head dims equal to the tile's; and the 16 x 64 decode tile
// (packed decode plans, consumer_for_plan) on the 128 head-dim tile, exact and predicated
// x {fp16, bf16}, max_logit tested at run time (FwdTraitsSm80::kMaxLogitAtRunTime).
// Each variant is a one-CTA-per-task and a persistent kernel.
// With a split schedule (p.split_schedule, task mode with a workspace): count, scan, items,
// the persistent forward grid and the combine of split tasks (fwd_split.cuh, launched through
// kernels/common/fwd_launch.h).
// Packed GQA is a run-time row mapping (FwdParams::pack), not an instantiation.
#include "kernels/common/fwd_launch.h"
#include "kernels/common/grid.h"
#include "kernels/sm80/kernel_fwd_sm80.cuh"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::sm80 {
namespace {

template <class T, class E, bool kMaxLogit>
void run_fwd(const FwdParams& p, int num_tasks, cudaStream_t stream) {
  static_assert(T::kSmemBytes == fwd_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
  auto kernel = kern::flex_fwd_kernel_sm80<T, E, kMaxLogit>;
  static std::atomic<uint64_t> smem_set{0};
  ensure_smem_limit(kernel, T::kSmemBytes, smem_set, "flex forward: cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  if (p.split_schedule) {
    // Split schedule (fwd_split.cuh). Whether any task is split is decided on the
    // device (scan kernel): the one-CTA-per-task kernel runs when none is, the persistent
    // kernel and the combine when some are; the other kernel's CTAs exit at once.
    auto persistent = kern::flex_fwd_persistent_kernel_sm80<T, E, kMaxLogit>;
    static std::atomic<uint64_t> smem_set_p{0};
    ensure_smem_limit(persistent, T::kSmemBytes, smem_set_p,
                      "flex forward (persistent): cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    static std::atomic<int> ctas_cache[64];
    FwdParams ps = p;
    ps.split.num_ctas = persistent_ctas(persistent, T::kThreads, T::kSmemBytes, ctas_cache, "flex forward (persistent)");
    launch_fwd_split_schedule(ps, false, stream);
    kernel<<<grid_1d(ps.split.num_tasks, "flex forward (tasks)"), T::kThreads, T::kSmemBytes, stream>>>(ps);
    check_launch("flex forward (sm80)");
    persistent<<<grid_1d(ps.split.num_ctas, "flex forward, persistent"), T::kThreads, T::kSmemBytes, stream>>>(ps);
    check_launch("flex forward, persistent (sm80)");
    launch_fwd_split_combine(ps, E::kDType, stream);
    return;
  }
  // Grid mode: (query block, task head) folded into x (grid.h); task heads are the kv heads
  // when packed. Task mode: one CTA per task.
  const unsigned grid = p.grid_mode ? grid_2d_folded(p.view.num_q_blocks, p.num_heads_q / p.pack, "flex forward (grid mode)")
                                    : grid_1d(num_tasks, "flex forward (tasks)");
  kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
  check_launch("flex forward (sm80)");
}

template <class T, class E>
void run_fwd_ml(const FwdParams& p, int num_tasks, cudaStream_t stream) {
  if constexpr (T::kMaxLogitAtRunTime) {
    run_fwd<T, E, true>(p, num_tasks, stream);
  } else if (p.max_logit != nullptr) {
    run_fwd<T, E, true>(p, num_tasks, stream);
  } else {
    run_fwd<T, E, false>(p, num_tasks, stream);
  }
}

template <class T>
void run_fwd_dtype(const FwdParams& p, DType dtype, int num_tasks, cudaStream_t stream) {
  with_element_type(dtype, "flex forward (sm80)", [&](auto e) { run_fwd_ml<T, decltype(e)>(p, num_tasks, stream); });
}

}  // namespace

void launch_fwd_sm80(const FwdParams& p, const TileSm80& tile, DType dtype, int num_tasks, cudaStream_t stream) {
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  if (p.view.num_q_blocks == 0 || (!p.grid_mode && num_tasks == 0)) return;
  kern::with_fwd_traits_sm80<true>(tile, p.head_dqk, p.head_dv,
                                   [&](auto t) { run_fwd_dtype<decltype(t)>(p, dtype, num_tasks, stream); });
}

}  // namespace flashspan::sm80

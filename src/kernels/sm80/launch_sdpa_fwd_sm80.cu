// Instantiations and launch of the sm80 SDPA forward (analytic mask, kernel_fwd_sm80.cuh
// sdpa_fwd_kernel_sm80): the forward tiles of the flex kernels (with_fwd_traits_sm80, no
// decode tile) x {fp16, bf16} x {mask only, features} (max_logit tested at run time, no split
// schedule): 24 kernels. A call without the main loop's features (params.h
// sdpa_fwd_has_features) runs the mask-only kernel, whose loop is the flex kernel's (the
// features instantiation's carries every feature's code as run-time flags: 5x the loop's
// instructions, the scale not folded into the softmax's exponent).
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "kernels/common/grid.h"
#include "kernels/sm80/kernel_fwd_sm80.cuh"
#include "kernels/common/fwd_launch.h"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::kern {
namespace {

// rng_dump (SdpaDropoutParams, Philox): the keep mask of every element of [B, H_q, S_q, S_kv], 1 / 0,
// 0 outside the samples; one thread per element, grid-stride (the forward kernel's own draws are
// the same Philox words: core/philox.h is the one generator).
__global__ void __launch_bounds__(256) sdpa_fwd_rng_dump_kernel(const SdpaFwdParams p) {
  const SdpaDropoutParams& dp = p.analytic.dropout;
  const int64_t Sq = p.analytic.max_q, Skv = p.analytic.max_kv, H = p.num_heads_q;
  const int64_t total = int64_t(p.batch) * H * Sq * Skv;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % Skv, i = (e / Skv) % Sq, h = (e / (Skv * Sq)) % H, b = e / (Skv * Sq * H);
    const int lq = sample_length(p.analytic.seq_len_q, p.analytic.cu_seq_len_q, p.analytic.max_q, int(b));
    const int lk = sample_length(p.analytic.seq_len_kv, p.analytic.cu_seq_len_kv, p.analytic.max_kv, int(b));
    const bool keep = i < lq && j < lk && sdpa_dropout_keep(dp, uint32_t(b * H + h), i, j);
    const int64_t off = b * dp.dump_stride[0] + h * dp.dump_stride[1] + i * dp.dump_stride[2] + j * dp.dump_stride[3];
    switch (dp.dump_dtype) {
      case kSdpaMaskU8: static_cast<unsigned char*>(dp.rng_dump)[off] = keep ? 1 : 0; break;
      case kSdpaMaskF32: static_cast<float*>(dp.rng_dump)[off] = keep ? 1.0f : 0.0f; break;
      case kSdpaMaskBF16: static_cast<unsigned short*>(dp.rng_dump)[off] = keep ? 0x3F80 : 0; break;
      default: static_cast<unsigned short*>(dp.rng_dump)[off] = keep ? 0x3C00 : 0; break;
    }
  }
}

}  // namespace
}  // namespace flashspan::kern

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
  const char* e = std::getenv("FLASHSPAN_SDPA_SM80_FEATURES");
  return e != nullptr && std::strcmp(e, "1") == 0;
}

int64_t sdpa_fwd_mask_only_launches() { return g_fwd_mask_only_launches.load(std::memory_order_relaxed); }

void launch_sdpa_fwd_sm80(const SdpaFwdParams& p, const TileSm80& tile, DType dtype, cudaStream_t stream) {
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  if (p.analytic.dropout.rng_dump != nullptr) {
    const int64_t total = int64_t(p.batch) * p.num_heads_q * p.analytic.max_q * p.analytic.max_kv;
    if (total > 0) {
      kern::sdpa_fwd_rng_dump_kernel<<<grid_stride_1d(total, 256), 256, 0, stream>>>(p);
      check_launch("sdpa forward rng_dump (sm80)");
    }
  }
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

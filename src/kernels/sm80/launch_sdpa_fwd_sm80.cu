// Instantiations and launch of the sm80 SDPA forward (analytic mask, kernel_fwd_sm80.cuh
// sdpa_fwd_kernel_sm80): the forward tiles of the flex kernels (with_fwd_traits_sm80, no
// decode tile) x {fp16, bf16}, one kernel each (max_logit tested at run time, no split
// schedule): 12 kernels.
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
  if (p.analytic.dropout.rng_dump != nullptr) {
    const int64_t total = int64_t(p.batch) * p.num_heads_q * p.analytic.max_q * p.analytic.max_kv;
    if (total > 0) {
      kern::sdpa_fwd_rng_dump_kernel<<<grid_stride_1d(total, 256), 256, 0, stream>>>(p);
      check_launch("sdpa forward rng_dump (sm80)");
    }
  }
  kern::with_fwd_traits_sm80<false>(tile, p.head_dqk, p.head_dv, [&](auto t) {
    with_element_type(dtype, "sdpa forward (sm80)", [&](auto e) { run_sdpa_fwd<decltype(t), decltype(e)>(p, stream); });
  });
}

}  // namespace flashspan::sm80

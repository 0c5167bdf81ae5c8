// The forward's arch-neutral kernels (fwd_split.cuh, SDPA's rng_dump) and their launches (fwd_launch.h).
#include "kernels/common/fwd_launch.h"

#include "kernels/common/fwd_split.cuh"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"
#include "kernels/common/sdpa_score_mod.cuh"

namespace flashspan::kern {
namespace {

// rng_dump (SdpaDropoutParams, Philox): the keep mask of every element of [B, H_q, S_q, S_kv], 1 / 0,
// 0 outside the samples; one thread per element, grid-stride (the forward kernels' own draws are
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

// score_max / score_sum_exp (SdpaEpilogueParams; padded [B, H_q, S_q, 1]) beside a packed O: the rows
// [len_q, S_q) of each sample and query head, which no block of the forward covers (a packed O's blocks
// stop at the sample), get the values of a row that sees nothing: -inf and 0. One thread per row,
// grid-stride; rows inside the sample are the forward's and are not touched.
__global__ void __launch_bounds__(256) sdpa_fwd_stats_padding_kernel(const SdpaFwdParams p) {
  const AnalyticMaskParams& a = p.analytic;
  const SdpaEpilogueParams& ep = a.epi;
  const int64_t Sq = a.max_q, H = p.num_heads_q;
  const int64_t total = int64_t(p.batch) * H * Sq;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e % Sq, h = (e / Sq) % H;
    const int b = int(e / (Sq * H));
    if (i < sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, b)) continue;
    if (ep.score_max != nullptr) {
      ep.score_max[sample_start(a.start[kSdpaScoreMax], b) + h * ep.sma.head_stride + i * ep.sma.row_stride] = -INFINITY;
    }
    if (ep.score_sum_exp != nullptr) {
      ep.score_sum_exp[sample_start(a.start[kSdpaScoreSumExp], b) + h * ep.ssa.head_stride + i * ep.ssa.row_stride] =
          0.0f;
    }
  }
}

}  // namespace
}  // namespace flashspan::kern

namespace flashspan {
namespace {

__global__ void fill_neg_inf_kernel(float* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) p[i] = -INFINITY;
}

}  // namespace

void launch_max_logit_reset(float* max_logit, int heads, cudaStream_t stream) {
  fill_neg_inf_kernel<<<grid_1d((int64_t(heads) + 127) / 128, "flex forward: max_logit reset"), 128, 0, stream>>>(
      max_logit, heads);
  check_launch("flex forward: max_logit reset");
}

void launch_fwd_split_schedule(const FwdParams& p, bool items_always, cudaStream_t stream) {
  const unsigned tasks = grid_1d(p.split.num_tasks, "flex forward (tasks)");
  kern::flex_fwd_split_count_kernel<<<grid_1d((int64_t(tasks) + 255) / 256, "flex forward split count"), 256, 0,
                                      stream>>>(p);
  check_launch("flex forward split count");
  kern::split_scan_kernel<true><<<1, kern::kSplitScanThreads, 0, stream>>>(p.split);
  check_launch("flex forward split scan");
  if (items_always) {
    kern::flex_fwd_split_items_kernel<true><<<tasks, 256, 0, stream>>>(p);
  } else {
    kern::flex_fwd_split_items_kernel<false><<<tasks, 256, 0, stream>>>(p);
  }
  check_launch("flex forward split items");
}

void launch_fwd_split_combine(const FwdParams& p, DType dtype, cudaStream_t stream) {
  const unsigned tasks = grid_1d(p.split.num_tasks, "flex forward (tasks)");
  with_element_type(dtype, "flex forward split combine", [&](auto e) {
    kern::flex_fwd_split_combine_kernel<decltype(e)><<<tasks, 256, 0, stream>>>(p);
  });
  check_launch("flex forward split combine");
}

void launch_sdpa_fwd_rng_dump(const SdpaFwdParams& p, cudaStream_t stream) {
  if (p.analytic.dropout.rng_dump == nullptr) return;
  const int64_t total = int64_t(p.batch) * p.num_heads_q * p.analytic.max_q * p.analytic.max_kv;
  if (total > 0) {
    kern::sdpa_fwd_rng_dump_kernel<<<grid_stride_1d(total, 256), 256, 0, stream>>>(p);
    check_launch("sdpa forward rng_dump");
  }
}

void launch_sdpa_fwd_stats_padding(const SdpaFwdParams& p, cudaStream_t stream) {
  const SdpaEpilogueParams& ep = p.analytic.epi;
  if (p.analytic.start[kSdpaO].ragged.ptr == nullptr || (ep.score_max == nullptr && ep.score_sum_exp == nullptr)) return;
  const int64_t total = int64_t(p.batch) * p.num_heads_q * p.analytic.max_q;
  if (total > 0) {
    kern::sdpa_fwd_stats_padding_kernel<<<grid_stride_1d(total, 256), 256, 0, stream>>>(p);
    check_launch("sdpa forward score_max / score_sum_exp padding");
  }
}

}  // namespace flashspan

// The FP8 SDPA forward on the sm80 kernels (cuDNN's sdpa_fp8; params.h SdpaFp8FwdSm80Params, the formulas
// at SdpaFp8Params and in docs/SDPA.md "FP8 SDPA"), every GPU from sm_80 (none before sm_89 has an FP8
// instruction: conversions by kernels/common/fp8_soft.h); on an H100 / H200 the calls the sm90 FP8
// forward does not take (dispatch/sdpa_family.cpp sdpa_fp8_fwd_sm80_refusal says what this one takes).
// On by default since its GPU tests passed on an H200 (PERF_LOG v2.36; FLASHSPAN_SDPA_FP8_SM80=0 turns it off).
//
// The same exactness as the FP8 backward on these kernels (launch_sdpa_fp8_bwd_sm80.cu): every FP8 value is
// a bf16 value and a product of two bf16 values is exact in fp32, so the bf16 mma.sync on the codes forms
// the products an FP8 GEMM forms; the graph's rounding of P sits between the GEMMs, where the kernel holds
// fp32 (kernel_fwd_sm80.cuh Fp8FwdSm80). Speed: a bf16 forward's, less the software rounding of P.
//
// Steps, one stream, no host sync (amax_s and amax_o zeroed first):
//   1. widen    (kernels/common/fp8_prepass.cu) the codes of q, k, v as bf16 into the workspace ([B, H, S, D] each);
//   2. forward  sdpa_fp8_fwd_kernel_sm80: the SDPA forward's cells and mask-only loop (AnalyticMaskSm80
//               without features) with Fp8FwdSm80's steps; O, the LSE, the statistics outputs and the amaxes.
#include <atomic>

#include "kernels/common/fp8_prepass.h"
#include "kernels/common/fwd_launch.h"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm80/kernel_fwd_sm80.cuh"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::kern {
namespace {

// 2. One CTA per (query block, query head, sample) cell in the SDPA forward's order (AnalyticGrid), the
// analytic mask without features (causal / padding: the FP8 validation's masks), max_logit tested at run time.
template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) sdpa_fp8_fwd_kernel_sm80(const SdpaFp8FwdSm80Params p) {
  extern __shared__ __align__(128) uint8_t smem[];
  const WorkItem w = AnalyticGrid{p.analytic.num_q_blocks, p.num_heads_q, p.batch}.next(0);  // cell blockIdx.x
  Fp8FwdSm80 f8 = Fp8FwdSm80::make(p);
  fwd_item<T, BFloat16, true, false, AnalyticMaskSm80<T, false>, ContiguousKv, Fp8FwdSm80>(
      p, smem_u32(smem), nullptr, w.block, w.head, w.batch, 0, 0x7fffffff, &f8);
  f8.flush(p.fp8, threadIdx.x & 31);  // (fwd_item returns CTA-uniformly: every lane of every warp gets here)
}

}  // namespace
}  // namespace flashspan::kern

namespace flashspan::sm80 {

void launch_sdpa_fp8_fwd_sm80(const SdpaFp8FwdSm80Params& p_in, const TileSm80& tile, cudaStream_t stream) {
  using namespace kern;
  SdpaFp8FwdSm80Params p = p_in;
  FS_CHECK((p.fp8.format == 1 || p.fp8.format == 2) && (p.fp8.o_format >= 0 && p.fp8.o_format <= 2) &&
               p.fp8.amax_s != nullptr && p.fp8.amax_o != nullptr &&
               p.analytic.score.group_v > 0 && p.num_heads_q % p.analytic.score.group_v == 0,
           Status::kInternal, "sdpa fp8 forward (sm80): parameters outside what it runs (formats, amaxes, heads)");
  // The amaxes are maxima of non-negative values reduced with atomics: zero first.
  check_cuda(cudaMemsetAsync(p.fp8.amax_s, 0, sizeof(float), stream), "sdpa fp8 forward (sm80): amax_s reset");
  check_cuda(cudaMemsetAsync(p.fp8.amax_o, 0, sizeof(float), stream), "sdpa fp8 forward (sm80): amax_o reset");
  if (p.max_logit != nullptr) launch_max_logit_reset(p.max_logit, p.num_heads_q, stream);
  // 1. The bf16 copies the 16-bit loop reads (SdpaFwdParams q, k, v point at them; V with its own H_v heads,
  // which the loop addresses by h / group_v: kv_addr.cuh v_head).
  const int hk = p.num_heads_q / p.group_size, hv = p.num_heads_q / p.analytic.score.group_v;
  const int f = p.fp8.format;
  Fp8WidenJobs jobs{{fp8_widen_job(p.q8, p.q, p.batch, p.num_heads_q, p.analytic.max_q, p.head_dqk, f),
                     fp8_widen_job(p.k8, p.k, p.batch, hk, p.analytic.max_kv, p.head_dqk, f),
                     fp8_widen_job(p.v8, p.v, p.batch, hv, p.analytic.max_kv, p.head_dv, f)}};
  // Packed (THD) inputs (unless FLASHSPAN_SDPA_FP8_THD=0; GPU tests passed on an H200): each sample from its ragged
  // start, the copy padded to S (zeros past the sample); the loop reads the copies as padded tensors. A packed o and
  // stats are the epilogue's (its rows' sample starts, as the 16-bit forward's).
  const AnalyticMaskParams& a = p.analytic;
  for (int t = 0; t < 3; ++t) {
    if (p.start8[t].ragged.ptr == nullptr) continue;
    jobs.job[t] = fp8_widen_job_ragged(jobs.job[t], p.start8[t], t == 0 ? a.seq_len_q : a.seq_len_kv,
                                       t == 0 ? a.cu_seq_len_q : a.cu_seq_len_kv);
  }
  launch_fp8_widen(jobs, 3, stream);
  // 2. The forward on the sm80 tile of the head dims (tile_sm80.h).
  with_fwd_traits_sm80<false>(tile, p.head_dqk, p.head_dv, [&](auto t) {
    using T = decltype(t);
    static_assert(T::kSmemBytes == fwd_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
    p.analytic.num_q_blocks = (p.analytic.max_q + T::kBlockQ - 1) / T::kBlockQ;
    if (p.analytic.num_q_blocks == 0 || p.batch == 0) return;
    auto kernel = sdpa_fp8_fwd_kernel_sm80<T>;
    static std::atomic<uint64_t> smem_set{0};
    ensure_smem_limit(kernel, T::kSmemBytes, smem_set,
                      "sdpa fp8 forward (sm80): cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    const unsigned grid =
        grid_2d_folded(int64_t(p.batch) * p.analytic.num_q_blocks, p.num_heads_q, "sdpa fp8 forward (sm80)");
    kernel<<<grid, T::kThreads, T::kSmemBytes, stream>>>(p);
    check_launch("sdpa fp8 forward (sm80)");
  });
}

}  // namespace flashspan::sm80

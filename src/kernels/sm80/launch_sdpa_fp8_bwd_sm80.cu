// The FP8 SDPA backward on the sm80 kernels (cuDNN's sdpa_fp8_backward; params.h SdpaFp8BwdParams, the
// formulas in docs/SDPA.md "FP8 SDPA"), every GPU from sm_80 (none of which before sm_89 has an FP8
// instruction: conversions by kernels/common/fp8_soft.h). On by default since its GPU tests passed on an
// H200 (PERF_LOG v2.36; FLASHSPAN_SDPA_FP8_BWD=0 turns it off; dispatch/sdpa_family.cpp sdpa_fp8_bwd_refusal
// says what it takes). On an sm_90 device the sm90 FP8 backward (kernels/sm90/sdpa_fp8_bwd_sm90.h) takes the
// calls where its switch is on; steps 1-3 below are the pre-pass both share (kernels/common/fp8_prepass.h).
//
// Why the 16-bit kernels can run it exactly: every FP8 value is a bf16 value, and the product of two bf16
// values is exact in fp32, so a bf16 mma.sync on the codes of two FP8 tensors gives the products an FP8
// tensor-core GEMM gives (both accumulate in fp32). The FP8 graph's own roundings sit between the GEMMs,
// where the kernel holds fp32 values: S8 = fp8_q(P scale_s) before dV's GEMM and dP8 = fp8_dO(dP scale_dP)
// before dK's and dQ's (kernel_bwd_sm80.cuh, Fp8BwdSm80); the descale factors multiply the fp32 sums in the
// epilogues. Speed: a bf16 backward's (the FP8 tensor cores of sm_89 / sm_90 are not used).
//
// Steps, one stream, no host sync:
//   1. factors  (one thread)  the factors' products (params.h Fp8BwdDerived) into the workspace; the four
//                             amax outputs zeroed;
//   2. widen    (grid-stride, fp8_prepass.cu) the codes of q, k, v, dO as bf16 into the workspace
//                             ([B, H, S, D] each);
//   3. delta    (a warp a row) D = descale_dO descale_o dO . o of the raw codes and lse2 = stats log2(e)
//                             (+inf for a row without keys), the 16-bit backward's workspace rows;
//   4. dK/dV    sdpa_fp8_bwd_dkdv_kernel_sm80 (the SDPA dK/dV kernel's cells and loop, Fp8BwdSm80): dK,
//                             dV and their amaxes, amax_dP; unless deterministic, dP8 K added into the zeroed
//                             fp32 dQ accumulator;
//   5. dQ       (grid-stride) dQ = accumulator descale_dP descale_k, its amax, stored fp8(dQ scale_dQ); or,
//                             deterministic, sdpa_fp8_bwd_dq_kernel_sm80 (the SDPA dQ kernel's cells, its
//                             ordered key walk, the same FP8 steps, the FP8 epilogue).
#include <atomic>

#include "kernels/common/fp8_prepass.h"
#include "kernels/common/fp8_soft.h"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm80/kernel_bwd_sm80.cuh"
#include "kernels/sm80/launch_sm80.h"

namespace flashspan::kern {
namespace {

// 5. dQ from the fp32 accumulator ([H_q, B S_q, D_qk], the atomic path's rows), its amax, FP8 codes.
__global__ void __launch_bounds__(256) fp8_bwd_dq_kernel(const SdpaFp8BwdParams p) {
  const int sq = p.analytic.max_q, heads = p.num_heads_q, pairs = p.head_dqk / 2;
  const int64_t total = int64_t(p.batch) * heads * sq * pairs;
  const float unit = __ldg(p.derived + kF8dDqUnit), sc = __ldg(p.derived + kF8dScaleDQ);
  const bool e5 = p.grad_format == 2;
  uint8_t* dq8 = static_cast<uint8_t*>(p.dq8.data);
  float m = 0.0f;
  for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < total; x += int64_t(gridDim.x) * blockDim.x) {
    const int c = 2 * int(x % pairs);
    int64_t r = x / pairs;  // (b, h, i) row
    const int i = int(r % sq);
    r /= sq;
    const int h = int(r % heads);
    const int b = int(r / heads);
    const float2 a = *reinterpret_cast<const float2*>(p.dq_accum + (int64_t(h) * p.total_q + int64_t(b) * sq + i) *
                                                                        p.head_dqk + c);
    const float x0 = a.x * unit, x1 = a.y * unit;
    m = fmaxf(m, fmaxf(fabsf(x0), fabsf(x1)));
    uint8_t* dst = dq8 + int64_t(b) * p.dq8.batch_stride + int64_t(h) * p.dq8.head_stride +
                   int64_t(i) * p.dq8.row_stride + c;
    dst[0] = uint8_t(fp8_soft_encode(x0 * sc, e5));
    dst[1] = uint8_t(fp8_soft_encode(x1 * sc, e5));
  }
  fp8_amax_flush(p.amax[kFp8AmaxDQ], m, threadIdx.x & 31);
}

}  // namespace
}  // namespace flashspan::kern

namespace flashspan::sm80 {

void launch_sdpa_fp8_bwd_sm80(const SdpaFp8BwdParams& p_in, const TileSm80& tile, cudaStream_t stream) {
  using namespace kern;
  SdpaFp8BwdParams p = p_in;
  launch_sdpa_fp8_bwd_prepass(p, stream);
  const int sq = p.analytic.max_q, skv = p.analytic.max_kv;
  if (p.total_q > 0 && !p.deterministic) {
    check_cuda(cudaMemsetAsync(p.dq_accum, 0,
                               sizeof(float) * size_t(p.num_heads_q) * size_t(p.total_q) * size_t(p.head_dqk), stream),
               "sdpa fp8 backward: clearing the dQ accumulator");
  }
  // 4. dK / dV (and dP8 K into the accumulator) on the sm80 backward's tile of the head dims (tile_sm80.h);
  // deterministic: then the ordered dQ kernel (5).
  with_bwd_traits_sm80(tile, p.head_dqk, p.head_dv, [&](auto t) {
    using T = decltype(t);
    if constexpr (T::kDqk <= 128 && T::kDv <= 128) {
      static_assert(T::kSmemBytes == bwd_dkdv_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
      static_assert(T::kSmemBytesQ == bwd_dq_smem_bytes(T::kBlockQ, T::kBlockK, T::kDqk, T::kDv));
      p.analytic.num_q_blocks = (sq + T::kBlockQ - 1) / T::kBlockQ;
      p.analytic.num_k_blocks = (skv + T::kBlockK - 1) / T::kBlockK;
      if (p.analytic.num_k_blocks > 0) {
        auto dkdv = sdpa_fp8_bwd_dkdv_kernel_sm80<T>;
        static std::atomic<uint64_t> dkdv_set{0};
        ensure_smem_limit(dkdv, T::kSmemBytes, dkdv_set, "sdpa fp8 backward dK/dV: cudaFuncSetAttribute");
        // Cells (key block, kv head, sample). H_k != H_v (on by default since PERF_LOG v2.40): a dK pass over the K heads and a dV pass
        // over the V heads (SdpaScoreParams::dkdv_role, the 16-bit SDPA backward's passes), dQ added in the first.
        const bool two = p.group_size != p.analytic.score.group_v;
        for (int role = two ? 1 : 0; role <= (two ? 2 : 0); ++role) {
          SdpaFp8BwdParams pr = p;
          pr.analytic.score.dkdv_role = role;
          const int heads = p.num_heads_q / (role == 2 ? p.analytic.score.group_v : p.group_size);
          const unsigned grid =
              grid_2d_folded(int64_t(p.batch) * p.analytic.num_k_blocks, heads, "sdpa fp8 backward dK/dV");
          dkdv<<<grid, T::kThreads, T::kSmemBytes, stream>>>(pr);
          check_launch("sdpa fp8 backward dK/dV (sm80)");
        }
      }
      if (p.deterministic && p.total_q > 0) {
        auto dq = sdpa_fp8_bwd_dq_kernel_sm80<T>;
        static std::atomic<uint64_t> dq_set{0};
        ensure_smem_limit(dq, T::kSmemBytesQ, dq_set, "sdpa fp8 backward dQ: cudaFuncSetAttribute");
        dq<<<grid_2d_folded(int64_t(p.batch) * p.analytic.num_q_blocks, p.num_heads_q, "sdpa fp8 backward dQ"),
             T::kThreadsQ, T::kSmemBytesQ, stream>>>(p);
        check_launch("sdpa fp8 backward dQ (sm80)");
      }
    } else {
      FS_CHECK(false, Status::kInternal, "sdpa fp8 backward: head dims (", p.head_dqk, ", ", p.head_dv,
               ") above 128 reached the launcher (sdpa_fp8_bwd_refusal)");
    }
  });
  if (p.total_q > 0 && !p.deterministic) {
    fp8_bwd_dq_kernel<<<grid_stride_1d(int64_t(p.num_heads_q) * p.total_q * (p.head_dqk / 2), 256), 256, 0, stream>>>(p);
    check_launch("sdpa fp8 backward: dQ");
  }
}

}  // namespace flashspan::sm80

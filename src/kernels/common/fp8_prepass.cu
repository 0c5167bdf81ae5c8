// The FP8 SDPA pre-passes (fp8_prepass.h), arch-neutral kernels of every FP8 launcher that runs 16-bit kernels on
// bf16 copies of the FP8 codes: the widening (both FP8 launchers of the sm80 family, the FP8 backward's pre-pass)
// and the FP8 backward's pre-pass (the sm80 FP8 backward, kernels/sm80/launch_sdpa_fp8_bwd_sm80.cu, and the
// sm90 one, kernels/sm90/sdpa_fp8_bwd_sm90.cu). Conversions by fp8_soft.h (no FP8 instruction before sm_89).
//
// The backward's pre-pass, one stream, no host sync:
//   1. factors  (one thread)  the factors' products (params.h Fp8BwdDerived) into the workspace; the four
//                             amax outputs zeroed;
//   2. widen    (grid-stride) the codes of q, k, v, dO as bf16 into the workspace ([B, H, S, D] each);
//   3. delta    (a warp a row) D = descale_dO descale_o dO . o of the raw codes and lse2 = stats log2(e)
//                             (+inf for a row without keys), the 16-bit backward's workspace rows.
#include <algorithm>
#include <cstdint>

#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/common/experimental_switch.h"
#include "kernels/common/fp8_prepass.h"
#include "kernels/common/fp8_soft.h"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"
#include "kernels/common/ptx.cuh"

namespace flashspan::kern {
namespace {

// Job blockIdx.y: an FP8 tensor [B, heads, rows, cols] (byte strides) widened to bf16 [B, heads, rows, cols]
// contiguous at dst (cols even: pairs); grid-stride over the pairs. kRagged (experimental, not yet run on a GPU): the
// jobs' sources may be ragged (Fp8WidenJob::ragged: sample starts from offsets, rows past a sample's length written
// as zeros, never read).
template <bool kRagged>
__global__ void __launch_bounds__(256) fp8_widen_kernel(const Fp8WidenJobs jobs) {
  const Fp8WidenJob& j = jobs.job[blockIdx.y];
  const int pairs = j.cols / 2;
  const int64_t total = int64_t(j.batch) * j.heads * j.rows * pairs;
  const uint8_t* src = static_cast<const uint8_t*>(j.src.data);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % pairs);
    int64_t r = i / pairs;  // (b, h, s) row
    const int s = int(r % j.rows);
    r /= j.rows;
    const int h = int(r % j.heads);
    const int b = int(r / j.heads);
    int64_t sample = int64_t(b) * j.src.batch_stride;  // the sample's first element (byte)
    if constexpr (kRagged) {
      if (j.ragged) {
        if (s >= sample_length(j.seq_len, j.cu_seq_len, j.rows, b)) {
          j.dst[i] = 0u;  // past the sample: zeros (the kernels mask these rows; a packed source has none there)
          continue;
        }
        sample = sample_start(j.start, b);
      }
    }
    const uint8_t* x = src + sample + int64_t(h) * j.src.head_stride + int64_t(s) * j.src.row_stride + 2 * c;
    j.dst[i] = pack2<BFloat16>(fp8_soft_decode(__ldg(x), j.e5m2 != 0), fp8_soft_decode(__ldg(x + 1), j.e5m2 != 0));
  }
}

// Eight codes a thread (one 8-byte load, one 16-byte store; launch_fp8_widen checks the 8-byte
// alignment): a quarter of the pair kernel's index arithmetic, whose int64 divisions bound it (about 260 us
// for q, k, v, dO at B = 1, H = 16, S = 8192, D = 128 on the H200: PERF_LOG v2.36). Experimental, not yet
// run on a GPU (fp8_widen_vec_enabled).
__global__ void __launch_bounds__(256) fp8_widen8_kernel(const Fp8WidenJobs jobs) {
  const Fp8WidenJob& j = jobs.job[blockIdx.y];
  const int groups = j.cols / 8;
  const int64_t total = int64_t(j.batch) * j.heads * j.rows * groups;
  const uint8_t* src = static_cast<const uint8_t*>(j.src.data);
  const bool e5 = j.e5m2 != 0;
  auto pair = [e5](uint32_t w, int sh) {
    return pack2<BFloat16>(fp8_soft_decode((w >> sh) & 0xffu, e5), fp8_soft_decode((w >> (sh + 8)) & 0xffu, e5));
  };
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int c = int(i % groups);
    int64_t r = i / groups;  // (b, h, s) row
    const int s = int(r % j.rows);
    r /= j.rows;
    const int h = int(r % j.heads);
    const int b = int(r / j.heads);
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(src + int64_t(b) * j.src.batch_stride +
                                                         int64_t(h) * j.src.head_stride + int64_t(s) * j.src.row_stride +
                                                         8 * c));
    reinterpret_cast<uint4*>(j.dst)[i] = make_uint4(pair(v.x, 0), pair(v.x, 16), pair(v.y, 0), pair(v.y, 16));
  }
}

// 1. The products of the factors the kernels use (params.h Fp8BwdDerived; attn_scale is the factor
// kFp8BwdAttnScale: a device tensor, or a host value) and the amax outputs zeroed.
__global__ void fp8_bwd_factors_kernel(const SdpaFp8BwdParams p) {
  if (threadIdx.x != 0) return;
  float* d = p.derived;
  const float attn = fp8_factor(p, kFp8BwdAttnScale);
  d[kF8dQkScaleLog2] = attn * fp8_factor(p, kFp8BwdDescaleQ) * fp8_factor(p, kFp8BwdDescaleK) * kLog2e;
  d[kF8dScaleS] = fp8_factor(p, kFp8BwdScaleS);
  d[kF8dDsUnit] = fp8_factor(p, kFp8BwdDescaleDO) * fp8_factor(p, kFp8BwdDescaleV);
  d[kF8dAttnScale] = attn;
  d[kF8dScaleDP] = fp8_factor(p, kFp8BwdScaleDP);
  d[kF8dDkUnit] = fp8_factor(p, kFp8BwdDescaleDP) * fp8_factor(p, kFp8BwdDescaleQ);
  d[kF8dDvUnit] = fp8_factor(p, kFp8BwdDescaleS) * fp8_factor(p, kFp8BwdDescaleDO);
  d[kF8dDqUnit] = fp8_factor(p, kFp8BwdDescaleDP) * fp8_factor(p, kFp8BwdDescaleK);
  d[kF8dScaleDQ] = fp8_factor(p, kFp8BwdScaleDQ);
  d[kF8dScaleDK] = fp8_factor(p, kFp8BwdScaleDK);
  d[kF8dScaleDV] = fp8_factor(p, kFp8BwdScaleDV);
  d[kF8dDeltaUnit] = fp8_factor(p, kFp8BwdDescaleDO) * fp8_factor(p, kFp8BwdDescaleO);
  for (int i = 0; i < kFp8BwdNumAmax; ++i) *p.amax[i] = 0.0f;
}

// 3. D and lse2 of every (b, h, i) row, a warp a row: D = descale_dO descale_o sum dO o of the raw codes.
__global__ void __launch_bounds__(256) fp8_bwd_delta_kernel(const SdpaFp8BwdParams p) {
  const int lane = threadIdx.x & 31;
  const int sq = p.analytic.max_q, heads = p.num_heads_q;
  const int64_t rows = int64_t(p.batch) * heads * sq;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const bool e5o = p.o_format == 2, e5do = p.do_format == 2;
  const float unit = __ldg(p.derived + kF8dDeltaUnit);
  const uint8_t* o8 = static_cast<const uint8_t*>(p.o8.data);
  const uint8_t* do8 = static_cast<const uint8_t*>(p.do8.data);
  for (int64_t r = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < rows; r += warps) {
    const int i = int(r % sq);
    const int h = int((r / sq) % heads);
    const int b = int(r / sq / heads);
    const uint8_t* o = o8 + int64_t(b) * p.o8.batch_stride + int64_t(h) * p.o8.head_stride + int64_t(i) * p.o8.row_stride;
    const uint8_t* dout =
        do8 + int64_t(b) * p.do8.batch_stride + int64_t(h) * p.do8.head_stride + int64_t(i) * p.do8.row_stride;
    float acc = 0.0f;
    for (int c = lane; c < p.head_dv; c += 32) acc += fp8_soft_decode(__ldg(o + c), e5o) * fp8_soft_decode(__ldg(dout + c), e5do);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (lane == 0) {
      const int64_t w = int64_t(h) * p.total_q + int64_t(b) * sq + i;  // the 16-bit backward's workspace row
      p.delta[w] = unit * acc;
      const float lse = p.lse[sample_start(p.analytic.start[kSdpaStats], b) + int64_t(h) * p.lsea.head_stride +
                              int64_t(i) * p.lsea.row_stride];
      // A row without keys (-inf), or a NaN stat, sees no key: P = 0 (the reference skips such rows).
      p.lse2[w] = lse > -INFINITY ? lse * kLog2e : INFINITY;
    }
  }
}

}  // namespace
}  // namespace flashspan::kern

namespace flashspan {


namespace {
kern::OffSwitch g_widen_vec{"FLASHSPAN_FP8_WIDEN_VEC"};

// A job the eight-code kernel takes: its source's base and strides multiples of 8 bytes, its columns of 8.
bool widen8_ok(const Fp8WidenJob& j) {
  return reinterpret_cast<uintptr_t>(j.src.data) % 8 == 0 && j.src.batch_stride % 8 == 0 &&
         j.src.head_stride % 8 == 0 && j.src.row_stride % 8 == 0 && j.cols % 8 == 0;
}
}  // namespace

Fp8WidenJob fp8_widen_job_ragged(Fp8WidenJob job, const SampleStart& start, const IndexArray& seq_len,
                                 const IndexArray& cu_seq_len) {
  job.ragged = 1;
  job.start = start;
  job.seq_len = seq_len;
  job.cu_seq_len = cu_seq_len;
  return job;
}

Fp8WidenJob fp8_widen_job(const SdpaFp8Tensor& src, const void* dst, int batch, int heads, int rows, int cols,
                          int format) {
  Fp8WidenJob j;
  j.src = src;
  j.dst = static_cast<uint32_t*>(const_cast<void*>(dst));
  j.batch = batch;
  j.heads = heads;
  j.rows = rows;
  j.cols = cols;
  j.e5m2 = format == 2 ? 1 : 0;
  return j;
}

void set_fp8_widen_vec_enabled(int on) { g_widen_vec.set(on); }
bool fp8_widen_vec_enabled() { return g_widen_vec.on(); }

void launch_fp8_widen(const Fp8WidenJobs& jobs, int num_jobs, cudaStream_t stream) {
  bool vec = fp8_widen_vec_enabled(), ragged = false;
  for (int i = 0; i < num_jobs; ++i) ragged = ragged || jobs.job[i].ragged != 0;
  for (int i = 0; i < num_jobs; ++i) vec = vec && !ragged && widen8_ok(jobs.job[i]);
  int64_t most = 0;
  for (int i = 0; i < num_jobs; ++i) {
    const Fp8WidenJob& j = jobs.job[i];
    most = std::max<int64_t>(most, int64_t(j.batch) * j.heads * j.rows * (j.cols / (vec ? 8 : 2)));
  }
  if (most == 0) return;
  const dim3 grid(grid_stride_1d(most, 256), unsigned(num_jobs));
  if (vec) {
    kern::fp8_widen8_kernel<<<grid, 256, 0, stream>>>(jobs);
  } else if (ragged) {
    kern::fp8_widen_kernel<true><<<grid, 256, 0, stream>>>(jobs);
  } else {
    kern::fp8_widen_kernel<false><<<grid, 256, 0, stream>>>(jobs);
  }
  check_launch("sdpa fp8: widen");
}

// The FP8 backward's pre-pass (fp8_prepass.h; the module comment's steps 1-3).
void launch_sdpa_fp8_bwd_prepass(const SdpaFp8BwdParams& p, cudaStream_t stream) {
  kern::fp8_bwd_factors_kernel<<<1, 32, 0, stream>>>(p);
  check_launch("sdpa fp8 backward: factors");
  // 2. The bf16 copies the 16-bit kernels read (SdpaBwdParams q, k, v, dout point at them).
  const int hk = p.num_heads_q / p.group_size, hv = p.num_heads_q / p.analytic.score.group_v;
  const int sq = p.analytic.max_q, skv = p.analytic.max_kv;
  const Fp8WidenJobs jobs{{fp8_widen_job(p.q8, p.q, p.batch, p.num_heads_q, sq, p.head_dqk, p.format),
                           fp8_widen_job(p.k8, p.k, p.batch, hk, skv, p.head_dqk, p.format),
                           fp8_widen_job(p.v8, p.v, p.batch, hv, skv, p.head_dv, p.format),
                           fp8_widen_job(p.do8, p.dout, p.batch, p.num_heads_q, sq, p.head_dv, p.do_format)}};
  launch_fp8_widen(jobs, 4, stream);
  if (p.total_q > 0) {
    kern::fp8_bwd_delta_kernel<<<grid_stride_1d(int64_t(p.num_heads_q) * p.total_q, 8), 256, 0, stream>>>(p);
    check_launch("sdpa fp8 backward: delta");
  }
}

}  // namespace flashspan

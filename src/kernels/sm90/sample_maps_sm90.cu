// The per-sample tensor maps of packed SDPA tensors (sample_maps_sm90.h): the pre-pass (one CTA per
// sample, one warp per tensor) and the NaN fill of the samples it flagged. The pre-pass's code exists for
// sm_90a only (tensormap.replace); on other targets its body is empty, and dispatch never launches it
// there (sdpa_fwd_runs_sm90: an sm_90 device with this build's sm_90a code).
#include "kernels/sm90/sample_maps_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <limits>

#include "core/error.h"
#include "kernels/common/analytic_seqlen.cuh"
#include "kernels/common/grid.h"
#include "kernels/common/launch_util.h"
#include "kernels/sm90/ptx_sm90.cuh"

namespace flashspan::sm90 {
namespace {

constexpr int kSampleThreads = 32 * kSampleMapsFwd;

// Warp x of CTA b: tensor x's map of sample b. Lane 0 replaces the base (the sample's start, or, for a
// sample without rows, the tensor's own base with one row: a map's extents are >= 1 and a ragged start
// past the last sample may lie past the allocation) and the row extent (dimension 1 of {D, rows, H, B});
// the warp copies the map out with the release the kernels' acquire pairs with.
__global__ void __launch_bounds__(kSampleThreads) sample_maps_kernel(const __grid_constant__ SampleMapsJob job,
                                                                     CUtensorMap* maps, int32_t* flags) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ alignas(128) CUtensorMap s_map[kSampleMapsFwd];
  __shared__ int s_bad;
  const int b = int(blockIdx.x), x = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) s_bad = 0;
  __syncthreads();
  if (x < job.tensors) {
    const uint32_t sm = kern::smem_u32(&s_map[x]);
    reinterpret_cast<uint32_t*>(&s_map[x])[lane] = reinterpret_cast<const uint32_t*>(&job.tmpl[x])[lane];
    __syncwarp();
    if (lane == 0) {
      const int side = job.side[x];
      const int len = kern::sample_length(job.seq_len[side], job.cu_seq_len[side], job.max_len[side], b);
      const char* base = job.data[x] + kern::sample_start(job.start[x], b) * job.elem_bytes;
      const uintptr_t off = reinterpret_cast<uintptr_t>(base) % 16;
      if (len == 0) {
        base = job.data[x];
      } else if (off != 0) {
        base -= off;
        s_bad = 1;
      }
      kern90::tensormap_replace_address(sm, base);
      kern90::tensormap_replace_dim<1>(sm, uint32_t(len > 0 ? len : 1));
    }
    __syncwarp();
    kern90::tensormap_copy_release(maps + int64_t(job.tensors) * b + x, sm);
  }
  __syncthreads();
  if (threadIdx.x == 0) flags[b] = s_bad;
#else
  (void)job, (void)maps, (void)flags;
#endif
}

// NaN over O and the stats of flagged samples: CTA (b, h), threads over the rows' elements.
template <class Elem>
__global__ void __launch_bounds__(256) sample_poison_kernel(const SdpaFwdParams p, const int32_t* flags) {
  const int b = int(blockIdx.x), h = int(blockIdx.y);
  if (__ldg(flags + b) == 0) return;
  const AnalyticMaskParams& a = p.analytic;
  const int len = kern::sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, b);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int o_rows = kern::rows_to_store(a, kSdpaO, 0, a.max_q, len, a.max_q);
  Elem* o = static_cast<Elem*>(p.o) + kern::sample_start(a.start[kSdpaO], b) + int64_t(h) * p.oa.head_stride;
  for (int64_t e = threadIdx.x; e < int64_t(o_rows) * p.head_dv; e += blockDim.x) {
    o[(e / p.head_dv) * p.oa.row_stride + e % p.head_dv] = Elem(nan);
  }
  if (p.lse != nullptr) {
    const int s_rows = kern::rows_to_store(a, kSdpaStats, 0, a.max_q, len, a.max_q);
    float* l = p.lse + kern::sample_start(a.start[kSdpaStats], b) + int64_t(h) * p.lsea.head_stride;
    for (int r = threadIdx.x; r < s_rows; r += blockDim.x) l[int64_t(r) * p.lsea.row_stride] = nan;
  }
}

}  // namespace

void launch_sample_maps_sm90(const SampleMapsJob& job, int batch, CUtensorMap* maps, int32_t* flags,
                             cudaStream_t stream) {
  FS_CHECK(job.tensors > 0 && job.tensors <= kSampleMapsFwd && maps != nullptr && flags != nullptr &&
               reinterpret_cast<uintptr_t>(maps) % kTensorMapBytes == 0,
           Status::kInternal, "sm90 sample maps: ", job.tensors, " tensors, workspace ", static_cast<void*>(maps));
  if (batch <= 0) return;
  sample_maps_kernel<<<unsigned(batch), kSampleThreads, 0, stream>>>(job, maps, flags);
  check_launch("sm90 sample maps");
}

void launch_sample_poison_sm90(const SdpaFwdParams& p, DType dtype, const int32_t* flags, cudaStream_t stream) {
  if (p.batch <= 0 || p.num_heads_q <= 0) return;
  const dim3 grid(unsigned(p.batch), unsigned(p.num_heads_q));
  if (dtype == DType::kBFloat16) {
    sample_poison_kernel<__nv_bfloat16><<<grid, 256, 0, stream>>>(p, flags);
  } else {
    sample_poison_kernel<__half><<<grid, 256, 0, stream>>>(p, flags);
  }
  check_launch("sm90 sample maps: NaN over flagged samples");
}

}  // namespace flashspan::sm90

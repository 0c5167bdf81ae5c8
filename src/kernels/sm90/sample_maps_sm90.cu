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

constexpr int kSampleThreads = 32 * kMaxSampleMaps;

// Warp x of CTA b: tensor x's map of sample b. Lane 0 replaces the base (the sample's start, or, for a
// sample without rows, the tensor's own base with one row: a map's extents are >= 1 and a ragged start
// past the last sample may lie past the allocation; the producers load such a sample's boxes at row 1,
// wholly past that extent, so nothing is read there, not even from a null base) and the row extent
// (dimension 1 of {D, rows, H, B});
// the warp copies the map out with the release the kernels' acquire pairs with, to slot x of the sample's
// job.slots.
__global__ void __launch_bounds__(kSampleThreads) sample_maps_kernel(const __grid_constant__ SampleMapsJob job,
                                                                     CUtensorMap* maps, int32_t* flags) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ alignas(128) CUtensorMap s_map[kMaxSampleMaps];
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
    kern90::tensormap_copy_release(maps + int64_t(job.slots) * b + x, sm);
  }
  __syncthreads();
  if (threadIdx.x == 0) flags[b] = s_bad;
#else
  (void)job, (void)maps, (void)flags;
#endif
}

// NaN over O and the stats of flagged samples: CTA (b, h), threads over the rows' elements. An FP8 O (uint8_t
// codes): 0x7F, NaN in both formats (E4M3 S.1111.111, E5M2 S.11111.11).
template <class Elem>
__device__ __forceinline__ Elem nan_elem() {
  return Elem(std::numeric_limits<float>::quiet_NaN());
}
template <>
__device__ __forceinline__ uint8_t nan_elem<uint8_t>() {
  return 0x7f;
}
template <class Elem>
__device__ __forceinline__ void nan_rows(Elem* base, int rows, int cols, int64_t row_stride) {
  const Elem nan = nan_elem<Elem>();
  for (int64_t e = threadIdx.x; e < int64_t(rows) * cols; e += blockDim.x) base[(e / cols) * row_stride + e % cols] = nan;
}
// NaN over head h's rows of sample b in tensor t (index x of a.start, addressed by ta): the rows the kernels
// store there (rows_to_store: a packed tensor's len rows, a padded one's max), `cols` elements a row. max and
// cols by reference, so that they are read where used, after the sample's start (by value they are read first
// and ptxas schedules the fills differently).
template <class Elem>
__device__ __forceinline__ void nan_sample(Elem* t, const TensorAddr& ta, const AnalyticMaskParams& a, int x, int b,
                                           int h, int len, const int& max, const int& cols) {
  nan_rows(t + kern::sample_start(a.start[x], b) + int64_t(h) * ta.head_stride,
           kern::rows_to_store(a, x, 0, max, len, max), cols, ta.row_stride);
}

template <class Elem>
__global__ void __launch_bounds__(256) sample_poison_kernel(const SdpaFwdParams p, const int32_t* flags) {
  const int b = int(blockIdx.x), h = int(blockIdx.y);
  if (__ldg(flags + b) == 0) return;
  const AnalyticMaskParams& a = p.analytic;
  const int len = kern::sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, b);
  nan_sample(static_cast<Elem*>(p.o), p.oa, a, kSdpaO, b, h, len, a.max_q, p.head_dv);
  if (p.lse != nullptr) nan_sample(p.lse, p.lsea, a, kSdpaStats, b, h, len, a.max_q, 1);
}

// The backward's: CTA (b, h) over query heads h; dK of K head h < H_k, dV of V head h < H_v.
template <class Elem>
__global__ void __launch_bounds__(256) sample_poison_bwd_kernel(const SdpaBwdParams p, const int32_t* flags) {
  const int b = int(blockIdx.x), h = int(blockIdx.y);
  if (__ldg(flags + b) == 0) return;
  const AnalyticMaskParams& a = p.analytic;
  const int len_q = kern::sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, b);
  const int len_k = kern::sample_length(a.seq_len_kv, a.cu_seq_len_kv, a.max_kv, b);
  nan_sample(static_cast<Elem*>(p.dq), p.dqa, a, kSdpaDQ, b, h, len_q, a.max_q, p.head_dqk);
  if (h < p.num_heads_q / p.group_size) {
    nan_sample(static_cast<Elem*>(p.dk), p.dka, a, kSdpaDK, b, h, len_k, a.max_kv, p.head_dqk);
  }
  if (h < p.num_heads_q / a.score.group_v) {
    nan_sample(static_cast<Elem*>(p.dv), p.dva, a, kSdpaDV, b, h, len_k, a.max_kv, p.head_dv);
  }
}

template <class Params, class K16, class Kbf>
void launch_poison(const Params& p, DType dtype, const int32_t* flags, cudaStream_t stream, K16 k16, Kbf kbf) {
  if (p.batch <= 0 || p.num_heads_q <= 0) return;
  const dim3 grid(unsigned(p.batch), unsigned(p.num_heads_q));
  if (dtype == DType::kBFloat16) {
    kbf<<<grid, 256, 0, stream>>>(p, flags);
  } else {
    k16<<<grid, 256, 0, stream>>>(p, flags);
  }
  check_launch("sm90 sample maps: NaN over flagged samples");
}

}  // namespace

bool sample_maps_packed(const AnalyticMaskParams& a, std::initializer_list<int> xs, int64_t batch, int slots,
                        const void* workspace, size_t workspace_bytes, const char* who) {
  bool packed = false;
  for (int x : xs) packed = packed || a.start[x].ragged.ptr != nullptr;
  FS_CHECK(!packed || (workspace != nullptr && workspace_bytes >= sample_maps_bytes(batch, slots)), Status::kInternal,
           who, ": packed tensors without the workspace of their sample maps (", workspace_bytes, " bytes of ",
           sample_maps_bytes(batch, slots), ")");
  return packed;
}

int32_t* launch_sample_maps_sm90(const SampleMapsJob& job, int batch, void* workspace, cudaStream_t stream) {
  FS_CHECK(job.tensors > 0 && job.tensors <= kMaxSampleMaps && workspace != nullptr &&
               reinterpret_cast<uintptr_t>(workspace) % kTensorMapBytes == 0,
           Status::kInternal, "sm90 sample maps: ", job.tensors, " tensors, workspace ", workspace);
  SampleMapsJob j = job;
  if (j.slots == 0) j.slots = j.tensors;
  FS_CHECK(j.slots >= j.tensors && j.slots <= kMaxSampleMaps, Status::kInternal, "sm90 sample maps: ", j.tensors,
           " tensors in ", j.slots, " slots a sample");
  CUtensorMap* maps = static_cast<CUtensorMap*>(workspace);
  int32_t* flags = reinterpret_cast<int32_t*>(maps + int64_t(batch) * j.slots);
  if (batch <= 0) return flags;
  sample_maps_kernel<<<unsigned(batch), kSampleThreads, 0, stream>>>(j, maps, flags);
  check_launch("sm90 sample maps");
  return flags;
}

void launch_sample_poison_sm90(const SdpaFwdParams& p, DType dtype, const int32_t* flags, cudaStream_t stream) {
  if (dtype == DType::kFloat8E4M3 || dtype == DType::kFloat8E5M2) {  // (one NaN code for both formats)
    launch_poison(p, dtype, flags, stream, sample_poison_kernel<uint8_t>, sample_poison_kernel<uint8_t>);
    return;
  }
  launch_poison(p, dtype, flags, stream, sample_poison_kernel<__half>, sample_poison_kernel<__nv_bfloat16>);
}

void launch_sample_poison_bwd_sm90(const SdpaBwdParams& p, DType dtype, const int32_t* flags, cudaStream_t stream) {
  launch_poison(p, dtype, flags, stream, sample_poison_bwd_kernel<__half>, sample_poison_bwd_kernel<__nv_bfloat16>);
}

}  // namespace flashspan::sm90

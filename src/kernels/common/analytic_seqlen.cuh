// Sample geometry of the analytic-mask kernels (SDPA), every family: a sample's lengths and
// where each tensor's sample starts, read from the caller's int32/int64 device arrays
// (AnalyticMaskParams, params.h). The counterpart of SeqlenInfo (seqlen_info.cuh), which
// reads the plan's cu_seqlens.
#pragma once

#include <cstdint>

#include "kernels/common/analytic_mask.h"
#include "kernels/params.h"

namespace flashspan::kern {

// The analytic mask of an SDPA kernel's parameters, given as the base FwdParams / BwdParams
// the shared kernel bodies take (the kernel's parameter is an SdpaFwdParams / SdpaBwdParams).
__device__ __forceinline__ const AnalyticMaskParams& analytic_of(const FwdParams& p) {
  return static_cast<const SdpaFwdParams&>(p).analytic;
}
__device__ __forceinline__ const AnalyticMaskParams& analytic_of(const BwdParams& p) {
  return static_cast<const SdpaBwdParams&>(p).analytic;
}

__device__ __forceinline__ int64_t load_index(const IndexArray& a, int64_t i) {
  return a.is64 ? int64_t(__ldg(static_cast<const long long*>(a.ptr) + i)) : int64_t(__ldg(static_cast<const int*>(a.ptr) + i));
}

// Length of sample b: seq_len[b], or cu_seq_len[b + 1] - cu_seq_len[b], or max when neither
// is given; clamped to [0, max].
__device__ __forceinline__ int sample_length(const IndexArray& len, const IndexArray& cu, int max, int b) {
  int64_t n = max;
  if (len.ptr != nullptr) {
    n = load_index(len, b);
  } else if (cu.ptr != nullptr) {
    n = load_index(cu, b + 1) - load_index(cu, b);
  }
  return int(clamp64(n, 0, max));
}

// Element offset of (sample b, head 0, row 0) of a tensor (SampleStart).
__device__ __forceinline__ int64_t sample_start(const SampleStart& s, int b) {
  return s.ragged.ptr != nullptr ? load_index(s.ragged, b) * s.mult : int64_t(b) * s.batch_stride;
}

// One sample as the analytic kernels see it. q_start / k_start: its first row in the
// backward workspace (b * max_q) and b * max_kv, the fields SeqlenInfo's users read.
struct AnalyticSeqlen {
  int q_start, len_q, k_start, len_k;
  AnalyticSample mask;

  __device__ __forceinline__ AnalyticSeqlen(const AnalyticMaskParams& a, int b)
      : q_start(b * a.max_q),
        len_q(sample_length(a.seq_len_q, a.cu_seq_len_q, a.max_q, b)),
        k_start(b * a.max_kv),
        len_k(sample_length(a.seq_len_kv, a.cu_seq_len_kv, a.max_kv, b)),
        mask(AnalyticSample::make(a.band, len_q, len_k)) {}
  // p: the base FwdParams / BwdParams of an SDPA kernel's parameters (analytic_of).
  template <class Params>
  __device__ __forceinline__ AnalyticSeqlen(const Params& p, int b) : AnalyticSeqlen(analytic_of(p), b) {}
};

// Rows of a tile at row0 (block of `rows` rows) an output of tensor x writes: a padded
// output every row below its max, a ragged one the sample's rows (len).
__device__ __forceinline__ int rows_to_store(const AnalyticMaskParams& a, int x, int row0, int rows, int len, int max) {
  const int n = a.start[x].ragged.ptr != nullptr ? len - row0 : max - row0;
  return n < rows ? n : rows;
}

}  // namespace flashspan::kern
